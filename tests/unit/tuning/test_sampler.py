"""Optuna's TPE, seeded: the same study inputs propose the same trials, within the space."""

from __future__ import annotations

from tasks.core.training.config import TrainConfig
from tasks.core.tuning.sampler import as_params, propose
from tasks.core.tuning.space import parse_space
from tasks.core.tuning.study import TrialRecord

SPACE = parse_space("", TrainConfig())


def history(count: int) -> list[TrialRecord]:
    proposals = propose(SPACE, [], "maximize", 0, count)
    return [
        TrialRecord(n, as_params(values), rung_metrics=[values["learning_rate"] * 10])
        for n, values in enumerate(proposals)
    ]


def test_the_same_seed_and_history_propose_the_same_trials():
    assert propose(SPACE, history(6), "maximize", 3, 4) == propose(SPACE, history(6), "maximize", 3, 4)


def test_another_seed_or_wave_proposes_others():
    first = propose(SPACE, [], "maximize", 0, 4)
    assert propose(SPACE, [], "maximize", 1, 4) != first
    assert propose(SPACE, history(4), "maximize", 0, 4) != first  # a later wave does not repeat the first


def test_proposals_stay_in_the_space():
    for values in propose(SPACE, history(8), "maximize", 0, 8):
        assert 1e-4 <= values["learning_rate"] <= 1e-1
        assert values["batch_size"] in (32, 64, 128, 256) and values["width"] in (16, 32, 64, 128, 256, 512)
        assert 1 <= values["depth"] <= 3 and isinstance(values["depth"], int)


def test_recorded_values_read_back_exactly():
    values = propose(SPACE, [], "maximize", 0, 1)[0]
    assert TrialRecord(0, as_params(values)).values() == values


def test_the_sampler_is_not_told_the_baseline():
    """The base configuration is no point of the space: the proposals are those of the proposed trials alone."""
    baseline = TrialRecord(0, {}, rung_metrics=[0.99], baseline=True)
    proposed = [TrialRecord(n + 1, t.params, rung_metrics=t.rung_metrics) for n, t in enumerate(history(4))]
    assert propose(SPACE, [baseline, *proposed], "maximize", 0, 2) == propose(
        SPACE, [TrialRecord(0, {}, rung_metrics=[0.1], baseline=True), *proposed], "maximize", 0, 2
    )
