"""A round's work in plain Python, whoever trains it (the tuning workflow's runs, or a benchmark in one
process): the trials a round trains with their configs, new ones proposed and added to the study here,
and each trained rung recorded into its trial."""

from __future__ import annotations

from dataclasses import replace

from tasks.core.training.config import TrainConfig
from tasks.core.training.records import TrainingRun
from tasks.core.tuning.rungs import Round
from tasks.core.tuning.space import apply_params, parse_space
from tasks.core.tuning.study import Study, TrialRecord


def round_configs(study: Study, work: Round, base: TrainConfig) -> list[tuple[int, TrainConfig]]:
    """The round's (trial number, config) pairs. A round of new trials proposes them from the study so
    far (Optuna's seeded sampler) and adds them to `study.trials`; a promoted trial keeps its values."""
    from tasks.core.tuning.sampler import as_params, propose

    if work.new:
        space = parse_space(study.settings.search_space, base)
        proposals = propose(space, study.trials, study.direction, study.settings.seed, work.new)
        first = len(study.trials)
        study.trials += [TrialRecord(first + i, as_params(values)) for i, values in enumerate(proposals)]
        numbers = list(range(first, first + work.new))
    else:
        numbers = work.promoted
    return [
        (n, trial_config(base, study.trial(n), study.budgets[work.rung], study.budgets[-1])) for n in numbers
    ]


def trial_config(base: TrainConfig, record: TrialRecord, budget: int, last: int) -> TrainConfig:
    """The trial's run to the end of a rung: `base` with its values, the learning rate scheduled over the
    whole budget (`last` epochs) and the run stopped after `budget` epochs, checkpointed for the next."""
    return replace(apply_params(base, record.values()), epochs=last, train_until_epoch=budget)


def record_rung(record: TrialRecord, metric: float, run: TrainingRun) -> None:
    """A trained rung into its trial: the study's `metric` of the model the run handed back, the run's
    learning curve (its whole history, earlier rungs included) and this rung's seconds alone."""
    record.add_rung(metric, [epoch.val_loss for epoch in run.history], run.train_seconds)
