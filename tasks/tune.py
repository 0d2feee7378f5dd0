"""Tuning: many ordinary training runs. Each round proposes or promotes at most `concurrency` trials,
plans each onto the cheapest hardware that holds it, and trains it with the target's own training task;
a promoted trial resumes from its own checkpoint (every target's task takes `resume_from`). The search
itself is plain Python (tasks/core/tuning/).

The rounds are a chain of `@dynamic`s: each one sees the results of the one before, which the sampler
and the rung promotions need, and launches at most `concurrency` runs at a time.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from flytekit import dynamic, task
from flytekit.core.task import Echo

from tasks.catalog import DEFAULT_PRICES_PER_HOUR
from tasks.core.accelerators.rule import on_flyte_cluster
from tasks.core.messages import raise_for
from tasks.core.training.config import TrainConfig
from tasks.core.tuning.checks import metric_problems, tuning_problems
from tasks.core.tuning.rounds import open_study, record_rung, round_configs
from tasks.core.tuning.rungs import Round, finish, next_round
from tasks.core.tuning.study import Study, TrialRecord, TuningSettings
from tasks.core.validation import batch_problems
from tasks.hardware import CPU_RETRIES, LAUNCHER_RETRIES, ML_CPU_IMAGE, SMALL_CPU, guaranteed
from tasks.plumbing.decks import DECKS
from tasks.plumbing.process import begin_task
from tasks.plumbing.study_deck import study_deck
from tasks.right_sizing import plan_report, planned_hyperparameters, workload
from tasks.targets import TARGETS
from tasks.types import PreparedData, PreprocessPlan, ResourcePlan, TrainedModel

log = logging.getLogger(__name__)
# A @dynamic's nodes are written for propeller (futures.pb) with a copy of each value a task is called
# with, and propeller reads that file only up to storage.limits.maxDownloadMBs (2 MiB unless set;
# flytestdlib/storage/stow_store.go, ReadRaw). `prepared` holds the fitted encoding, a text column's
# words among it, so a round of 4 trials on 3 text columns held 2.5 MiB of copies. Echoed once, the
# round's nodes bind to the echo's output instead: propeller's echo plugin copies it, with no pod
# (flyteplugins/go/tasks/plugins/testing/echo.go; enabled in deploy/flyte-binary-values.yaml).
share_prepared = Echo(name="tasks.tune.share_prepared", inputs={"prepared": PreparedData})


@dataclass
class TrialModel:
    """A trial's latest run: its model and checkpoint, and the plan that placed it."""

    number: int
    trained: TrainedModel
    plan: ResourcePlan


@dataclass
class TuningState:
    study: Study
    models: list[TrialModel] = field(default_factory=list)

    def model(self, number: int) -> TrialModel:
        return next(model for model in self.models if model.number == number)


@task(container_image=ML_CPU_IMAGE, **guaranteed(SMALL_CPU), retries=CPU_RETRIES)
def check_tuning(
    trials: int,
    concurrency: int,
    search_space: str,
    metric: str,
    seed: int,
    reduction_factor: int,
    hyperparameters: TrainConfig,
) -> TuningSettings:
    """The study's settings as one record; bad ones are refused before anything runs, each named. The
    metric's fit to the problem type is checked once the data is prepared (start_study)."""
    begin_task()
    settings = TuningSettings(trials, concurrency, search_space, metric, seed, reduction_factor)
    raise_for(tuning_problems(settings, hyperparameters))
    return settings


@task(container_image=ML_CPU_IMAGE, **guaranteed(SMALL_CPU), retries=CPU_RETRIES)
def start_study(
    settings: TuningSettings, hyperparameters: TrainConfig, prepared: PreparedData
) -> TuningState:
    """The new study: its metric for the problem the data turned out to be, its rungs, and the base
    configuration as trial 0."""
    begin_task()
    target = prepared.table.target
    raise_for(metric_problems(settings.metric, target.problem_type))
    rows = prepared.table.rows["val"]
    return TuningState(open_study(settings, hyperparameters, target.regression, rows))


@dynamic(container_image=ML_CPU_IMAGE, **guaranteed(SMALL_CPU), **DECKS, retries=LAUNCHER_RETRIES)
def tuning_round(
    state: TuningState,
    prepared: PreparedData,
    preprocess_plan: PreprocessPlan,
    target: str,
    hyperparameters: TrainConfig,
    plan_resources: bool,
) -> TuningState:
    """One round of at most `concurrency` runs, then the next round; the study as it ends."""
    begin_task()
    work = next_round(state.study)
    if work is None:
        return state
    jobs = round_jobs(state, work, hyperparameters, prepared, target)
    shared = share_prepared(prepared=prepared)
    trained, plans = [], []
    for number, config in jobs:
        report = plan_report(target, workload(prepared, target, config), preprocess_plan, plan_resources)
        if report.applied:
            config = planned_hyperparameters(config, report.training, on_flyte_cluster())
        resume = state.model(number).trained.checkpoint if work.rung else None
        run = TARGETS[target].trial_task(prepared=shared, hyperparameters=config, resume_from=resume)
        overrides = TARGETS[target].profile.overrides_for(report.training.choice) if report.applied else {}
        trained.append(run.with_overrides(**overrides, node_name=f"trial-{number}-rung-{work.rung}"))
        plans.append(report)
        describe_trial(state.study.trial(number), report, target)
    state = record_round(
        state=state, numbers=[n for n, _ in jobs], trained=trained, plans=plans, prepared=shared
    )
    return tuning_round(
        state=state, prepared=shared, preprocess_plan=preprocess_plan, target=target,
        hyperparameters=hyperparameters, plan_resources=plan_resources,
    )  # fmt: skip


def round_jobs(
    state: TuningState, work: Round, base: TrainConfig, prepared: PreparedData, target: str
) -> list[tuple[int, TrainConfig]]:
    """The round's (trial number, config) pairs (`round_configs`), each checked before it trains."""
    jobs = round_configs(state.study, work, base)
    for number, config in jobs:
        raise_for([f"trial {number}: {problem}" for problem in trial_problems(config, prepared, target)])
    return jobs


def trial_problems(config: TrainConfig, prepared: PreparedData, target: str) -> list[str]:
    """What a trial's config breaks: the batch against the train rows, a regression's rules and the
    target's own (a TPU slice trains with TPUStrategy)."""
    from tasks.core.validation import regression_problems

    found = batch_problems(config, 1, prepared.table.rows["train"]) + TARGETS[target].config_problems(config)
    return found + (regression_problems(config) if prepared.table.target.regression else [])


def describe_trial(record: TrialRecord, report: ResourcePlan, target: str) -> None:
    plan = report.training
    if plan:
        record.hardware, record.price_per_hour = plan.choice.name, plan.choice.price_per_hour
    else:
        record.hardware, record.price_per_hour = declared_option(target)
    log.info("trial %s on %s: %s", record.label, record.hardware, record.params or "the base configuration")


def declared_option(target: str) -> tuple[str, float]:
    """A target the planner does not size (the multi-node one): the hardware its profile declares, all
    of its nodes, at the catalog's price per device."""
    profile = TARGETS[target].profile
    hardware = profile.declared(profile.gpus_per_node * profile.nnodes)
    return hardware.describe(), DEFAULT_PRICES_PER_HOUR.get(hardware.accelerator, 0.0) * hardware.count


@task(container_image=ML_CPU_IMAGE, **guaranteed(SMALL_CPU), retries=CPU_RETRIES)
def record_round(
    state: TuningState,
    numbers: list[int],
    trained: list[TrainedModel],
    plans: list[ResourcePlan],
    prepared: PreparedData,
) -> TuningState:
    """Each run's metric on the validation split into its trial's record; the runs kept for the next rung."""
    from tasks.core.tuning.scoring import trial_metric

    begin_task()
    study, splits = state.study, prepared.local_splits()
    std = prepared.table.target.std
    for number, run, plan in zip(numbers, trained, plans, strict=True):
        value = trial_metric(study.metric, run.artifact.download, splits, run.run, std)
        record_rung(study.trial(number), value, run.run)
        log.info("trial %d: %s %.4f after %d epochs", number, study.metric, value, len(run.run.history))
        state.models = [m for m in state.models if m.number != number] + [TrialModel(number, run, plan)]
    return state


@task(container_image=ML_CPU_IMAGE, **guaranteed(SMALL_CPU), **DECKS, retries=CPU_RETRIES)
def best_trial(state: TuningState) -> tuple[TrainedModel, ResourcePlan, Study]:
    """The study finished: each trial completed or stopped, the totals, and the best trial's run; its
    Deck draws the study (tasks/plumbing/study_deck.py)."""
    begin_task()
    study = finish(state.study)
    best = state.model(study.best)
    log.info("%s", study.summary())
    study_deck(study)
    return best.trained, best.plan, study
