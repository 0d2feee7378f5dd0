"""A round's work in plain Python: new trials proposed into the study with their configs, promoted trials
with the same values and a later stop, and a trained rung recorded into its trial."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tasks.core.models.plugins import mlp_spec
from tasks.core.training.config import TrainConfig
from tasks.core.training.records import EpochMetrics, TrainingRun
from tasks.core.tuning.rounds import record_rung, round_configs, trial_config
from tasks.core.tuning.rungs import Round
from tasks.core.tuning.study import Study, TrialRecord, TuningSettings

SPACE = {"learning_rate": {"low": 1e-3, "high": 1e-2, "log": True}, "width": {"choices": [16, 32]},
         "epochs": {"low": 3, "high": 9}}  # fmt: skip
BASE = TrainConfig(batch_size=16, model=mlp_spec([64, 64]))


def study() -> Study:
    settings = TuningSettings(trials=4, concurrency=2, search_space=json.dumps(SPACE))
    return Study(settings, "val_loss", "minimize", [3, 9])


def test_a_round_of_new_trials_proposes_them_into_the_study_each_stopping_at_the_rung():
    s = study()
    jobs = round_configs(s, Round(0, new=2), BASE)
    assert [number for number, _ in jobs] == [0, 1] and [t.number for t in s.trials] == [0, 1]
    for (_, config), record in zip(jobs, s.trials, strict=True):
        values = record.values()
        assert (config.epochs, config.train_until_epoch) == (9, 3)  # scheduled over the whole budget
        assert config.learning_rate == values["learning_rate"] and config.batch_size == 16
        assert config.model.options["hidden_sizes"] == f"{values['width']},{values['width']}"
    again = round_configs(study(), Round(0, new=2), BASE)
    assert [config for _, config in again] == [config for _, config in jobs]  # seeded: the same proposals


def test_a_promoted_trial_keeps_its_values_and_stops_at_its_new_rung():
    s = study()
    (number, first), _ = round_configs(s, Round(0, new=2), BASE)
    (promoted, config), = round_configs(s, Round(1, existing=[number]), BASE)  # fmt: skip
    assert promoted == number and len(s.trials) == 2
    assert config.train_until_epoch == 9 and config.learning_rate == first.learning_rate


@pytest.mark.parametrize("epochs, stops", [(9, [3, 9]), (12, [3, 12]), (5, [3, 5]), (2, [2, 2])])
def test_the_baseline_is_the_base_run_stopped_at_the_rungs_on_its_way_to_its_own_epochs(epochs, stops):
    base = replace(BASE, epochs=epochs)
    baseline = TrialRecord(0, {}, baseline=True)
    configs = [trial_config(base, baseline, budget, 9) for budget in (3, 9)]
    assert [config.train_until_epoch for config in configs] == stops
    assert all(replace(config, train_until_epoch=0, on_divergence="fail") == base for config in configs)
    assert all(config.on_divergence == "stop" for config in configs)  # a diverged trial ends no study


def test_a_baseline_whose_epochs_ended_at_an_earlier_rung_is_not_run_again():
    s = study()  # rungs at 3 and 9 epochs
    baseline = TrialRecord(0, {}, baseline=True, rung_metrics=[0.4], epochs_trained=2)
    s.trials = [baseline]
    assert round_configs(s, Round(1, existing=[0]), replace(BASE, epochs=2)) == []
    assert baseline.rung_metrics == [0.4, 0.4] and baseline.epochs_trained == 2
    assert len(round_configs(s, Round(1, existing=[0]), replace(BASE, epochs=5))) == 1


def test_a_rung_records_its_metric_curve_and_seconds():
    record = TrialRecord(0, {}, price_per_hour=3.6)
    history = [EpochMetrics(epoch, 1.0, 0.5, 1.0 / epoch, 0.5, 40) for epoch in (1, 2, 3)]
    run = TrainingRun("pytorch", "cpu", "cpu", 1, "none", "float32", "single-process", history, 1.0, 10.0,
                      TrainConfig())  # fmt: skip
    record_rung(record, 0.25, run)
    assert record.rung_metrics == [0.25] and record.val_losses == [1.0, 0.5, 1.0 / 3]
    assert (record.epochs_trained, record.wall_seconds) == (3, 10.0)
    assert abs(record.cost_usd - 0.01) < 1e-12
