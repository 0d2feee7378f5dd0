"""What kind of feature each input column is, and its values in the one form each kind reads.

Kinds: numeric, categorical, boolean and date; `DROP` leaves a column out. `propose_kinds` proposes a
kind from each column's Arrow type (integer, float, decimal or all-null: numeric; text or dictionary,
which is how a pandas categorical arrives: categorical; bool: boolean; date32, date64 or a timestamp of
any unit, with a time zone or without: date), then applies the user's overrides (column -> kind or
'drop'). Text whose every non-missing value in the first batch (`sample`) parses as an ISO date or
timestamp is proposed as a date: pyarrow's CSV reader already reads plain ISO columns as dates, but text
remains text where a file mixes zoned and naive timestamps, or where a parquet file holds dates as text.

Whatever type a batch brings a column in, `canonical` gives its values in one form per kind, so the
same rows encode alike from parquet, CSV or scoring input:
- numeric: float64, NaN where missing (null or NaN); text must parse as numbers; an infinite value is
  refused by column and row.
- categorical: text, null where missing; integers as '3' (a float 3.0 too, as CSV reads integer codes),
  booleans as 'true'/'false'.
- boolean: float64 0/1, NaN where missing; numbers must be 0 or 1, text one of `TEXT_BOOLEANS` (any case).
- date: int64 microseconds since 1970-01-01 UTC, `MISSING_INSTANT` where missing. A timestamp with a time
  zone is an instant (Arrow stores it in UTC); a naive timestamp or a date is taken as UTC; ISO text with
  a zone offset ('Z', '+02:00') is converted to UTC, and text without one is taken as UTC.
An empty string is missing in every kind (an empty CSV cell in a text column).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.core.data.columns import at_rows
from tasks.core.data.files import DatasetError
from tasks.core.messages import preview, shorten

NUMERIC, CATEGORICAL, BOOLEAN, DATE, DROP = "numeric", "categorical", "boolean", "date", "drop"
KINDS = (NUMERIC, CATEGORICAL, BOOLEAN, DATE)
WHAT = {
    NUMERIC: "a number",
    CATEGORICAL: "a category",
    BOOLEAN: "a boolean (true/false, 1/0, yes/no)",
    DATE: "an ISO date or timestamp (e.g. 2024-01-31 or 2024-01-31T12:00:00+02:00)",
}
TEXT_BOOLEANS = ("false", "true", "0", "1", "no", "yes")  # a word's index modulo 2 is its truth
# A zone offset after a time of day: '...12:00Z', '...12:00:00.5+02:00'; a date's '-01' is not one.
ZONE_SUFFIX = r"(Z|\d\d:\d\d(:\d\d(\.\d*)?)?[+-]\d\d(:?\d\d)?)$"
MICROS_PER_DAY = 86_400_000_000
MICROS_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1}
MISSING_INSTANT = np.iinfo(np.int64).min


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


def declared(kinds: Mapping[str, ColumnKind]) -> dict[str, str]:
    """The kinds the user gave (column -> kind or 'drop'): what `reading.open_dataset` reads a CSV by."""
    return {name: kind.kind for name, kind in kinds.items() if kind.by_user}


def is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def is_number(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)


def is_instant(kind: pa.DataType) -> bool:
    return pa.types.is_date(kind) or pa.types.is_timestamp(kind)


# The value types an override may read as each kind; its values are checked on the sample too.
ACCEPTS: dict[str, Callable[[pa.DataType], bool]] = {
    NUMERIC: lambda t: is_number(t) or pa.types.is_boolean(t) or is_text(t) or pa.types.is_null(t),
    CATEGORICAL: lambda t: is_number(t) or pa.types.is_boolean(t) or is_text(t) or pa.types.is_null(t),
    BOOLEAN: lambda t: is_number(t) or pa.types.is_boolean(t) or is_text(t) or pa.types.is_null(t),
    DATE: lambda t: is_instant(t) or is_text(t) or pa.types.is_null(t),
}


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


def checked_override(name: str, kind: str, arrow_type: pa.DataType, sample: pa.Array | None) -> str:
    if kind == DROP:
        return DROP
    if kind not in KINDS:
        raise DatasetError(
            f"column {name!r} is marked {kind!r}, not a kind; use one of {', '.join(KINDS)} or {DROP!r}"
        )
    if not ACCEPTS[kind](value_type(arrow_type)):
        raise DatasetError(f"feature column {name!r} has type {arrow_type}, which cannot be read as {kind}")
    if sample is not None:
        canonical(kind, sample, Place(name))  # names the first value that is not of the kind
    return kind


def canonical(kind: str, column: pa.Array | pa.ChunkedArray, place: Place) -> np.ndarray | pa.Array:
    """A column's values in the form its kind reads (see the module's docstring). A dictionary array read
    as categories stays one (`distinct_categories`)."""
    if pa.types.is_dictionary(column.type):
        if kind == CATEGORICAL and isinstance(column, pa.Array):
            return distinct_categories(column, place)
        column = pc.cast(column, column.type.value_type)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if is_text(column.type):
        column = blank_as_null(column)
    return CONVERTERS[kind](column, place)


def distinct_categories(column: pa.DictionaryArray, place: Place) -> pa.DictionaryArray:
    """A dictionary array's categories as `canonical` reads them from text, each distinct value read once:
    a dictionary of distinct texts, none null (a missing value is a null index)."""
    values = canonical(CATEGORICAL, column.dictionary, place)
    if not values.null_count and len(pc.unique(values)) == len(values):  # a parquet page's dictionary
        return pa.DictionaryArray.from_arrays(column.indices, values)
    distinct = pc.dictionary_encode(values)
    return pa.DictionaryArray.from_arrays(pc.take(distinct.indices, column.indices), distinct.dictionary)


def category_indices(categories: pa.DictionaryArray) -> np.ndarray:
    """Each value's place in the dictionary of `distinct_categories`, -1 where missing."""
    indices = pc.cast(categories.indices, pa.int64())  # an unsigned or narrow type cannot hold -1
    return indices.fill_null(-1).to_numpy(zero_copy_only=False)


def blank_as_null(text: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    text = pc.cast(text, pa.string())
    return null_where(pc.equal(text, ""), text)


def null_where(mask: pa.Array, values: pa.Array) -> pa.Array:
    return pc.if_else(mask, pa.scalar(None, values.type), values)


def as_numbers(column: pa.Array, place: Place) -> np.ndarray:
    if is_text(column.type):
        column = cast_text(pc.utf8_trim_whitespace(column), pa.float64(), NUMERIC, place)
    # Unsafe: an integer beyond 2**53 rounds to the nearest float64, as numpy casts it, where a safe
    # cast refuses it with no column named.
    values = pc.cast(column, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
    infinite = np.isinf(values)
    if infinite.any():
        rows = place.first_row + np.flatnonzero(infinite)
        what = "an infinite value" if len(rows) == 1 else "infinite values"
        raise place.error(f"has {what} ({values[infinite][0]}) {at_rows(rows)}; drop the rows or clip them")
    return values


def cast_text(text: pa.Array, target: pa.DataType, kind: str, place: Place) -> pa.Array:
    try:
        return pc.cast(text, target)
    except pa.ArrowInvalid:
        raise place.not_a(kind, text, first_failing(text, lambda one: pc.cast(one, target))) from None


def first_failing(values: pa.Array, parse: Callable[[pa.Array], object]) -> int:
    """The first value `parse` refuses, tried one at a time: only once a whole batch was refused."""
    for index in range(len(values)):
        try:
            parse(values.slice(index, 1))
        except pa.ArrowInvalid:
            return index
    return 0


def as_categories(column: pa.Array, place: Place) -> pa.Array:
    if pa.types.is_floating(column.type):
        column = pc.add(column, pa.scalar(0.0, column.type))  # -0.0 as 0.0: the same category
        column = null_where(pc.is_nan(column), column)
    return pc.cast(column, pa.string())


def as_booleans(column: pa.Array, place: Place) -> np.ndarray:
    if is_text(column.type):
        words = pc.utf8_lower(pc.utf8_trim_whitespace(column))
        index = pc.index_in(words, value_set=pa.array(TEXT_BOOLEANS))
        unknown = np.flatnonzero(
            pc.and_(pc.is_valid(words), pc.is_null(index)).to_numpy(zero_copy_only=False)
        )
        if len(unknown):
            raise place.not_a(BOOLEAN, column, int(unknown[0]))
        return index.to_numpy(zero_copy_only=False) % 2
    values = pc.cast(column, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
    other = np.flatnonzero(~np.isnan(values) & (values != 0) & (values != 1))
    if len(other):
        raise place.not_a(BOOLEAN, column, int(other[0]))
    return values


def as_instants(column: pa.Array, place: Place) -> np.ndarray:
    if is_text(column.type):
        try:
            column = text_instants(column)
        except pa.ArrowInvalid:
            raise place.not_a(DATE, column, first_failing(column, text_instants)) from None
    elif pa.types.is_null(column.type):
        column = pa.nulls(len(column), pa.timestamp("us"))
    return instant_micros(column)


def instant_micros(column: pa.Array) -> np.ndarray:
    """A date or timestamp column as int64 microseconds: a zoned timestamp's storage is UTC already."""
    if pa.types.is_date32(column.type):
        column = pc.cast(column, pa.date64())
    unit = "ms" if pa.types.is_date64(column.type) else column.type.unit
    stored = pc.fill_null(pc.cast(column, pa.int64()), 0).to_numpy(zero_copy_only=False)
    micros = stored // 1_000 if unit == "ns" else stored * MICROS_PER_UNIT[unit]
    return np.where(pc.is_null(column).to_numpy(zero_copy_only=False), MISSING_INSTANT, micros)


def text_instants(text: pa.Array) -> pa.Array:
    """ISO text as naive timestamps in UTC: zoned values converted, naive ones taken as UTC."""
    text = pc.utf8_trim_whitespace(text)
    zoned = pc.match_substring_regex(text, ZONE_SUFFIX)
    naive = pc.cast(null_where(zoned, text), pa.timestamp("us"))
    utc = pc.cast(null_where(pc.invert(zoned), text), pa.timestamp("us", tz="UTC"))
    return pc.coalesce(naive, pc.cast(utc, pa.timestamp("us")))


CONVERTERS: dict[str, Callable[[pa.Array, Place], np.ndarray | pa.Array]] = {
    NUMERIC: as_numbers,
    CATEGORICAL: as_categories,
    BOOLEAN: as_booleans,
    DATE: as_instants,
}
