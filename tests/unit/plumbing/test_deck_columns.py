"""The data Deck's column table: what preprocessing decided for each input column."""

from __future__ import annotations

from tasks.core.data.assignment import SplitConfig
from tasks.core.data.prepare import prepare_dataset
from tasks.plumbing.decks import column_rows
from tests.unit.data.tables import messy_frame


def test_each_column_shows_its_kind_inputs_vocabulary_and_missing_values_or_why_it_was_left_out(tmp_path):
    path = str(tmp_path / "messy.parquet")
    messy_frame(csv=False).to_parquet(path, index=False)
    prepared = prepare_dataset(path, "species", str(tmp_path / "out"), SplitConfig(seed=0), {"f1": "drop"})
    rows = {row[0]: row[1:] for row in column_rows(prepared.table)}
    assert rows["colour"][:3] == ["categorical", 5, 3]  # red, green, blue, <other>, <missing>
    assert rows["member"][:3] == ["boolean", 2, ""]
    assert rows["joined"][:2] == ["date", 4]
    for gappy in ("colour", "member", "joined"):
        assert rows[gappy][3] != "0.0%" and rows[gappy][3].endswith("%"), gappy
    assert rows["f0"] == ["numeric", 1, "", "0.0%", ""]
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
    assert column_rows(table) == [["a", "numeric", 1, "", "0.0%", ""], ["b", "numeric", 1, "", "0.0%", ""]]


def test_the_missing_share_is_of_the_train_rows_and_survives_the_manifest():
    import pyarrow as pa

    from tasks.core.data.column_kinds import ColumnKind
    from tasks.core.data.encoding import FittedEncoding, batch_stats

    batch = pa.table({"x": [1.0, None, 3.0, None, 5.0, 6.0, 7.0, 8.0], "c": ["a", "b", None, "a"] * 2})
    kinds = {"x": ColumnKind("numeric"), "c": ColumnKind("categorical")}
    keep = [True] * 6 + [False] * 2  # the last two rows are not train rows
    encoding = batch_stats(kinds, batch, keep=pa.array(keep).to_numpy(zero_copy_only=False)).fit()
    shares = {column.name: column.missing_share for column in encoding.columns}
    assert shares == {"x": 2 / 6, "c": 1 / 6}
    loaded = FittedEncoding.from_dict(encoding.to_dict())
    assert {column.name: column.missing_share for column in loaded.columns} == shares
    assert loaded.encoded_names() == encoding.encoded_names()
