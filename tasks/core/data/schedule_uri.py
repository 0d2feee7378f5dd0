"""The dataset URI a scheduled run reads: its `dataset_template` filled from the time the schedule fired."""

from __future__ import annotations

import string
from datetime import datetime, timedelta

FIELDS = ("date", "yesterday", "kickoff_time")


PLACEHOLDER_RULES = (
    "placeholders are {date} and {yesterday} (YYYY-MM-DD, no format spec) and {kickoff_time:<strftime "
    "format>}, e.g. 's3://bucket/dt={yesterday}/' or '/data/{kickoff_time:%Y/%m/%d}/'; write a literal "
    "brace as {{ or }}"
)


def partition_uri(template: str, kickoff_time: datetime) -> str:
    """Fill `template` for a run kicked off at `kickoff_time`.

    Fields: {date} (the kickoff day, YYYY-MM-DD), {yesterday} (the day before: a nightly run
    usually trains on the last complete day), and {kickoff_time:<strftime format>}.
    An empty template stays empty (the embedded dataset). A template that cannot be filled (an
    unknown field, `{}`, a bad format spec, a lone brace) is refused naming it and the rules.
    """
    try:
        return fill(template, kickoff_time)
    except (IndexError, KeyError, ValueError, TypeError) as error:
        raise ValueError(
            f"input 'dataset_template' = '{template}' cannot be filled: {error}; {PLACEHOLDER_RULES}"
        ) from None


def fill(template: str, kickoff_time: datetime) -> str:
    unknown = {name for _, name, _, _ in string.Formatter().parse(template) if name} - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    return template.format(
        date=kickoff_time.date().isoformat(),
        yesterday=(kickoff_time - timedelta(days=1)).date().isoformat(),
        kickoff_time=kickoff_time,
    )
