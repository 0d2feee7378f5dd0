"""What kind of feature each input column is, and its values in the one form each kind reads.

Kinds: numeric, categorical, boolean, date and text; `DROP` leaves a column out. `propose_kinds` proposes
a kind from each column's Arrow type (integer, float, decimal or all-null: numeric; text or dictionary,
which is how a pandas categorical arrives: categorical; bool: boolean; date32, date64 or a timestamp of
any unit, with a time zone or without: date), then applies the user's overrides (column -> kind or
'drop'). Text is declared, or chosen in place of a proposed category once the train rows' statistics
show free text (kind_records.py). Text whose every non-missing value in the first batch (`sample`) parses as an ISO date or
timestamp is proposed as a date: pyarrow's CSV reader already reads plain ISO columns as dates, but text
remains text where a file mixes zoned and naive timestamps, or where a parquet file holds dates as text.

Whatever type a batch brings a column in, `canonical` gives its values in one form per kind (each kind's
form and checks: kind_values.py), so the same rows encode alike from parquet, CSV or scoring input; a
refused value is named by column and row (`Place`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.core.data.columns import at_rows
from tasks.core.data.files import DatasetError
from tasks.core.data.kind_values import (
    BOOLEAN,
    CATEGORICAL,
    DATE,
    NUMERIC,
    VALUES,
    blank_as_null,
    is_instant,
    is_number,
    is_text,
    read_values,
    text_instants,
)
from tasks.core.messages import preview, shorten

DROP = "drop"
KINDS = tuple(VALUES)  # numeric, categorical, boolean, date, text: each kind's values in kind_values.py
FORCED_KINDS = (*KINDS, DROP)  # what the column_kinds input may give a column
WHAT = {kind: values.what for kind, values in VALUES.items()}
# The value types an override may read as each kind; its values are checked on the sample too.
ACCEPTS = {kind: values.accepts for kind, values in VALUES.items()}
MICROS_PER_DAY = 86_400_000_000


def month_of(micros: np.ndarray) -> np.ndarray:
    """The month of each instant (microseconds since 1970-01-01 UTC): 1 to 12. Looked up by day where the
    instants span fewer days than they number: numpy's calendar is slow an instant."""
    days = micros // MICROS_PER_DAY
    first, last = int(days.min(initial=0)), int(days.max(initial=0))
    if last - first >= len(days):
        return calendar_months(days)
    return calendar_months(np.arange(first, last + 1))[days - first]


def calendar_months(days: np.ndarray) -> np.ndarray:
    return days.astype("datetime64[D]").astype("datetime64[M]").astype(np.int64) % 12 + 1


def weekday_of(micros: np.ndarray) -> np.ndarray:
    """The day of the week of each instant: 0 = Monday ... 6 = Sunday (1970-01-01 was a Thursday)."""
    return (micros // MICROS_PER_DAY + 3) % 7


@dataclass(frozen=True)
class ColumnKind:
    kind: str  # one of KINDS, or DROP
    by_user: bool = False  # an override chose it: the identifier-like rule leaves such a column alone


@dataclass(frozen=True)
class Place:
    """Where a column's values come from, as errors name them: `first_row` is the batch's first row."""

    column: str
    first_row: int = 0
    source: str = ""

    def error(self, text: str) -> DatasetError:
        prefix = f"{self.source}: " if self.source else ""
        return DatasetError(f"{prefix}feature column {self.column!r} {text}")

    def not_a(self, kind: str, values: pa.Array, index: int) -> DatasetError:
        value = shorten(repr(values[index].as_py()))
        return self.error(
            f"is read as {kind} but holds {value} at row {self.first_row + index}, not {WHAT[kind]}"
        )

    def infinite(self, values: np.ndarray, infinite: np.ndarray) -> DatasetError:
        rows = self.first_row + np.flatnonzero(infinite)
        what = "an infinite value" if len(rows) == 1 else "infinite values"
        return self.error(f"has {what} ({values[infinite][0]}) {at_rows(rows)}; drop the rows or clip them")


def declared(kinds: Mapping[str, ColumnKind]) -> dict[str, str]:
    """The kinds the user gave (column -> kind or 'drop'): what `reading.open_dataset` reads a CSV by."""
    return {name: kind.kind for name, kind in kinds.items() if kind.by_user}


def value_type(kind: pa.DataType) -> pa.DataType:
    return kind.value_type if pa.types.is_dictionary(kind) else kind


def propose_kinds(
    schema: pa.Schema,
    features: list[str] | None = None,
    overrides: Mapping[str, str] | None = None,
    sample: pa.RecordBatch | pa.Table | None = None,
) -> dict[str, ColumnKind]:
    """Each feature column's kind (all of `schema`'s columns unless `features` names them), in order:
    from its type, or as `overrides` says; `sample` (the first batch) finds ISO dates held as text and
    checks that each override reads its values."""
    features = list(schema.names if features is None else features)
    overrides = dict(overrides or {})
    if problem := column_kind_problem(overrides):
        raise DatasetError(f"column_kinds = {overrides!r}: {problem}")
    unknown = [name for name in overrides if name not in features]
    if unknown:
        names = preview([repr(name) for name in unknown])
        raise DatasetError(f"column kinds are given for {names}, which are not feature columns of the data")
    kinds = {}
    for name in features:
        column = sample.column(name) if sample is not None else None
        arrow_type = schema.field(name).type
        if name in overrides:
            kinds[name] = ColumnKind(checked_override(name, overrides[name], arrow_type, column), True)
        else:
            kinds[name] = ColumnKind(kind_of_type(name, arrow_type, column))
    return kinds


def kind_of_type(name: str, arrow_type: pa.DataType, sample: pa.Array | None) -> str:
    if pa.types.is_dictionary(arrow_type):
        return CATEGORICAL
    if is_number(arrow_type) or pa.types.is_null(arrow_type):
        return NUMERIC
    if pa.types.is_boolean(arrow_type):
        return BOOLEAN
    if is_instant(arrow_type):
        return DATE
    if is_text(arrow_type):
        return DATE if sample is not None and all_iso_instants(sample) else CATEGORICAL
    raise DatasetError(
        f"feature column {name!r} has type {arrow_type}, which no feature kind reads; "
        f"mark it {DROP!r} or leave it out of the data"
    )


def all_iso_instants(column: pa.Array | pa.ChunkedArray) -> bool:
    """Text with at least one value, every one an ISO date or timestamp (each distinct one tried once)."""
    text = blank_as_null(column).drop_null()
    if not len(text):
        return False
    try:
        text_instants(pc.unique(text))
    except pa.ArrowInvalid:
        return False
    return True


def column_kind_problem(column_kinds: Mapping[str, str]) -> str:
    """The `column_kinds` input's rule: each column's kind is one of FORCED_KINDS. Whether the column
    exists and reads as that kind is for the data to say."""
    wrong = [f"{name!r}: {kind!r}" for name, kind in column_kinds.items() if kind not in FORCED_KINDS]
    if not wrong:
        return ""
    return f"{', '.join(wrong)}: not a kind; a column's kind is one of {', '.join(FORCED_KINDS)}"


def checked_override(name: str, kind: str, arrow_type: pa.DataType, sample: pa.Array | None) -> str:
    if kind == DROP:
        return DROP
    if not ACCEPTS[kind](value_type(arrow_type)):
        raise DatasetError(f"feature column {name!r} has type {arrow_type}, which cannot be read as {kind}")
    if sample is not None:
        canonical(kind, sample, Place(name))  # names the first value that is not of the kind
    return kind


def canonical(kind: str, column: pa.Array | pa.ChunkedArray, place: Place) -> np.ndarray | pa.Array:
    """A column's values in the form its kind reads (kind_values.py). A dictionary array of a kind that
    reads distinct values stays one (`KindValues.distinct`)."""
    distinct = VALUES[kind].distinct
    if distinct is not None and pa.types.is_dictionary(column.type) and isinstance(column, pa.Array):
        return distinct(column, place)
    return read_values(kind, column, place)


def read_as_dictionary(kind: str) -> bool:
    """Whether preprocessing reads a column of `kind` (or 'drop') as an Arrow dictionary."""
    return kind in VALUES and VALUES[kind].distinct is not None
