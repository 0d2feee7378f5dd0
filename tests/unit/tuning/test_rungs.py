"""Successive halving: the rungs' budgets, who is promoted (ties too) and the rounds of a study."""

from __future__ import annotations

import math

import pytest

from tasks.core.tuning.rungs import finish, next_round, promoted, rung_budgets, rung_sizes, standard_error
from tasks.core.tuning.study import (
    COMPLETED,
    DIVERGED,
    STOPPED,
    Study,
    TrialRecord,
    TuningSettings,
    new_study,
)


@pytest.mark.parametrize(
    "low, high, factor, budgets",
    [
        (3, 27, 3, [3, 9, 27]),
        (1, 3, 3, [1, 3]),
        (3, 20, 3, [3, 9, 20]),
        (5, 5, 3, [5]),
        (2, 16, 2, [2, 4, 8, 16]),
    ],
)
def test_budgets_grow_by_the_reduction_factor_up_to_the_most(low, high, factor, budgets):
    assert rung_budgets(low, high, factor) == budgets


def test_each_rung_keeps_a_third_and_at_least_one():
    assert rung_sizes(16, 3, 3) == [16, 5, 1]
    assert rung_sizes(2, 3, 3) == [2, 1, 1]  # fewer trials than the reduction factor


def study(trials: int, concurrency: int, budgets: list[int], direction: str = "maximize") -> Study:
    return Study(TuningSettings(trials=trials, concurrency=concurrency), "val_macro_f1", direction, budgets)


def with_results(s: Study, rung0: list[float]) -> Study:
    s.trials = [TrialRecord(n, {}, rung_metrics=[value]) for n, value in enumerate(rung0)]
    return s


def test_rung_zero_fills_in_waves_of_the_concurrency():
    s = study(5, 2, [1, 3])
    assert next_round(s).new == 2
    s.trials = [TrialRecord(n, {}, rung_metrics=[0.5]) for n in range(4)]
    work = next_round(s)
    assert (work.rung, work.new) == (0, 1)


def baseline_study(trials: int, concurrency: int, budgets: list[int]) -> Study:
    return new_study(
        TuningSettings(trials=trials, concurrency=concurrency), "val_macro_f1", "maximize", budgets
    )


def test_the_baseline_trains_in_the_first_wave_beside_the_proposed_trials():
    s = baseline_study(4, 2, [1, 3])
    assert [(t.number, t.baseline) for t in s.trials] == [(0, True)]
    work = next_round(s)
    assert (work.rung, work.existing, work.new) == (0, [0], 1)
    s.trials[0].rung_metrics.append(0.5)
    s.trials += [TrialRecord(1, {}, rung_metrics=[0.6])]
    assert (next_round(s).existing, next_round(s).new) == ([], 2)  # the baseline is not one of the 4 trials
    s.trials += [TrialRecord(n, {}, rung_metrics=[0.6]) for n in (2, 3, 4)]
    assert len(s.proposed) == 4 and next_round(s).rung == 1


def test_the_baseline_trains_every_rung_and_the_best_must_beat_it():
    s = baseline_study(6, 6, [1, 3, 9])
    s.trials[0].rung_metrics.append(0.1)  # the worst at the first rung, and promoted all the same
    s.trials += [TrialRecord(n, {}, rung_metrics=[0.1 * n + 0.2]) for n in range(1, 7)]
    assert promoted(s, 1) == [0, 6, 5]  # the baseline, then the best third of the 6 proposed
    for number, value in ((0, 0.9), (6, 0.8), (5, 0.7)):
        s.trial(number).rung_metrics.append(value)
    assert promoted(s, 2) == [0, 6]
    for number, value in ((0, 0.95), (6, 0.9)):
        s.trial(number).rung_metrics.append(value)
    assert next_round(s) is None
    finish(s)
    assert s.best == 0 and s.trial(0).state == COMPLETED and s.trial(5).state == STOPPED


def test_the_best_third_is_promoted_and_ties_go_to_the_earlier_trial():
    s = with_results(study(6, 6, [1, 3]), [0.5, 0.9, 0.7, 0.9, math.nan, 0.1])
    assert promoted(s, 1) == [1, 3]
    s.direction = "minimize"
    assert promoted(s, 1) == [5, 0]  # a metric that is not a number ranks last either way


def test_promotions_run_in_waves_then_the_study_ends():
    s = with_results(study(9, 2, [1, 3, 9]), [0.1 * n for n in range(9)])
    work = next_round(s)
    assert (work.rung, work.existing) == (1, [8, 7])
    for number, value in ((8, 0.5), (7, 0.95)):
        s.trial(number).rung_metrics.append(value)
    assert next_round(s).existing == [6]
    s.trial(6).rung_metrics.append(0.2)
    assert (next_round(s).rung, next_round(s).existing) == (2, [7])
    s.trial(7).rung_metrics.append(0.96)
    assert next_round(s) is None


def test_a_finished_study_marks_states_and_costs_against_the_full_budget():
    s = with_results(study(3, 3, [1, 3]), [0.2, 0.8, 0.5])
    for record in s.trials:
        record.price_per_hour, record.epochs_trained, record.wall_seconds = 3600.0, 1, 1.0
    s.trial(1).rung_metrics.append(0.85)
    s.trial(1).epochs_trained, s.trial(1).wall_seconds = 3, 3.0
    for record in s.trials:
        record.cost_usd = record.wall_seconds
    finish(s)
    assert [t.state for t in s.trials] == [STOPPED, COMPLETED, STOPPED]
    assert s.best == 1
    assert s.cost_usd == pytest.approx(5.0)
    assert s.full_budget_cost_usd == pytest.approx(9.0)  # each trial's 1 s an epoch for 3 epochs


def test_a_rung_adds_its_metric_epochs_seconds_and_cost():
    record = TrialRecord(0, {}, price_per_hour=7.2)
    record.add_rung(0.5, [1.0], 10.0)
    record.add_rung(0.7, [1.0, 0.8, 0.6], 20.0)
    assert record.rung_metrics == [0.5, 0.7] and record.epochs_trained == 3
    assert record.wall_seconds == 30.0 and record.cost_usd == pytest.approx(0.06)


def finalists(metrics: dict[int, float], direction: str, metric: str, val_rows: int) -> Study:
    """A finished study's last rung: trial 0 the baseline, the others proposed."""
    s = new_study(TuningSettings(trials=len(metrics) - 1), metric, direction, [1], val_rows)
    s.trials[0].rung_metrics.append(metrics[0])
    s.trials += [TrialRecord(n, {}, rung_metrics=[value]) for n, value in metrics.items() if n]
    return finish(s)


def test_a_trial_replaces_the_baseline_only_beyond_one_standard_error():
    error = standard_error("val_accuracy", 0.7, 300)
    assert error == pytest.approx(math.sqrt(212 / 304 * (92 / 304) / 304))  # Agresti-Coull's: 0.026
    kept = finalists({0: 0.7, 1: 0.72, 2: 0.6}, "maximize", "val_accuracy", 300)
    assert kept.best == 0 and kept.choice.startswith(
        "the base configuration kept: trial 1's val_accuracy 0.72"
    )
    assert "over 300 validation rows" in kept.choice
    assert finalists({0: 0.7, 1: 0.73, 2: 0.6}, "maximize", "val_accuracy", 300).best == 1
    assert finalists({0: 0.7, 1: 0.72}, "maximize", "val_accuracy", 3000).best == 1  # 0.0084 on more rows
    # A perfect score one row better than 85 of 86 is no evidence: the plain formula's error (0.0116)
    # is below the row's 0.0116, Agresti-Coull's (0.019) is not.
    assert finalists({0: 85 / 86, 1: 1.0}, "maximize", "val_accuracy", 86).best == 0


def test_a_lower_rmse_must_beat_the_baseline_by_its_standard_error_and_val_loss_by_anything():
    assert standard_error("val_rmse", 50.0, 50) == pytest.approx(5.0)
    assert finalists({0: 50.0, 1: 46.0}, "minimize", "val_rmse", 50).best == 0
    assert finalists({0: 50.0, 1: 44.0}, "minimize", "val_rmse", 50).best == 1
    assert finalists({0: 0.50, 1: 0.49}, "minimize", "val_loss", 50).best == 1  # no standard error: 0
    assert finalists({0: 0.5, 1: math.nan}, "maximize", "val_accuracy", 50).best == 0


def test_a_trial_that_diverged_is_never_promoted_nor_chosen_and_the_study_goes_on():
    s = baseline_study(4, 4, [1, 3])
    s.trials[0].rung_metrics.append(math.nan)  # the baseline diverged: it is not resumed
    s.trials += [TrialRecord(n, {}, rung_metrics=[value]) for n, value in ((1, 0.4), (2, math.nan), (3, 0.3))]
    s.trials += [TrialRecord(4, {}, rung_metrics=[0.2])]
    assert promoted(s, 1) == [1]
    s.trial(1).rung_metrics.append(math.nan)  # and the promoted one diverged at the last rung
    s.trial(1).epochs_trained, s.trial(1).cost_usd = 2, 2.0
    assert next_round(s) is None
    finish(s)
    assert [t.state for t in s.trials] == [DIVERGED, DIVERGED, DIVERGED, STOPPED, STOPPED]
    assert s.best == 3 and s.choice.startswith("the best val_macro_f1, 0.3")  # the furthest that did not
    assert s.full_budget_cost_usd == pytest.approx(2.0)  # it diverged where its whole run would have


def test_a_study_whose_every_trial_diverged_fails_saying_so():
    s = baseline_study(2, 3, [1, 3])
    s.trials[0].rung_metrics.append(math.nan)
    s.trials += [TrialRecord(n, {}, rung_metrics=[math.inf]) for n in (1, 2)]
    with pytest.raises(ValueError, match="all 3 trials of the study diverged .*lower the search space's"):
        finish(s)
