"""The GPU check's pipeline steps (benchmarks/gpu_pipeline.py) on CPU: a real `pyflyte run` of the pipeline
in a process of its own, what the steps read from it (the plan, the bundle, the training Deck, the
prepared split), and the check refusing a run that trained on the CPU. On a GPU the steps run whole."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest

from benchmarks import gpu_pipeline
from benchmarks.gpu_figures import SMOKE, CheckFailed
from tasks.core.training import torch_training

SIZES = replace(SMOKE, rows=6_000, batch=256, hidden=(32,))


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-pipeline")
    table = gpu_pipeline.write_table(str(root / "table.parquet"), SIZES.rows, gpu_pipeline.PIPELINE_FEATURES)
    config = gpu_pipeline.large_table_config(SIZES)
    data = json.dumps({"dataset": table, "label_column": "label"})
    run = gpu_pipeline.pyflyte_run(
        root / "run", "--data", data, "--hyperparameters", json.dumps(asdict(config))
    )
    return run, table, config


def test_the_run_leaves_its_bundle_plan_and_training_deck(pipeline_run):
    run, _, config = pipeline_run
    assert run.manifest["run"]["config"]["epochs"] == config.epochs
    assert run.manifest["run"]["config"]["model"]["options"] == config.model.options
    assert run.plan().endswith("(applied)")
    deck = run.training_deck()
    assert "Learning curves" in deck and "samples/s" in deck


def test_a_run_that_trained_on_the_cpu_fails_the_check(pipeline_run):
    run, _, _ = pipeline_run
    with pytest.raises(CheckFailed, match="the run trained on cpu, not the GPU"):
        gpu_pipeline.judged(run)


def test_the_direct_loop_trains_on_the_runs_own_prepared_split(pipeline_run):
    run, _, config = pipeline_run
    splits = run.prepared_splits()
    assert splits.feature_names == [f"f{i}" for i in range(gpu_pipeline.PIPELINE_FEATURES)]
    assert (splits.label_column, splits.n_classes) == ("label", 10)
    direct = torch_training.train(config, splits).run
    assert direct.samples_per_second > 0 and direct.history[-1].val_accuracy >= gpu_pipeline.MIN_ACCURACY


def test_the_bundle_scores_the_whole_table_as_the_run_evaluated_it(pipeline_run):
    run, table, _ = pipeline_run
    accuracy, rows_per_second = gpu_pipeline.gpu_accuracy(run, table)
    assert accuracy >= 0.99 * run.manifest["metrics"]["accuracy"] and rows_per_second > 0


def test_a_run_that_fails_is_a_failed_check_with_its_message(tmp_path):
    data = json.dumps({"dataset": str(tmp_path / "missing.parquet"), "label_column": "label"})
    with pytest.raises(CheckFailed, match=r"(?s)pyflyte run exited [1-9].*missing\.parquet"):
        gpu_pipeline.pyflyte_run(tmp_path / "run", "--data", data)
