"""The benchmark harness in smoke mode (tiny sizes), so it cannot rot; `make bench` runs full sizes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def test_smoke_benchmarks_print_every_figure_with_a_ratio(tmp_path):
    out = tmp_path / "figures.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks", "--smoke", "--json", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(out.read_text())
    names = " ".join(f["name"] for f in figures)
    topics = ("orchestration", "preprocess: throughput", "peak RSS growth", "torch loop", "keras loop",
              "orchestration phase start-up", "orchestration phase train")  # fmt: skip
    for topic in topics:
        assert topic in names
    for figure in figures:
        assert figure["value"] > 0 and figure["baseline"] > 0 and math.isfinite(figure["ratio"]), figure
        assert f"ratio {figure['ratio']:.3f}" in result.stdout
    assert "| figure | value | baseline | ratio | goal |" in result.stdout
    assert "machine:" in result.stdout


def test_alternating_medians_interleaves_the_two_sides_and_takes_each_median():
    from benchmarks.measure import alternating_medians

    calls = []
    values, baselines = iter([5.0, 1.0, 3.0]), iter([10.0, 30.0, 20.0])
    median, baseline = alternating_medians(
        lambda: calls.append("value") or next(values), lambda: calls.append("baseline") or next(baselines), 3
    )
    assert (median, baseline) == (3.0, 20.0)
    assert calls == ["value", "baseline"] * 3
