"""Small CPU task for scheduled runs: turn the kickoff time into the dataset partition to read."""

from __future__ import annotations

from datetime import datetime

from flytekit import task

from tasks.core.data.partition import partition_uri
from tasks.hardware import CPU_IMAGE, CPU_RETRIES, SMALL_CPU, guaranteed


@task(container_image=CPU_IMAGE, **guaranteed(SMALL_CPU), retries=CPU_RETRIES)
def dataset_partition(template: str, kickoff_time: datetime) -> str:
    uri = partition_uri(template, kickoff_time)
    print(
        f"run kicked off at {kickoff_time.isoformat()} trains on: {uri or 'the embedded dataset'}", flush=True
    )
    return uri
