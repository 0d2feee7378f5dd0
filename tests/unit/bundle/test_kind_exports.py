"""Every column kind is whole: its values (kind_values.py), its preprocessing record (kind_records.py) and
its part of the exports (kind_exports.py). A kind added to one table and not the others fails here."""

from __future__ import annotations

from tasks.core.bundle.kind_exports import EXPORTS
from tasks.core.data.column_kinds import KINDS
from tasks.core.data.kind_records import RECORDS
from tasks.core.data.kind_values import VALUES


def test_every_kind_has_its_values_its_preprocessing_and_its_exports():
    assert list(VALUES) == list(RECORDS) == list(EXPORTS) == list(KINDS)


def test_each_record_is_filed_under_its_own_kind():
    for kind in KINDS:
        assert VALUES[kind].name == RECORDS[kind].name == EXPORTS[kind].name == kind
        assert RECORDS[kind].values is VALUES[kind]


def test_each_input_is_text_or_float64():
    """What the exports' inputs, the SavedModel's signature and the MLflow loader send."""
    assert {values.feed_type for values in VALUES.values()} <= {"string", "float64"}
