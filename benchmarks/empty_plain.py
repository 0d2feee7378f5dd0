"""`python -m benchmarks.empty_plain`: two workers that do nothing, launched as the pipeline's are
(torch elastic, spawn, one thread each): the baseline of `benchmarks.empty_flyte`."""

from __future__ import annotations

import json
import os

from torch.distributed.launcher.api import LaunchConfig, elastic_launch


def worker(rows: int) -> int:
    return rows


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    launch = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id="empty", rdzv_backend="c10d",
                          rdzv_endpoint="localhost:0", start_method="spawn", monitor_interval=0.1)  # fmt: skip
    print(json.dumps({"rows": elastic_launch(launch, worker)(1)[0], "phases": {}}))
