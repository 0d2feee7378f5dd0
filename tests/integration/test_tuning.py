"""Tuning end to end: a 4-trial, 2-rung study on the embedded digits, one trial of which diverges, and
bad input refused first."""

from __future__ import annotations

import json
import math

import pytest

from tasks.core.messages import InputError
from tasks.core.models.plugins import ModelSpec
from tasks.core.training.config import TrainConfig
from tasks.core.tuning.study import COMPLETED, DIVERGED, STOPPED

pytestmark = pytest.mark.slow
SPACE = {
    "learning_rate": {"choices": [3e-3, 1e-2, 1e9]},  # 1e9 diverges: the study goes on without it
    "width": {"choices": [16, 32]},
    "epochs": {"low": 1, "high": 3},
}


@pytest.fixture(scope="module")
def study_run():
    from workflows.tuning import tuning_pipeline

    base = TrainConfig(epochs=3, batch_size=64, model=ModelSpec("mlp", options={"hidden_sizes": "32"}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MIXEDML_LOCAL_CPU_WORKERS", "1")  # one process a trial: the study is small and quick
        return tuning_pipeline(
            trials=4, concurrency=2, search_space=json.dumps(SPACE), hyperparameters=base, seed=3
        )


def test_a_four_trial_two_rung_study_runs_end_to_end_on_the_digits(study_run):
    study = study_run.study
    assert study.budgets == [1, 3] and study.metric == "val_macro_f1" and len(study.proposed) == 4
    baseline = study.trial(0)  # the base configuration, trained every rung as the reference
    assert baseline.baseline and baseline.state == COMPLETED and not baseline.params
    assert sorted(t.state for t in study.proposed) == [COMPLETED, DIVERGED, STOPPED, STOPPED]
    # Seed 3 proposes learning rate 1e9 for trial 1 alone: it diverges, and the study goes on.
    diverged = study.trial(1)
    assert diverged.state == DIVERGED and diverged.params["learning_rate"] == "1000000000.0"
    assert math.isnan(diverged.rung_metrics[0]) and diverged.epochs_trained == 0
    (promoted,) = (t for t in study.proposed if t.state == COMPLETED)
    assert promoted.epochs_trained == 3 and len(promoted.rung_metrics) == 2
    stopped = [t for t in study.trials if t.state == STOPPED]
    assert all(t.epochs_trained == 1 and t.rung_metrics[0] <= promoted.rung_metrics[0] for t in stopped)
    best = study.trial(study.best)
    assert best.rung_metrics[-1] == max(baseline.rung_metrics[-1], promoted.rung_metrics[-1])
    assert all(t.hardware and t.wall_seconds > 0 and t.cost_usd > 0 for t in study.trials)
    assert study.cost_usd < study.full_budget_cost_usd
    # The best trial went through the ordinary evaluation: its report is of its 3 epochs.
    assert len(study_run.report.training.history) == 3 and study_run.report.metrics.n_test == 270
    assert study_run.report.training.config.model.options["hidden_sizes"] == best.params.get("width", "32")


def test_bad_tuning_input_is_refused_before_anything_runs():
    from workflows.tuning import tuning_pipeline

    with pytest.raises(Exception, match="concurrency") as caught:
        tuning_pipeline(trials=2, concurrency=3)
    assert isinstance(caught.value, InputError) or "InputError" in str(caught.value)
