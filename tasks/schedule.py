"""Small CPU tasks for scheduled runs: turn the kickoff time into the dataset partition to read."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from flytekit import task

from tasks.core.data.config import DataConfig
from tasks.core.data.schedule_uri import partition_uri
from tasks.hardware import CPU_IMAGE, CPU_RETRIES, SMALL_CPU, guaranteed


def announced_partition(template: str, kickoff_time: datetime) -> str:
    uri = partition_uri(template, kickoff_time)
    print(
        f"run kicked off at {kickoff_time.isoformat()} trains on: {uri or 'the embedded dataset'}", flush=True
    )
    return uri


@task(container_image=CPU_IMAGE, **guaranteed(SMALL_CPU), retries=CPU_RETRIES)
def dataset_partition(template: str, kickoff_time: datetime) -> str:
    return announced_partition(template, kickoff_time)


@task(container_image=CPU_IMAGE, **guaranteed(SMALL_CPU), retries=CPU_RETRIES)
def data_partition(template: str, data: DataConfig, kickoff_time: datetime) -> DataConfig:
    """`data` on the partition of `template` for the kickoff time."""
    return replace(data, dataset=announced_partition(template, kickoff_time))
