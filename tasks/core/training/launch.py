"""How many nodes and worker processes a training launch gets on the machine it lands on."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class WorkerLaunch:
    """The nodes and worker processes per node that torch elastic launches, and why they differ from
    the task's configuration where they do."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    notes: list[str] = field(default_factory=list)


class MissingPyTorchJob(RuntimeError):
    """A multi-node launch on a cluster that ran the task as a single pod."""


class WorkerFailed(RuntimeError):
    """A training worker raised: its rank, its error's type and message."""


class WorkerKilled(RuntimeError):
    """A training worker died by a signal, with no Python error recorded."""


LOCAL_CPU_WORKERS_VARIABLE = "MIXEDML_LOCAL_CPU_WORKERS"
DEFAULT_LOCAL_CPU_WORKERS = 2


def local_cpu_workers(
    configured: int = DEFAULT_LOCAL_CPU_WORKERS, environ: Mapping[str, str] = os.environ
) -> int:
    """The CPU worker count for a run without GPUs: `MIXEDML_LOCAL_CPU_WORKERS` when set (one to debug
    a single rank, more on a many-core machine), else the task's configured count."""
    value = environ.get(LOCAL_CPU_WORKERS_VARIABLE, "").strip()
    if not value:
        return configured
    if not value.isdigit() or int(value) < 1:
        raise ValueError(
            f"{LOCAL_CPU_WORKERS_VARIABLE}={value!r}: expected a whole number of worker processes, 1 or more"
        )
    return int(value)


def plan_launch(
    min_nodes: int,
    max_nodes: int,
    nproc_per_node: int,
    in_pytorch_job: bool,
    gpu_count: int,
    local_cpu_workers: int,
    on_cluster: bool = False,
) -> WorkerLaunch:
    """Fit the configured launch to this machine.

    Inside a Kubeflow PyTorchJob the configuration is used as declared. On a laptop or in CI a
    multi-node request is clamped to one node, since no peers will ever join the rendezvous, and
    the worker count follows the GPUs present, or `local_cpu_workers` on CPU. On a cluster, a
    multi-node task outside a PyTorchJob means the cluster has no `pytorch` plugin and ran it as a
    plain pod: that fails at once, since training on one node would be a silently different run.
    """
    if in_pytorch_job:
        return WorkerLaunch(min_nodes, max_nodes, nproc_per_node)
    notes = []
    if (min_nodes > 1 or max_nodes > 1) and on_cluster:
        raise MissingPyTorchJob(
            f"this task asks for nnodes={min_nodes}:{max_nodes} but runs as a single pod, not in a Kubeflow "
            "PyTorchJob (PET_NNODES is unset): the cluster has no 'pytorch' task plugin enabled, so "
            "propeller ran it with the default pod plugin. Install the Kubeflow training operator and enable "
            "the 'pytorch' plugin in propeller's enabled-plugins (deploy/training-operator.md), or train on one node"
        )
    if min_nodes > 1 or max_nodes > 1:
        notes.append(
            f"nnodes={min_nodes}:{max_nodes} requested but this run is not in a PyTorchJob; "
            "clamping to 1 node (multi-node training needs the cluster)"
        )
    if gpu_count == 0:
        processes = "process" if local_cpu_workers == 1 else "processes"
        notes.append(f"no GPU found; training with {local_cpu_workers} CPU worker {processes} (gloo)")
        return WorkerLaunch(1, 1, local_cpu_workers, notes)
    if gpu_count < nproc_per_node:
        notes.append(f"{nproc_per_node} GPUs per node requested but {gpu_count} present; using {gpu_count}")
        return WorkerLaunch(1, 1, gpu_count, notes)
    return WorkerLaunch(1, 1, nproc_per_node, notes)


def worker_failure(child_failed) -> WorkerFailed | WorkerKilled:
    """The first failure of torch elastic's `ChildFailedError`, as the run's error.

    Each worker records its exception in its error file (torch/distributed/elastic/multiprocessing/
    errors: `record`, `ProcessFailure`, whose message is "<type>: <message>" under "message"); a worker
    ended by a signal records none and has a negative exit code. The first failure is the earliest
    (`get_first_failure`), so a rank that only lost its peer is not mistaken for the cause.
    """
    rank, failure = child_failed.get_first_failure()
    if failure.exitcode < 0:
        return WorkerKilled(
            f"training worker rank {rank} (pid {failure.pid}) was killed by {failure.signal_name()} "
            "without a Python error"
        )
    message = failure.message.get("message", "") if isinstance(failure.message, dict) else failure.message
    return WorkerFailed(f"training worker rank {rank} failed: {message}")
