"""Small CPU task for scheduled runs: turn the kickoff time into the dataset partition to read."""

from __future__ import annotations

from datetime import datetime

from flytekit import task

from tasks.core.partition import partition_uri
from tasks.hardware import CPU_IMAGE, EVALUATE_CPU, guaranteed

PLACEHOLDER_RULES = (
    "placeholders are {date} and {yesterday} (YYYY-MM-DD, no format spec) and {kickoff_time:<strftime "
    "format>}, e.g. 's3://bucket/dt={yesterday}/' or '/data/{kickoff_time:%Y/%m/%d}/'; write a literal "
    "brace as {{ or }}"
)


def fill_template(template: str, kickoff_time: datetime) -> str:
    """`partition_uri`, with str.format's own errors ({}, a bad format spec, a lone brace) turned
    into one naming the template and the placeholder rules."""
    try:
        return partition_uri(template, kickoff_time)
    except (IndexError, KeyError, ValueError, TypeError) as error:
        raise ValueError(
            f"input 'dataset_template' = '{template}' cannot be filled: {error}; {PLACEHOLDER_RULES}"
        ) from None


@task(container_image=CPU_IMAGE, **guaranteed(EVALUATE_CPU))
def dataset_partition(template: str, kickoff_time: datetime) -> str:
    uri = fill_template(template, kickoff_time)
    print(
        f"run kicked off at {kickoff_time.isoformat()} trains on: {uri or 'the embedded dataset'}", flush=True
    )
    return uri
