"""Which columns are features; and the rules for features read as plain numbers (a model bundle without
an encoding), where every value must be a finite number."""

from __future__ import annotations

import re
from collections.abc import Collection

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from tasks.core.data.files import DatasetError
from tasks.core.data.reading import is_number, iter_batches
from tasks.core.messages import preview

FIRST_ROWS = 5  # of a feature's bad values, the rows an error lists
# A header cell left empty: read as '' by pyarrow, or as 'Unnamed: 0' when pandas wrote it back.
UNNAMED_COLUMN = re.compile(r"|Unnamed: \d+")


def pandas_index_columns(dataset: ds.Dataset) -> list[str]:
    """The columns a parquet file's pandas metadata names as the saved index (a RangeIndex is
    stored as metadata only, so it names no column)."""
    if not isinstance(dataset.format, ds.ParquetFileFormat):
        return []
    fragment = next(dataset.get_fragments(), None)
    metadata = (fragment.physical_schema.pandas_metadata if fragment else None) or {}
    return [name for name in metadata.get("index_columns", []) if isinstance(name, str)]


def unnamed_column_notes(dataset: ds.Dataset, uri: str, names: list[str]) -> dict[str, str]:
    """Unnamed columns that are not features: all empty (lines that end with a delimiter), or the
    first column with a distinct value in every row (the row index `to_csv` writes by default)."""
    chunks: dict[str, list[pa.Array]] = {name: [] for name in names}
    for batch in iter_batches(dataset, uri, columns=names):
        for name in names:
            chunks[name].append(batch.column(name))
    notes = {}
    for name in names:
        column = pa.chunked_array(chunks[name], type=dataset.schema.field(name).type)
        if column.null_count == len(column):
            notes[name] = (
                f"column {name!r} has no name and no values (the lines end with a delimiter); "
                "it is left out of the features"
            )
        elif name == dataset.schema.names[0] and is_row_label(column):
            notes[name] = (
                f"column {name!r} looks like a row index saved with the data (an unnamed first column "
                "with a distinct value in every row); it is left out of the features. Write the file "
                "with index=False, or name the column if it is a feature"
            )
    return notes


def is_row_label(column: pa.ChunkedArray) -> bool:
    return column.null_count == 0 and pc.count_distinct(column).as_py() == len(column)


def non_feature_columns(dataset: ds.Dataset, uri: str, label_column: str) -> dict[str, str]:
    """Columns that are not features, each with the note that says why: a pandas index saved with
    the data would predict the class wherever rows are stored in label order."""
    notes = {
        name: (
            f"column {name!r} is the pandas index saved with the data (the file's pandas metadata says "
            "so); it is left out of the features"
        )
        for name in pandas_index_columns(dataset)
    }
    unnamed = [n for n in dataset.schema.names if UNNAMED_COLUMN.fullmatch(n) and n not in notes]
    if unnamed:
        notes.update(unnamed_column_notes(dataset, uri, unnamed))
    notes.pop(label_column, None)
    return notes


def feature_columns(
    schema: pa.Schema, label_column: str, uri: str, left_out: Collection[str] = ()
) -> list[str]:
    """All columns except the label and those `left_out`: their kinds are proposed next (column_kinds.py)."""
    if label_column not in schema.names:
        raise DatasetError(
            f"{uri}: label column '{label_column}' not found in the {len(schema.names):,} columns: "
            f"{preview(schema.names)}"
        )
    features = [name for name in schema.names if name != label_column and name not in left_out]
    if not features:
        raise DatasetError(f"{uri}: no feature columns besides the label column '{label_column}'")
    return features


def check_numeric(schema: pa.Schema, features: list[str], uri: str, fix: str) -> None:
    """Features are integers, floats, decimals or booleans; `fix` says what to do about any other type."""
    for name in features:
        kind = schema.field(name).type
        if not is_number(kind):
            raise DatasetError(f"{uri}: feature column '{name}' has type {kind}, not a number; {fix}")


def check_finite(batch: pa.RecordBatch | pa.Table, features: list[str], first_row: int, uri: str) -> None:
    """No missing or non-finite feature value; an error names the column and its first bad rows."""
    for name in features:
        column = batch.column(name)
        if column.null_count:
            rows = first_row + bad_rows(pc.is_null(column))
            what = "a missing value" if len(rows) == 1 else "missing values"
            raise DatasetError(f"{uri}: feature column '{name}' has {what} (NaN/null) {at_rows(rows)}")
        if pa.types.is_floating(column.type):
            bad = pc.invert(pc.is_finite(column))
            if pc.any(bad).as_py():
                rows = first_row + bad_rows(bad)
                value = column[int(rows[0]) - first_row].as_py()
                what = (
                    f"a non-finite value {value}" if len(rows) == 1 else f"non-finite values (first {value})"
                )
                raise DatasetError(f"{uri}: feature column '{name}' has {what} {at_rows(rows)}")


def bad_rows(mask: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return pc.indices_nonzero(mask).to_numpy().astype(np.int64)


def at_rows(rows: np.ndarray) -> str:
    if len(rows) == 1:
        return f"at row {rows[0]}"
    more = ", ..." if len(rows) > FIRST_ROWS else ""
    return f"at rows {', '.join(map(str, rows[:FIRST_ROWS]))}{more}"
