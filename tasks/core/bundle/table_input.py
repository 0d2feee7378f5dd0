"""Rows given to a model: a table's columns as arrow, a missing one refused by name, and the bundle's
errors. Below the bundle and its exports, which both read rows through here."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from tasks.core.data.api import DatasetError
from tasks.core.messages import one_line, preview

Table = Any  # a pandas DataFrame, a pyarrow Table or a pyarrow RecordBatch


class BundleError(ValueError):
    """A model bundle that cannot be written or read, or a table without the features it needs; the
    message names the bundle or the table and what is wrong."""


class MissingColumns(BundleError, DatasetError):
    """A table without a column the model reads: refused by the bundle (a BundleError), and input that
    cannot be read as the model needs it (a DatasetError, as every other such input is)."""


def arrow_features(
    table: Table, columns: list[str], source: str, encoded: bool = False
) -> pa.Table | pa.RecordBatch:
    """The `columns` of `table`, as arrow; a missing one refused by name. `encoded`: the columns are
    raw columns that an encoding reads, not numeric features."""
    if isinstance(table, pa.Table | pa.RecordBatch):
        check_present(table.schema.names, columns, source, encoded)
        return table.select(columns)
    import pandas as pd

    if not isinstance(table, pd.DataFrame):
        raise TypeError(
            f"{source}: cannot score a {type(table).__name__}; "
            "pass a pandas DataFrame, a pyarrow Table or a pyarrow RecordBatch"
        )
    check_present(list(table.columns), columns, source, encoded)
    try:
        return pa.Table.from_pandas(table, columns=columns, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:  # e.g. numbers and text in one column
        what = "mixes types Arrow cannot hold in one column" if encoded else "is not numbers"
        raise DatasetError(f"{source}: a feature column {what}: {one_line(error)}") from error


def check_present(present: list[str], wanted: list[str], source: str, encoded: bool = False) -> None:
    missing = [name for name in wanted if name not in present]
    if missing:
        what = "column" if len(missing) == 1 else f"{len(missing)} columns"
        reads = "columns" if encoded else "features"
        raise MissingColumns(
            f"{source}: missing feature {what} {preview([repr(name) for name in missing])}; the model "
            f"reads {len(wanted)} {reads} by name: {preview(wanted)}"
        )
