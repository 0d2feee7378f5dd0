"""A multi-node PyTorchJob's pod without rank 0 waits for rank 0's outputs: two processes, one writing
the outputs late and one waiting for them (tests/unit/training/test_job_completion.py has the rest)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.flyte_package import REPO

# Each process prints the wall-clock time at which it did its part.
RANK_ZERO_POD = """
import os, sys, time
time.sleep(float(sys.argv[2]))
partial = os.path.join(sys.argv[1], "outputs.pb.partial")
open(partial, "wb").write(b"literals")
os.replace(partial, os.path.join(sys.argv[1], "outputs.pb"))
print(time.time())
"""
WAITING_POD = """
import sys, time
import fsspec
from tasks.core.training.job_completion import wait_for_rank_zero
wait_for_rank_zero(fsspec.filesystem("file"), sys.argv[1], timeout_s=60, poll_s=0.05)
print(time.time())
"""


def start(script: str, *args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )


def finished_at(process: subprocess.Popen) -> float:
    stdout, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    return float(stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_pod_without_rank_0_exits_only_after_rank_0_wrote_its_outputs(tmp_path):
    waiting = start(WAITING_POD, tmp_path)
    rank_zero = start(RANK_ZERO_POD, tmp_path, 1.5)
    written, waited_until = finished_at(rank_zero), finished_at(waiting)
    assert waited_until >= written
