"""A round's work in plain Python, whoever trains it (the tuning workflow's runs, or a benchmark in one
process): the trials a round trains with their configs, new ones proposed and added to the study here,
and each trained rung recorded into its trial."""

from __future__ import annotations

from dataclasses import replace

from tasks.core.training.config import TrainConfig
from tasks.core.training.records import TrainingRun
from tasks.core.tuning.rungs import Round, rung_budgets
from tasks.core.tuning.space import apply_params, parse_space
from tasks.core.tuning.study import Study, TrialRecord, TuningSettings, new_study


def round_configs(study: Study, work: Round, base: TrainConfig) -> list[tuple[int, TrainConfig]]:
    """The round's (trial number, config) pairs: the trials it names, which keep their values, then its
    new ones, proposed from the study so far (Optuna's seeded sampler) and added to `study.trials`. A
    trial whose run ended at an earlier rung is not run again (`ended_earlier`)."""
    from tasks.core.tuning.sampler import as_params, propose

    numbers = list(work.existing)
    if work.new:
        space = parse_space(study.settings.search_space, base)
        proposals = propose(space, study.trials, study.direction, study.settings.seed, work.new)
        first = len(study.trials)
        study.trials += [TrialRecord(first + i, as_params(values)) for i, values in enumerate(proposals)]
        numbers += range(first, first + work.new)
    jobs = []
    for number in numbers:
        record = study.trial(number)
        config = trial_config(base, record, study.budgets[work.rung], study.budgets[-1])
        if ended_earlier(record, config):
            record.rung_metrics.append(record.rung_metrics[-1])  # its run is done: that rung's metric again
        else:
            jobs.append((number, config))
    return jobs


def ended_earlier(record: TrialRecord, config: TrainConfig) -> bool:
    """Whether `record` already trained every epoch `config` asks for: the baseline, whose own epochs
    ended at an earlier rung."""
    return record.epochs_trained >= config.train_until_epoch


def open_study(settings: TuningSettings, base: TrainConfig, regression: bool, val_rows: int) -> Study:
    """A new study of `base`: the metric for the problem type (the settings' own where they name one),
    the rungs' budgets from the space's epoch range, and the validation split's rows."""
    from tasks.core.tuning.checks import METRICS, default_metric

    metric = settings.metric or default_metric(regression)
    space = parse_space(settings.search_space, base)
    budgets = rung_budgets(space.min_epochs, space.max_epochs, settings.reduction_factor)
    return new_study(settings, metric, METRICS[metric][1], budgets, val_rows)


def trial_config(base: TrainConfig, record: TrialRecord, budget: int, last: int) -> TrainConfig:
    """The trial's run to the end of a rung: its whole run (`whole_config`), its learning rate
    scheduled over all of it, stopped after `budget` epochs (all of them at the `last` rung) and
    checkpointed for the next. A trial that diverges stops with a record that says so, and the study
    goes on without it."""
    whole = whole_config(base, record, last)
    stop = whole.epochs if budget == last else min(budget, whole.epochs)
    return replace(whole, train_until_epoch=stop, on_divergence="stop")


def whole_config(base: TrainConfig, record: TrialRecord, last: int) -> TrainConfig:
    """The trial's run without breaks: the baseline is `base` itself, the run training_pipeline trains
    with it (its own epochs); any other trial is `base` with its values, over the study's `last` epochs."""
    if record.baseline:
        return base
    return replace(apply_params(base, record.values()), epochs=last)


def record_rung(record: TrialRecord, metric: float, run: TrainingRun) -> None:
    """A trained rung into its trial: the study's `metric` of the model the run handed back, the run's
    learning curve (its whole history, earlier rungs included) and this rung's seconds alone."""
    record.add_rung(metric, [epoch.val_loss for epoch in run.history], run.train_seconds)
