"""unseen.py: category values the model's vocabulary lacks, counted by column over the pieces of the
rows to score; a note where most of a column's values are unknown to the model."""

from __future__ import annotations

import pyarrow as pa

from tasks.core.data.unseen import UnseenCategories, merged_unseen
from tests.unit.data.tables import fit

ZIPS = ["00123", "01234", "10115"]


def zip_encoding():
    return fit(pa.table({"zip": ZIPS * 20, "n": list(range(60))}), {"zip": "categorical"})


def test_zips_given_as_numbers_are_named_as_mostly_unknown():
    encoding = zip_encoding()
    parts = [
        UnseenCategories.of(encoding, pa.record_batch({"zip": [123, 1234, None], "n": [1, 2, 3]})),
        UnseenCategories.of(encoding, pa.record_batch({"zip": [10115, 123, 123], "n": [1, 2, 3]})),
    ]
    unseen = merged_unseen([*parts, None])
    assert unseen.counts == {"zip": [5, 4]}
    (note,) = unseen.notes()
    assert note.startswith("column 'zip': 4 of its 5 values (80%) are none the model was trained on")
    assert "'123'" in note and "'1234'" in note and "zip=<other>" in note


def test_values_training_saw_give_no_note():
    encoding = zip_encoding()
    known = UnseenCategories.of(
        encoding, pa.record_batch({"zip": ["00123", "01234", "99999"], "n": [1, 2, 3]})
    )
    assert known.counts == {"zip": [3, 1]} and known.notes() == []
    assert UnseenCategories.of(None, pa.record_batch({"zip": ["1"]})).notes() == []
