"""The chain preprocess -> train -> evaluate run from the package the way pods run it: each task's
outputs.pb feeds the next, so every step crosses real serialization boundaries.

The preprocessing pod and the training attempt are the session's shared ones (conftest); a retry
that resumes from a finished attempt's checkpoint is test_retries'."""

from __future__ import annotations

import pytest

from tasks.types import EvaluationReport
from tests.pods import merged, output, run_like_a_pod

pytestmark = pytest.mark.slow


def test_preprocess_train_evaluate_as_pods(flyte_package, prepared_by_a_pod, completed_attempt, tmp_path):
    report_literals = run_like_a_pod(
        flyte_package.tasks["tasks.evaluate.evaluate"],
        merged(prepared=prepared_by_a_pod, trained=completed_attempt.outputs.literals["o0"]),
        tmp_path / "evaluate",
    )
    report = output(report_literals, EvaluationReport, "report")
    assert list((tmp_path / "evaluate" / "raw").rglob("bundle.json")), "the model bundle was not uploaded"
    assert report.metrics.accuracy >= 0.9 and report.metrics.n_test == 270
    assert (report.training.framework, report.training.world_size) == ("pytorch", 2)
    model_files = list((completed_attempt.workdir / "raw").rglob("model.pt"))
    assert model_files, "the model artifact was not uploaded to the raw output prefix"
    assert (completed_attempt.workdir / "checkpoint" / "training_state.pt").exists(), (
        "no checkpoint was uploaded"
    )
