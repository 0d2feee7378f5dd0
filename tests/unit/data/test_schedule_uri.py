"""schedule_uri.py: the data partition a scheduled run trains on, filled from the dataset template; a
template that cannot be filled is refused naming it and the placeholders."""

from __future__ import annotations

from datetime import datetime

import pytest

from tasks.core.data.schedule_uri import partition_uri

# template -> what str.format said, which the message keeps beside the template and the rules
TEMPLATE_CASES = {
    "empty placeholder": ("s3://b/dt={}/", "Replacement index 0"),
    "format spec on a date string": ("s3://b/{date:%Y}/", "Invalid format specifier"),
    "lone brace": ("s3://b/{date", "expected '}'"),
    "unknown conversion": ("s3://b/{date!z}/", "Unknown conversion specifier"),
    "unknown field": ("s3://b/{day}/", "unknown fields ['day']"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(TEMPLATE_CASES))
def test_a_template_that_cannot_be_filled_is_refused_naming_it_and_the_placeholders(case):
    template, cause = TEMPLATE_CASES[case]
    with pytest.raises(ValueError) as error:
        partition_uri(template, datetime(2026, 11, 22))
    message = str(error.value)
    assert f"input 'dataset_template' = '{template}' cannot be filled" in message and cause in message, (
        message
    )
    assert "{kickoff_time:<strftime format>}" in message and "{{ or }}" in message


def test_a_template_with_escaped_braces_and_a_date_format_fills():
    filled = partition_uri("s3://b/{{raw}}/{kickoff_time:%Y/%m}/{yesterday}", datetime(2026, 11, 22))
    assert filled == "s3://b/{raw}/2026/11/2026-11-21"
