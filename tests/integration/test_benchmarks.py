"""The benchmark harness in smoke mode (tiny sizes), so it cannot rot; `make bench` runs full sizes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tasks.core.training.launch import LOCAL_CPU_WORKERS_VARIABLE

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


# Each group's topics; a group runs on its own (`--only`), so test workers can share the groups.
GROUP_TOPICS = {
    "orchestration": ("orchestration: local training_pipeline", "orchestration phase start-up",
                      "orchestration phase train", "orchestration floor", "overhead above the floor",
                      "workflow wall, this checkout vs baseline checkout",
                      "overhead above the floor, baseline checkout",
                      "overhead above the floor, this checkout vs baseline checkout",
                      "overhead above the floor in CPU seconds (all processes of a run)",
                      "overhead above the floor in CPU seconds, this checkout vs baseline checkout"),
    "preprocess": ("preprocess: throughput", "peak RSS growth"),
    "loops": ("torch loop", "keras loop", "the first epoch's wait for its first batch"),
    "scoring": ("scoring: throughput", "scoring: peak RSS growth", "scoring: peak RSS at"),
    "tables": ("tables: churn", "tables: loans", "tables: homes", "tables: diabetes", "tables: preprocess throughput",
               "tables: preprocess rows per CPU second", "tables: preprocess peak RSS growth"),
}  # fmt: skip


def smoke_figures(tmp_path: Path, group: str, *extra: str) -> tuple[list[dict], str]:
    """The group's figures at smoke sizes, each side of a comparison training on one CPU worker."""
    out, temporary = tmp_path / "figures.json", tmp_path / "temporary"
    temporary.mkdir()
    environment = {**os.environ, "TMPDIR": str(temporary), LOCAL_CPU_WORKERS_VARIABLE: "1"}
    result = subprocess.run([sys.executable, "-m", "benchmarks", "--smoke", "--only", group, "--rows", "3000",
                             "--epochs", "2", *extra, "--json", str(out)], cwd=REPO, capture_output=True,
                            text=True, timeout=900, env=environment)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert not list(temporary.iterdir()), "the benchmark's runs left files in the temporary folder"
    figures = json.loads(out.read_text())
    names = " ".join(f["name"] for f in figures)
    for topic in GROUP_TOPICS[group]:
        assert topic in names
    for figure in figures:
        # A difference of noisy timings may come out at or below zero at smoke sizes; the rest may not.
        assert figure["baseline"] > 0 or "vs baseline checkout" in figure["name"], figure
        assert figure["value"] > 0 or "overhead" in figure["name"], figure
        assert math.isfinite(figure["ratio"]), figure
        assert f"ratio {figure['ratio']:.3f}" in result.stdout
    assert "| figure | value | baseline | ratio | goal |" in result.stdout
    assert "machine:" in result.stdout
    return figures, names


# A baseline checkout's workflow, standing in for another checkout's real one (which is this one's
# `benchmarks.flyte_pipeline`, run above): it records the arguments it got and reports a wall.
STAND_IN_PIPELINE = """
import json, sys
from pathlib import Path
Path("ran-with.json").write_text(json.dumps(sys.argv[1:]))
print(json.dumps({"accuracy": 1.0, "phases": {}}))
"""


def stand_in_checkout(root: Path) -> Path:
    (root / "benchmarks").mkdir(parents=True)
    (root / "benchmarks" / "__init__.py").write_text("")
    (root / "benchmarks" / "flyte_pipeline.py").write_text(STAND_IN_PIPELINE)
    return root


def test_smoke_orchestration_prints_every_figure_with_a_ratio(tmp_path):
    baseline = stand_in_checkout(tmp_path / "baseline")
    figures, names = smoke_figures(tmp_path, "orchestration", "--baseline-checkout", str(baseline))
    assert "3,000 rows x 2 epochs" in names, "--rows and --epochs did not reach the pipeline comparison"
    ran_with = json.loads((baseline / "ran-with.json").read_text())
    assert ran_with[1:] == ["2", "512"], "the baseline checkout's workflow did not get the same arguments"
    by_name = {figure["name"]: figure for figure in figures}
    (versus,) = (
        figure for name, figure in by_name.items() if name.startswith("orchestration: workflow wall")
    )
    assert str(baseline) in versus["name"], "a checkout that is no git checkout is named by its path"
    assert versus["baseline"] < versus["value"], "the stand-in's wall is this checkout's, not its own"
    (cpu,) = (figure for name, figure in by_name.items() if name.startswith("orchestration: overhead above the "
              "floor in CPU seconds, this checkout"))  # fmt: skip
    assert cpu["baseline"] < cpu["value"], "the stand-in's CPU seconds are this checkout's, not its own"


def test_smoke_preprocess_prints_every_figure_with_a_ratio(tmp_path):
    smoke_figures(tmp_path, "preprocess")


def test_smoke_loops_print_every_figure_with_a_ratio(tmp_path):
    smoke_figures(tmp_path, "loops")


def test_alternate_interleaves_the_two_sides_and_phases_take_each_median():
    from benchmarks.measure import alternate, median_phases

    calls = []
    runs = iter([{"train": 5.0, "wall": 9.0}, {"train": 1.0, "wall": 4.0}, {"train": 3.0, "wall": 6.0}])
    values, baselines = alternate(
        lambda: calls.append("value") or next(runs), lambda: calls.append("baseline"), 3
    )
    assert calls == ["value", "baseline"] * 3
    assert median_phases(values) == {"train": 3.0, "wall": 6.0}


def test_interleave_runs_one_of_each_per_round_in_order():
    from benchmarks.measure import interleave

    calls = []
    results = interleave([lambda: calls.append("a") or 1, lambda: calls.append("b") or 2], 3)
    assert calls == ["a", "b"] * 3
    assert results == [[1, 1, 1], [2, 2, 2]]


def test_best_rates_take_each_sides_fastest_run():
    from benchmarks.measure import alternating_best_rates

    values, baselines = iter([5.0, 9.0, 3.0]), iter([10.0, 30.0, 20.0])
    assert alternating_best_rates(lambda: next(values), lambda: next(baselines), 3) == (9.0, 30.0)


def test_smoke_scoring_prints_every_figure_with_a_ratio(tmp_path):
    smoke_figures(tmp_path, "scoring")


def test_smoke_tables_print_every_figure_with_a_ratio(tmp_path):
    figures, names = smoke_figures(tmp_path, "tables")
    assert "MLP (2 epochs)" in names, "--epochs did not reach the tables' training"
    for figure in figures:
        if "test accuracy" in figure["name"]:
            assert 0 < figure["value"] <= 1 and 0 < figure["baseline"] <= 1, figure


def test_mixed_tables_are_seeded_and_hold_every_kind_with_gaps(tmp_path):
    import pyarrow.parquet as pq

    from benchmarks.tables import TABLES, hgb_features, train_rows, train_vocabularies
    from tasks.core.data.assignment import SplitConfig
    from tasks.core.data.prepare import prepare_dataset

    for name, (file, write) in TABLES.items():
        first, again = write(str(tmp_path / f"a-{file}"), 3000), write(str(tmp_path / f"b-{file}"), 3000)
        assert Path(first).read_bytes() == Path(again).read_bytes(), f"{name} is not seeded"
        prepared = prepare_dataset(first, "label", str(tmp_path / f"prepared-{name}"), SplitConfig(seed=0))
        columns = {c.name: c.kind for c in prepared.table.fitted_encoding().columns}
        assert set(columns.values()) == {"numeric", "categorical", "boolean", "date"}, columns
        assert sum("<missing>" in feature for feature in prepared.table.feature_names) >= 5, name
        train, codes = train_rows(first, prepared)  # refuses a split other than preprocessing's
        features, categorical = hgb_features(columns, train, train_vocabularies(columns, train))
        assert features.shape == (prepared.table.rows["train"], len(columns) + 2)  # a date is 3 numbers
        assert categorical.sum() == 3 and np.isnan(features).any(), name
        test = pq.read_table(prepared.paths["test"])
        assert test.num_rows == prepared.table.rows["test"] and "label" in test.column_names


def test_scale_group_writes_part_folders_and_sums_a_process_tree(tmp_path):
    """The scale group's pieces, at no cost (its pipeline runs are `make bench`'s, minutes long)."""
    import psutil
    import pyarrow.parquet as pq

    from benchmarks.scale_bench import tree_rss
    from benchmarks.synthetic import write_parts

    files = write_parts(str(tmp_path / "table"), 1003, 4, features=3)
    assert [Path(file).name for file in files] == [f"part-{i:05d}.parquet" for i in range(4)]
    assert [pq.ParquetFile(file).metadata.num_rows for file in files] == [251, 251, 251, 250]
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as child:
        try:
            me = psutil.Process()
            assert tree_rss(me) > me.memory_info().rss  # the child's memory counts too
        finally:
            child.kill()
