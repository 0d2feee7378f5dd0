"""Batch scoring where it runs as a workflow or a process: one real local run of the scheduled scoring
workflow over a folder of parts with the latest published model, the workflow's checks before any piece
is scored, the package's scoring launch plan and tasks, and the scorer where flytekit cannot be imported
(the scorer itself: tests/unit/scoring/test_scoring.py)."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime

import numpy as np
import pytest

from tasks.core.bundle.loading import load_bundle
from tasks.core.publish.versions import publish_bundle
from tests.flyte_package import REPO
from tests.unit.publish.test_publish import write_test_bundle
from tests.unit.scoring.test_scoring import (
    PART_ROWS,
    PROBABILITIES,
    assert_scored_as_the_bundle,
    read_predictions,
    users_table,
    write_parts,
)

KICKOFF = datetime(2025, 3, 2, 3, 0)


@pytest.fixture(scope="module")
def scoring_root(tmp_path_factory):
    return tmp_path_factory.mktemp("scoring")


@pytest.fixture(scope="module")
def nightly_scoring_run(scoring_root, scoring_bundle):
    """`scheduled_scoring` as its schedule would run it: the kickoff time names the day's folder of
    parts, and the prefix holds two published bundles, of which LATEST names the second."""
    from workflows.launch_plans import scheduled_scoring

    write_parts(scoring_root / "events" / "day=2025-03-01.parquet", users_table())
    prefix = str(scoring_root / "models")
    older = publish_bundle(write_test_bundle(scoring_root / "older", seed=4), prefix)
    latest = publish_bundle(scoring_bundle, prefix)
    outputs = scheduled_scoring(kickoff_time=KICKOFF, model_prefix=prefix, max_parallel=2,
                                dataset_template=str(scoring_root / "events" / "day={yesterday}.parquet"))  # fmt: skip
    return outputs, older, latest


@pytest.mark.slow
def test_the_nightly_scoring_scores_every_row_of_the_days_parts_with_the_latest_model(nightly_scoring_run):
    from tasks.plumbing.storage import local_path

    outputs, older, latest = nightly_scoring_run
    report = outputs.report
    assert report.model == latest and report.dataset.endswith("day=2025-03-01.parquet")
    predictions = read_predictions(local_path(outputs.predictions))
    assert_scored_as_the_bundle(predictions, latest)
    older_scores = load_bundle(older).predict_proba(users_table())
    assert not np.allclose(predictions[PROBABILITIES].to_numpy(), older_scores), "the two models score alike"
    assert (report.rows, report.pieces) == (sum(PART_ROWS), len(PART_ROWS))
    assert report.hardware.device == "cpu" and report.metrics.n_test == sum(PART_ROWS)


@pytest.mark.slow
def test_the_workflow_checks_its_inputs_before_any_piece_is_scored(scoring_bundle, tmp_path, monkeypatch):
    import tasks.score
    from workflows.scoring import batch_predict

    scored = []
    monkeypatch.setattr(tasks.score, "score_piece", lambda *args: scored.append(args))
    dataset = write_parts(tmp_path / "users.parquet", users_table().drop(columns="f1"))
    with pytest.raises(Exception, match="missing feature column 'f1'"):
        batch_predict(model=scoring_bundle, dataset=dataset)
    assert scored == []


@pytest.mark.slow
def test_the_nightly_scoring_launch_plan_serializes_with_its_schedule(flyte_package):
    plan = flyte_package.launch_plans["nightly_scoring"]
    schedule = plan.spec.entity_metadata.schedule
    assert (schedule.cron_schedule.schedule, schedule.kickoff_time_input_arg) == ("0 3 * * *", "kickoff_time")
    assert plan.spec.workflow_id.name == "workflows.launch_plans.scheduled_scoring"
    assert {"kickoff_time", "model_prefix", "dataset_template"} <= set(plan.spec.default_inputs.parameters)


@pytest.mark.slow
def test_only_the_gpu_scoring_tasks_ask_for_a_gpu_each_in_its_frameworks_image(flyte_package):
    from tests.flyte_package import REGISTRY, TAG, image_of, requests_of

    expected = {"score": "ml-cpu", "score_piece_cpu": "ml-cpu", "collect_scores": "ml-cpu",
                "score_piece_torch_gpu": "torch-gpu", "score_piece_tf_gpu": "tf-gpu"}  # fmt: skip
    for name, image in expected.items():
        spec = flyte_package.tasks[f"tasks.score.{name}"]
        assert image_of(spec) == f"{REGISTRY}/mixedml-{image}:{TAG}"
        assert ("gpu" in requests_of(spec)) == name.endswith("_gpu"), name


# The scorer as a user runs it outside Flyte: in a process where flytekit cannot be imported.
SCORE_WITHOUT_FLYTE = """
import sys
sys.modules["flytekit"] = None
from tasks.core.scoring.run import score_dataset
print(score_dataset(*sys.argv[1:]).rows)
"""


@pytest.mark.slow
def test_the_scorer_runs_where_flytekit_cannot_be_imported(scoring_bundle, scoring_parts, tmp_path):
    command = [
        sys.executable,
        "-c",
        SCORE_WITHOUT_FLYTE,
        scoring_bundle,
        scoring_parts,
        str(tmp_path / "out"),
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-1] == str(sum(PART_ROWS))
