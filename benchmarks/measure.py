"""Timing and memory helpers: wall time of a call, peak RSS of a child process."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")


@dataclass
class Figure:
    """One benchmark line: a measurement and its baseline from the same run."""

    name: str
    value: float
    baseline: float
    unit: str
    goal: str = ""
    # Where rounds were paired (value and baseline measured back to back): each round's ratio. The
    # figure's ratio is then their median, and the lowest and highest are its spread.
    ratios: list[float] | None = None

    @property
    def ratio(self) -> float:
        if self.ratios:
            return statistics.median(self.ratios)
        return self.value / self.baseline if self.baseline else float("nan")

    @property
    def spread(self) -> str:
        return f"{min(self.ratios):.3f}-{max(self.ratios):.3f}" if self.ratios else ""

    def line(self) -> str:
        goal = f"  goal {self.goal}" if self.goal else ""
        spread = f" (rounds {self.spread})" if self.ratios else ""
        return (
            f"{self.name}: {self.value:,.3f} {self.unit} vs baseline {self.baseline:,.3f} "
            f"-> ratio {self.ratio:.3f}{spread}{goal}"
        )


def alternate(measure: Callable[[], T], baseline: Callable[[], T], rounds: int) -> tuple[list[T], list[T]]:
    """`rounds` results of each, taken in turn so that drift on a shared machine (other jobs,
    thermal limits) lands on both sides rather than on whichever ran second."""
    values, baselines = interleave([measure, baseline], rounds)
    return values, baselines


def interleave(measures: Sequence[Callable[[], T]], rounds: int) -> list[list[T]]:
    """`rounds` results of each measure, one of each per round, in the order given."""
    results: list[list[T]] = [[] for _ in measures]
    for _ in range(rounds):
        for result, measure in zip(results, measures, strict=True):
            result.append(measure())
    return results


def alternating_best_rates(
    measure: Callable[[], float], baseline: Callable[[], float], rounds: int
) -> tuple[float, float]:
    """The highest of `rounds` alternating rates of each: other jobs on a shared machine only ever
    slow a run down, so each side's fastest run is its least disturbed one."""
    values, baselines = alternate(measure, baseline, rounds)
    return max(values), max(baselines)


def median_phases(runs: list[dict[str, float]]) -> dict[str, float]:
    return {phase: statistics.median(run.get(phase, 0.0) for run in runs) for phase in runs[0]}


class PhaseClock:
    """Seconds per named phase of a run, from the moment it was created (the child's start)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._last
        self._last = now


def child_peak_rss_gib(module: str, *args: str) -> dict:
    """Run `python -m module args` and return its JSON result plus its peak resident memory."""
    code = (
        "import json, resource, runpy, sys;"
        f"sys.argv = {[module, *args]!r};"
        f"result = runpy.run_module({module!r}, run_name='__main__');"
    )
    wrapper = code + "print('RSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    output = subprocess.run(
        [sys.executable, "-c", wrapper], cwd=REPO, capture_output=True, text=True, check=True
    )
    lines = output.stdout.strip().splitlines()
    result = json.loads(next(line for line in lines if line.startswith("{")))
    result["peak_rss_gib"] = int(lines[-1].split()[1]) / 2**20  # ru_maxrss is in KiB on Linux
    return result


def wait_until_answering(
    process: subprocess.Popen, url: str, seconds: float, name: str, tail: Callable[[], str]
) -> None:
    """Until `url` answers 200, while the server `process` runs: RuntimeError naming `name` and the
    end of its log (`tail`) when it exits first or stays silent for `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with status {process.returncode}: {tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.3)
    raise RuntimeError(f"{name} did not answer {url} within {seconds} s: {tail()}")
