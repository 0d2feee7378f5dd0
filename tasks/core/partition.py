"""Which data partition a scheduled run trains on, from the time the schedule fired."""

from __future__ import annotations

import string
from datetime import datetime, timedelta

FIELDS = ("date", "yesterday", "kickoff_time")


def partition_uri(template: str, kickoff_time: datetime) -> str:
    """Fill `template` for a run kicked off at `kickoff_time`.

    Fields: {date} (the kickoff day, YYYY-MM-DD), {yesterday} (the day before: a nightly run
    usually trains on the last complete day), and {kickoff_time:<strftime format>}.
    An empty template stays empty (the embedded dataset).
    """
    unknown = {name for _, name, _, _ in string.Formatter().parse(template) if name} - set(FIELDS)
    if unknown:
        raise ValueError(
            f"dataset template '{template}' has unknown fields {sorted(unknown)}; use {', '.join(FIELDS)}"
        )
    return template.format(
        date=kickoff_time.date().isoformat(),
        yesterday=(kickoff_time - timedelta(days=1)).date().isoformat(),
        kickoff_time=kickoff_time,
    )
