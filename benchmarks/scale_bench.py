"""Data bigger than one device: the whole pipeline at two sizes, streamed against device-resident.

Each run is `python -m benchmarks.flyte_pipeline` on a folder of part files, and its memory is the
peak of the summed resident memory of the run's whole process tree (the driver, the preprocessing
pieces and every DDP worker), sampled every `SAMPLE_S` seconds: a process's own peak (`ru_maxrss`)
would miss the workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from benchmarks.measure import REPO, Figure
from benchmarks.synthetic import write_parts

FEATURES, PARTS, BATCH, EPOCHS = 64, 4, 512, 1
SAMPLE_S = 0.2


def tree_rss(process: psutil.Process) -> int:
    total = 0
    for member in [process, *process.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += member.memory_info().rss
    return total


def pipeline_run(data: str, placement: str) -> dict:
    """The run's JSON result plus `peak_tree_gib`, its process tree's peak resident memory."""
    env = {**os.environ, "FLYTE_LOCAL_CACHE_ENABLED": "false"}
    args = [sys.executable, "-m", "benchmarks.flyte_pipeline", data, str(EPOCHS), str(BATCH), placement]
    child = subprocess.Popen(
        args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    watched, peak = psutil.Process(child.pid), 0
    while child.poll() is None:
        peak = max(peak, tree_rss(watched))
        time.sleep(SAMPLE_S)
    stdout, stderr = child.communicate()
    if child.returncode:
        raise RuntimeError(f"pipeline run failed ({child.returncode}):\n{stderr[-4000:]}")
    result = json.loads(next(line for line in stdout.splitlines() if line.startswith("{")))
    return {**result, "peak_tree_gib": peak / 2**30}


def scale(work: Path, sizes: tuple[int, int]) -> list[Figure]:
    small, large = sizes
    runs = {}
    for rows in sizes:
        data = str(work / f"scale-{rows}")
        write_parts(data, rows, PARTS, FEATURES)
        for placement in ("stream", "device"):
            runs[rows, placement] = pipeline_run(data, placement)
    streamed, resident = runs[large, "stream"], runs[large, "device"]
    return [
        Figure(f"scale: streamed pipeline peak memory (all processes), {large:,} vs {small:,} rows "
               f"({large / small:.0f}x rows)", streamed["peak_tree_gib"], runs[small, "stream"]["peak_tree_gib"],
               "GiB", "ratio <= 1.5"),
        Figure(f"scale: device-resident pipeline peak memory, {large:,} vs {small:,} rows (for reference)",
               resident["peak_tree_gib"], runs[small, "device"]["peak_tree_gib"], "GiB"),
        Figure(f"scale: training samples/s, streamed vs device-resident, {large:,} rows",
               streamed["samples_per_second"], resident["samples_per_second"], "samples/s", ">= 0.8"),
        Figure(f"scale: test accuracy, streamed vs device-resident, {large:,} rows", streamed["accuracy"],
               resident["accuracy"], "", "1.0 (the same order, the same model)"),
    ]  # fmt: skip
