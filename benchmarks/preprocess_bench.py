"""Preprocessing throughput and memory against pyarrow's own read-and-write of the same file.

Run as a child process (`python -m benchmarks.preprocess_bench PATH ours|floor OUT`) so that
each measurement has its own peak RSS.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq


def ours(path: str, out: str) -> None:
    from tasks.core.data.assignment import SplitConfig
    from tasks.core.data.prepare import prepare_dataset

    prepare_dataset(path, "label", out, SplitConfig(seed=0))


def floor(path: str, out: str) -> None:
    """The least any preprocessing of this file must do: read it all and write it back."""
    Path(out).mkdir(parents=True, exist_ok=True)
    pq.write_table(pq.read_table(path), str(Path(out) / "copy.parquet"))


def main(path: str, mode: str, out: str) -> None:
    start = time.perf_counter()
    {"ours": ours, "floor": floor}[mode](path, out)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "rows": pq.ParquetFile(path).metadata.num_rows}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
