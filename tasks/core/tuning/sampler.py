"""Optuna's TPE proposes each wave of new trials from the rung-0 results so far, seeded: the same inputs
propose the same trials, so a rerun of a study finds its trials' runs in the cache."""

from __future__ import annotations

import json
import math

import numpy as np

from tasks.core.tuning.space import Dimension, SearchSpace
from tasks.core.tuning.study import TrialRecord


def distributions(space: SearchSpace) -> dict:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    def one(dim: Dimension):
        if dim.kind == "choice":
            return CategoricalDistribution(dim.choices)
        if dim.kind == "int":
            return IntDistribution(int(dim.low), int(dim.high), log=dim.log)
        return FloatDistribution(float(dim.low), float(dim.high), log=dim.log)

    return {dim.key: one(dim) for dim in space.dimensions}


def wave_seed(seed: int, first_number: int) -> int:
    """A seed per wave: the same sampler seed each wave would repeat its random start-up proposals."""
    return int(np.random.SeedSequence([seed, first_number]).generate_state(1)[0])


def propose(
    space: SearchSpace, history: list[TrialRecord], direction: str, seed: int, count: int
) -> list[dict]:
    """`count` new trials' values, given every proposed trial so far and its rung-0 metric (if measured);
    the baseline is not a point of the space, so the sampler is not told it."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = distributions(space)
    sampler = optuna.samplers.TPESampler(
        seed=wave_seed(seed, len(history)), n_startup_trials=max(count, 4), constant_liar=True
    )
    study = optuna.create_study(direction=direction, sampler=sampler)
    for record in history:
        if not record.baseline:
            study.add_trial(told(record, dists))
    return [study.ask(dists).params for _ in range(count)]


def told(record: TrialRecord, dists: dict):
    """A past trial as Optuna's record: its rung-0 metric, or failed where it is not a finite number."""
    from optuna.trial import TrialState, create_trial

    values = {key: value for key, value in record.values().items() if key in dists}
    value = record.rung_metrics[0] if record.rung_metrics else math.nan
    if not math.isfinite(value):
        return create_trial(params=values, distributions=dists, state=TrialState.FAIL)
    return create_trial(params=values, distributions=dists, value=value)


def as_params(values: dict) -> dict[str, str]:
    """A trial's values as the study records them: JSON text per key, exact for floats."""
    return {key: json.dumps(value) for key, value in values.items()}
