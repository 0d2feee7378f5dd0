"""The kinds' records: one per kind, the data layer's part of them (the exports' part:
tests/unit/bundle/test_kind_exports.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tasks.core.data.column_kinds import KINDS, Place, canonical, read_as_dictionary
from tasks.core.data.kind_records import RECORDS
from tasks.core.data.kind_values import CATEGORICAL, VALUES


def test_preprocessing_has_a_record_for_every_kind_read():
    assert list(RECORDS) == list(VALUES) == list(KINDS)


# A column of each kind, as text with a gap: what every kind reads.
SAMPLES = {"numeric": ["1", "0", None], "categorical": ["1", "0", None], "boolean": ["1", "0", None],
           "date": ["2024-01-31", None, ""], "text": ["a b", "", None]}  # fmt: skip


def test_empty_statistics_merge_with_a_batch_s_to_the_batch_s():
    """Each record's statistics start empty and merge, as a split run adds up its pieces."""
    assert list(SAMPLES) == list(RECORDS)
    for kind, record in RECORDS.items():
        stats = record.stats_of(canonical(kind, pa.array(SAMPLES[kind]), Place("c")), 10)
        assert isinstance(stats, record.stats)
        assert record.empty_stats(10).merge(stats) == stats


def test_only_categories_are_read_as_dictionaries_and_stored_as_codes():
    assert [kind for kind in KINDS if read_as_dictionary(kind)] == [CATEGORICAL]
    assert [kind for kind, record in RECORDS.items() if record.coded] == [CATEGORICAL]
    assert not read_as_dictionary("drop")


def test_the_deck_names_a_vocabulary_for_categories_and_text_only():
    fitted = {
        kind: record.fit(record.stats_of(canonical(kind, pa.array(["1", "0"]), Place("c")), 10), 5)
        for kind, record in RECORDS.items()
        if kind != "date"
    }
    assert {kind: RECORDS[kind].deck_vocabulary(encoder) for kind, encoder in fitted.items()} == {
        "numeric": "",
        "categorical": 2,
        "boolean": "",
        "text": 2,
    }
    assert np.isclose(fitted["boolean"].fill, 0.5)
