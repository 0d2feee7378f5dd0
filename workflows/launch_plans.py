"""Scheduled launch plans; they register together with the workflows (`pyflyte register workflows`).

Their inputs and failure notifications come from one file a user edits (workflows/schedules.py reads
it): a launch plan is scheduled, and activated on registration, only when the file gives it every
input it needs to be worth running; otherwise it registers without its schedule, and says so.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import datetime

from flytekit import CronSchedule, LaunchPlan, workflow
from flytekit.core.workflow import WorkflowBase

from tasks.catalog import DEFAULT_PRICES_PER_HOUR
from tasks.core.data.config import DataConfig
from tasks.core.publish.promotion import PromotionPolicy
from tasks.core.training.config import TrainConfig
from tasks.schedule import data_partition, dataset_partition
from tasks.score import Scored
from workflows.comparison import Compared, hardware_comparison
from workflows.pipeline import TrainingOutputs, training_pipeline
from workflows.schedules import KICKOFF, PlanConfig, PlanSpec, load_schedules
from workflows.scoring import batch_predict
from workflows.tuning import scheduled_tuning


@workflow
def scheduled_training(
    kickoff_time: datetime,
    dataset_template: str = "",
    data: DataConfig = DataConfig(),  # noqa: B008 - Flyte needs the literal default
    target: str = "gpu",
    hyperparameters: TrainConfig = TrainConfig(),  # noqa: B008 - Flyte needs the literal default
    plan_resources: bool = True,
    publish_to: str = "",
    promotion: PromotionPolicy = PromotionPolicy(),  # noqa: B008 - Flyte needs the literal default
    int8_export: bool = False,
) -> TrainingOutputs:
    """training_pipeline on the partition named by the kickoff time, e.g. s3://bucket/events/dt={yesterday}/;
    with `publish_to`, the bundle is published there and becomes its LATEST, which nightly_scoring reads,
    only where the promotion gate finds it not worse than the current LATEST on the run's test split.
    Every other input is training_pipeline's, so the file can set each of them (the data's label column,
    column kinds and split, the problem type ...); the data's dataset is the partition."""
    partition = data_partition(template=dataset_template, data=data, kickoff_time=kickoff_time)
    return training_pipeline(
        data=partition, target=target, hyperparameters=hyperparameters, plan_resources=plan_resources,
        publish_to=publish_to, promotion=promotion, int8_export=int8_export,
    )  # fmt: skip


@workflow
def scheduled_comparison(
    kickoff_time: datetime,
    dataset_template: str = "",
    data: DataConfig = DataConfig(),  # noqa: B008 - Flyte needs the literal default
    hyperparameters: TrainConfig = TrainConfig(),  # noqa: B008 - Flyte needs the literal default
    plan_resources: bool = True,
    prices: dict[str, float] = DEFAULT_PRICES_PER_HOUR,  # noqa: B006
) -> Compared:
    """hardware_comparison on the partition named by the kickoff time: the GPU and the TPU run on the
    user's current data and model, not on the embedded demo data. Every other input is
    hardware_comparison's."""
    partition = data_partition(template=dataset_template, data=data, kickoff_time=kickoff_time)
    return hardware_comparison(
        data=partition, hyperparameters=hyperparameters, plan_resources=plan_resources, prices=prices
    )


@workflow
def scheduled_scoring(
    kickoff_time: datetime,
    model_prefix: str = "",
    dataset_template: str = "",
    label_column: str = "",
    max_parallel: int = 8,
    trusted_builders: list[str] = [],  # noqa: B006 - Flyte needs the literal default
) -> Scored:
    """batch_predict with the bundle last published under `model_prefix` (the one its LATEST names) on
    the partition named by the kickoff time, e.g. s3://bucket/events/dt={date}.parquet; a bundle of a
    user's model builder is scored where `trusted_builders` names it (set it in deploy/schedules.yaml)."""
    dataset = dataset_partition(template=dataset_template, kickoff_time=kickoff_time)
    return batch_predict(
        model=model_prefix, dataset=dataset, label_column=label_column, max_parallel=max_parallel,
        trusted_builders=trusted_builders,
    )  # fmt: skip


@dataclass(frozen=True)
class Scheduled:
    workflow: WorkflowBase
    cron: str  # UTC (deploy/flyte-binary-values.yaml sets the scheduler's time zone)
    required: tuple[str, ...]  # without these a run trains, scores or compares nothing of the user's
    # What runs instead when the file gives the plan a `tuning` section: a study, its best trial published.
    tuned: WorkflowBase | None = None

    def spec(self) -> PlanSpec:
        tuned = self.tuned.python_interface.inputs if self.tuned else None
        return PlanSpec(self.workflow.python_interface.inputs, self.required, tuned)

    def run(self, config: PlanConfig) -> tuple[WorkflowBase, dict[str, object]]:
        """The workflow the plan runs and the inputs the file sets: the study where it has a `tuning` section."""
        if config.tuning is None:
            return self.workflow, config.inputs
        return self.tuned, {**config.inputs, **config.tuning}


SCHEDULED = {
    # Every night at 02:00: train on yesterday's partition and publish the bundle; it becomes LATEST, which
    # nightly_scoring reads, where the promotion gate finds it not worse than the current one.
    # With a `tuning` section in the file, a study (docs/tuning.md#a-nightly-sweep) instead.
    "nightly_retrain": Scheduled(
        scheduled_training, "0 2 * * *", ("dataset_template", "publish_to"), tuned=scheduled_tuning
    ),
    # An hour later: whichever model is the latest published then scores the day's partition.
    "nightly_scoring": Scheduled(scheduled_scoring, "0 3 * * *", ("model_prefix", "dataset_template")),
    # Mondays at 04:00: is the TPU still the better deal for this model on this data?
    "weekly_hardware_comparison": Scheduled(scheduled_comparison, "0 4 * * 1", ("dataset_template",)),
}

SCHEDULES = load_schedules({name: plan.spec() for name, plan in SCHEDULED.items()})


def scheduled_launch_plan(name: str) -> LaunchPlan:
    """The launch plan with the file's inputs and notifications. `auto_activate` makes `pyflyte register`
    activate it as it registers it (flytekit/remote/remote.py, FlyteRemote.raw_register), so only a
    complete plan is activated; one with inputs missing carries no schedule, so activating it by hand
    cannot start runs that fail every night."""
    plan, config = SCHEDULED[name], SCHEDULES.plans[name]
    workflow, inputs = plan.run(config)
    if config.missing:
        print(
            f"{name}: defined without its schedule, so not activated on registration: "
            f"{SCHEDULES.source} leaves {SCHEDULES.unset_keys(name)} unset",
            file=sys.stderr,
        )
    return LaunchPlan.get_or_create(
        workflow=workflow,
        name=name,
        schedule=None if config.missing else CronSchedule(schedule=plan.cron, kickoff_time_input_arg=KICKOFF),
        default_inputs=inputs,
        notifications=SCHEDULES.notifications,
        auto_activate=not config.missing,
    )


nightly_retrain = scheduled_launch_plan("nightly_retrain")
nightly_scoring = scheduled_launch_plan("nightly_scoring")
weekly_hardware_comparison = scheduled_launch_plan("weekly_hardware_comparison")

if not SCHEDULES.notifications and any(not plan.missing for plan in SCHEDULES.plans.values()):
    print(
        f"scheduled launch plans: {SCHEDULES.source} names no one under 'notifications', so a failed "
        "scheduled run shows only in the Flyte console",
        file=sys.stderr,
    )
