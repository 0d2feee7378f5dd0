"""The tuning benchmark at its smoke size: a study run in this process, its promoted trials resumed from
their checkpoints, against the same trials each trained to the whole budget."""

from __future__ import annotations

import math

import pytest

from benchmarks import tables, tuning_bench
from tasks.core.data.column_kinds import CATEGORICAL, NUMERIC

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def breast_cancer(tmp_path_factory):
    return tuning_bench.open_table(
        tmp_path_factory.mktemp("tuning"), "breast_cancer", tuning_bench.SMOKE["rows"]
    )


def test_a_promoted_trial_resumed_rung_after_rung_ends_as_the_same_trial_trained_whole(breast_cancer):
    settings = tuning_bench.study_settings(tuning_bench.SMOKE, regression=False)
    base = tuning_bench.TrainConfig(epochs=tuning_bench.SMOKE["default_epochs"])  # 2 epochs
    study, tuned = tuning_bench.halving(breast_cancer, base, settings)
    full = tuning_bench.full_budget(breast_cancer, base, study)
    # The baseline and 3 trials: all train the first rung (1 epoch); then the best trial the second (to
    # 3 epochs) and the baseline to its own 2.
    assert study.budgets == [1, 3] and [t.epochs_trained for t in study.trials].count(3) == 1
    assert study.trial(0).baseline and study.trial(0).epochs_trained == 2
    assert (tuned.epochs, full.epochs) == (4 + 1 + 2, 3 * 3 + 2)
    for completed in (t for t in study.trials if t.state == "completed"):
        whole = next(record for record in full.records if record.number == completed.number)
        assert completed.rung_metrics[-1] == whole.rung_metrics[0]
        assert completed.val_losses == whole.val_losses
    assert 0 < tuned.test_score <= 1 and 0 < full.test_score <= 1


def test_the_group_prints_each_tables_block_and_marks_every_goal(tmp_path, capsys):
    figures = tuning_bench.tuning(tmp_path, tuning_bench.SMOKE, ["cars"])
    assert len(figures) == 5 + 2  # the split's five, then the means over the splits (one at this size)
    for figure in figures:
        assert figure.name.startswith(
            ("tuning: cars (split seed 0) ", "tuning: cars, mean over split seeds 0,")
        )
        assert math.isfinite(figure.value) and math.isfinite(figure.baseline) and figure.baseline > 0
        assert figure.goal.endswith((": met", ": missed")), figure.goal
    versus_hgb, versus_default = figures[5:]
    assert versus_hgb.name.startswith("tuning: cars, mean over split seeds 0, tuned vs HistGradientBoosting")
    assert (versus_hgb.value, versus_hgb.baseline) == (figures[0].value, figures[0].baseline)
    assert (versus_default.value, versus_default.baseline) == (figures[1].value, figures[1].baseline)
    printed = capsys.readouterr().out
    assert "cars (cars.parquet, 406 rows: 284 train, 61 val, 61 test; split seed 0): test accuracy" in printed
    assert "| trial-epochs vs full budget | 7 | 11 | 0.636 | ratio <= 0.5: missed |" in printed


def test_gradient_boosting_reads_a_kind_it_does_not_know_as_categories():
    assert tables.hgb_kind(NUMERIC) == NUMERIC
    assert tables.hgb_kind("text") == CATEGORICAL
