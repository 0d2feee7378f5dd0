"""Scheduled launch plans; they register together with the workflows (`pyflyte register workflows`)."""

from __future__ import annotations

from datetime import datetime

from flytekit import CronSchedule, LaunchPlan, workflow

from tasks.core.config import TrainConfig
from tasks.schedule import dataset_partition
from tasks.score import Scored
from workflows.comparison import hardware_comparison
from workflows.pipeline import TrainingOutputs, training_pipeline
from workflows.scoring import batch_predict


@workflow
def scheduled_training(
    kickoff_time: datetime,
    dataset_template: str = "",
    label_column: str = "label",
    target: str = "gpu",
    hyperparameters: TrainConfig = TrainConfig(),  # noqa: B008 - Flyte needs the literal default
    publish_to: str = "",
) -> TrainingOutputs:
    """training_pipeline on the partition named by the kickoff time, e.g. s3://bucket/events/dt={yesterday}/;
    with `publish_to`, the bundle becomes that prefix's LATEST, which nightly_scoring reads."""
    dataset = dataset_partition(template=dataset_template, kickoff_time=kickoff_time)
    return training_pipeline(
        dataset=dataset, label_column=label_column, target=target, hyperparameters=hyperparameters,
        publish_to=publish_to,
    )  # fmt: skip


# Every night at 02:00 UTC; the schedule passes its fire time in as `kickoff_time`.
nightly_retrain = LaunchPlan.get_or_create(
    workflow=scheduled_training,
    name="nightly_retrain",
    schedule=CronSchedule(schedule="0 2 * * *", kickoff_time_input_arg="kickoff_time"),
    default_inputs={
        "dataset_template": "",
        "label_column": "label",
        "hyperparameters": TrainConfig(),
        "publish_to": "",
    },
    fixed_inputs={"target": "gpu"},
)

# Mondays at 04:00 UTC: is the TPU still the better deal for this model?
weekly_hardware_comparison = LaunchPlan.get_or_create(
    workflow=hardware_comparison,
    name="weekly_hardware_comparison",
    schedule=CronSchedule(schedule="0 4 * * 1"),
    default_inputs={"hyperparameters": TrainConfig()},
)


@workflow
def scheduled_scoring(
    kickoff_time: datetime,
    model_prefix: str = "",
    dataset_template: str = "",
    label_column: str = "",
    max_parallel: int = 8,
) -> Scored:
    """batch_predict with the bundle last published under `model_prefix` (the one its LATEST names) on
    the partition named by the kickoff time, e.g. s3://bucket/events/dt={date}.parquet."""
    dataset = dataset_partition(template=dataset_template, kickoff_time=kickoff_time)
    return batch_predict(
        model=model_prefix, dataset=dataset, label_column=label_column, max_parallel=max_parallel
    )


# Every night at 03:00 UTC, after nightly_retrain has had an hour: whichever model is the latest
# published then scores the day's partition.
nightly_scoring = LaunchPlan.get_or_create(
    workflow=scheduled_scoring,
    name="nightly_scoring",
    schedule=CronSchedule(schedule="0 3 * * *", kickoff_time_input_arg="kickoff_time"),
)
