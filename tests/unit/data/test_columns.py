"""columns.py: which columns are features. A pandas index saved with the data is left out with a note
(and scoring reads past it), as is the nameless empty column of lines that end with a delimiter; a
column that may be a feature stays one. Each input file is left as it was."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tasks.core.bundle.table_input import arrow_features
from tests.conftest import blobs_frame
from tests.unit.data.tables import FEATURES, prepare_unchanged


def in_label_order(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows stored by class: an index saved with them would predict the class on its own."""
    return frame.sort_values("species")


def csv_written_twice(frame: pd.DataFrame, path: Path) -> None:
    """Read back and written again without the index: pandas names the old index 'Unnamed: 0'."""
    frame.to_csv(path)
    pd.read_csv(path).to_csv(path, index=False)


INDEX_COLUMNS: dict[str, tuple[str, Callable[[pd.DataFrame, Path], None], str]] = {
    "parquet, unnamed index": ("parquet", lambda f, p: f.to_parquet(p), "__index_level_0__"),
    "parquet, named index": (
        "parquet",
        lambda f, p: f.rename_axis("row_id").to_parquet(p),
        "row_id",
    ),
    "csv, to_csv's index": ("csv", lambda f, p: f.to_csv(p), ""),
    "csv, index read back": ("csv", csv_written_twice, "Unnamed: 0"),
    "csv, row labels": ("csv", lambda f, p: f.set_axis([f"r{i}" for i in f.index]).to_csv(p), ""),
}


@pytest.mark.parametrize("case", sorted(INDEX_COLUMNS))
def test_a_saved_index_is_left_out_of_the_features_with_a_note(tmp_path, case):
    suffix, write, column = INDEX_COLUMNS[case]
    path = tmp_path / f"data.{suffix}"
    write(in_label_order(blobs_frame()), path)
    prepared = prepare_unchanged(path, tmp_path)
    assert prepared.table.feature_names == FEATURES
    assert [note for note in prepared.table.notes if repr(column) in note and "left out" in note]


KEPT_COLUMNS = {
    "an unnamed first column with repeated values": lambda f: f.assign(**{"Unnamed: 0": np.arange(300) % 7}),
    "a named first column of row numbers": lambda f: f.assign(row=np.arange(300)),
}


@pytest.mark.parametrize("case", sorted(KEPT_COLUMNS))
def test_a_column_that_may_be_a_feature_stays_one(tmp_path, case):
    frame = KEPT_COLUMNS[case](blobs_frame())
    frame = frame[[frame.columns[-1], *frame.columns[:-1]]]  # the added column first
    path = tmp_path / "data.csv"
    frame.to_csv(path, index=False)
    prepared = prepare_unchanged(path, tmp_path)
    assert prepared.table.feature_names == [frame.columns[0], *FEATURES]
    assert prepared.table.notes == []


def test_a_range_index_is_not_stored_so_nothing_is_left_out(tmp_path):
    path = tmp_path / "data.parquet"
    blobs_frame().to_parquet(path)
    assert prepare_unchanged(path, tmp_path).table.notes == []


def test_scoring_rows_that_carry_their_index_reads_the_features_only():
    table = pa.Table.from_pandas(in_label_order(blobs_frame()))
    assert "__index_level_0__" in table.schema.names
    assert arrow_features(table, FEATURES, "rows").schema.names == FEATURES


def test_lines_ending_with_a_delimiter_leave_no_column(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text(blobs_frame().to_csv(index=False).replace("\n", ",\n"))
    prepared = prepare_unchanged(path, tmp_path)
    assert prepared.table.feature_names == FEATURES
    assert any("end with a delimiter" in note for note in prepared.table.notes)
