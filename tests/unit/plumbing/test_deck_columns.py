"""The data Deck's column table: what preprocessing decided for each input column."""

from __future__ import annotations

from tasks.core.data.assignment import SplitConfig
from tasks.core.data.prepare import prepare_dataset
from tasks.plumbing.decks import column_rows
from tests.unit.data.test_mixed_columns import messy_frame


def test_each_column_shows_its_kind_inputs_vocabulary_and_missing_values_or_why_it_was_left_out(tmp_path):
    path = str(tmp_path / "messy.parquet")
    messy_frame(csv=False).to_parquet(path, index=False)
    prepared = prepare_dataset(path, "species", str(tmp_path / "out"), SplitConfig(seed=0), {"f1": "drop"})
    rows = {row[0]: row[1:] for row in column_rows(prepared.table)}
    assert rows["colour"] == ["categorical", 5, 3, "yes", ""]  # red, green, blue, <other>, <missing>
    assert rows["member"] == ["boolean", 2, "", "yes", ""]
    assert rows["joined"][:2] == ["date", 4] and rows["joined"][3] == "yes"
    assert rows["f0"] == ["numeric", 1, "", "no", ""]
    for left_out in ("customer_id", "channel", "f1"):
        kind, inputs, _, _, why = rows[left_out]
        assert (kind, inputs) == ("left out", 0) and why, left_out
    assert sum(row[1] for row in rows.values()) == len(prepared.table.feature_names)


def test_a_table_prepared_before_encodings_lists_its_numeric_features():
    from tasks.core.data.prepare import PreparedTable
    from tasks.core.data.scaling import ScalerStats

    table = PreparedTable(
        ["a", "b"], "y", ["0", "1"], {"0": 1, "1": 1}, {"train": 2}, ScalerStats([0, 0], [1, 1])
    )
    assert column_rows(table) == [["a", "numeric", 1, "", "no", ""], ["b", "numeric", 1, "", "no", ""]]
