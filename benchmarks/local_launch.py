"""How the plain scripts start their workers: as the workflow's Elastic task does on a machine without
GPUs (torch elastic, one node, spawn, torchrun's 0.1 s monitor interval), two unless
MIXEDML_LOCAL_CPU_WORKERS says otherwise."""

from __future__ import annotations

from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from tasks.core.training.launch import local_cpu_workers


def local_workers(entrypoint, run_id: str):
    """`entrypoint` run by the spawned workers; call the result with its arguments."""
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=local_cpu_workers(), run_id=run_id,
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", start_method="spawn",
                          monitor_interval=0.1)  # fmt: skip
    return elastic_launch(config, entrypoint)
