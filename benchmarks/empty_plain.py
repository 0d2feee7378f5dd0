"""`python -m benchmarks.empty_plain`: workers that do nothing, launched as the pipeline's are
(torch elastic, spawn, one thread each): the baseline of `benchmarks.empty_flyte`."""

from __future__ import annotations

import json
import os

from benchmarks.local_launch import local_workers


def worker(rows: int) -> int:
    return rows


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(json.dumps({"rows": local_workers(worker, "empty")(1)[0], "phases": {}}))
