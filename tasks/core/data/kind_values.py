"""Each column kind's values: how a column of any Arrow type is read as the kind, and how the values are
sent to a bundle's exports. One `KindValues` record per kind, in `VALUES`.

It imports numpy and pyarrow only, never this project: the bundle's MLflow model ships it beside its
loader (mlflow_pyfunc.py), so preprocessing, the bundle and a server with only the MLflow model folder
read a value alike. Whoever reads names the refused value through a `Where` of its own: the data layer
as `DatasetError`s with the source and row (column_kinds.Place), the MLflow loader as ValueErrors.

`read_values` gives a column's values in the one form each kind reads:
- numeric: float64, NaN where missing (null or NaN); text must parse as numbers; an infinite value is
  refused.
- categorical: text, null where missing; integers as '3' (a whole float below 2**63 too: 3.0 as '3',
  4006381333905.0 as '4006381333905', as CSV and pandas read integer codes with a gap), booleans as
  'true'/'false'.
- boolean: float64 0/1, NaN where missing; numbers must be 0 or 1, text one of `TEXT_BOOLEANS` (any case)
  or, for missing, one of pyarrow's CSV null tokens (`NULL_TOKENS`: 'NA', 'null', 'NaN', ...), as dates.
- date: int64 microseconds since 1970-01-01 UTC, `MISSING_INSTANT` where missing. A timestamp with a time
  zone is an instant (Arrow stores it in UTC); a naive timestamp or a date is taken as UTC; ISO text with
  a zone offset ('Z', '+02:00') is converted to UTC, and text without one is taken as UTC.
- text: text, null where missing, from text columns alone (free text whose words the encoding counts).
An empty string is missing in every kind (an empty CSV cell in a text column). A kind's `feed` turns
those values into the exports' input, `[rows, 1]`: text ('' where missing) or float64 (NaN where missing;
a date as seconds since 1970 UTC).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

NUMERIC, CATEGORICAL, BOOLEAN, DATE, TEXT = "numeric", "categorical", "boolean", "date", "text"
TEXT_BOOLEANS = ("false", "true", "0", "1", "no", "yes")  # a word's index modulo 2 is its truth
# A zone offset after a time of day: '...12:00Z', '...12:00:00.5+02:00'; a date's '-01' is not one.
ZONE_SUFFIX = r"(Z|\d\d:\d\d(:\d\d(\.\d*)?)?[+-]\d\d(:?\d\d)?)$"
MICROS_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1}
MICROS_PER_SECOND = 1_000_000
MISSING_INSTANT = np.iinfo(np.int64).min
# What pyarrow's CSV reader takes for missing in a typed column ('NA', 'null', 'NaN', ...): a boolean
# or date read from text takes them so too, as it would typed.
NULL_TOKENS = pa.array(pa_csv.ConvertOptions().null_values, pa.string())


class Where(Protocol):
    """Where a column's values come from, as the errors of whoever reads them name it."""

    def not_a(self, kind: str, values: pa.Array, index: int) -> Exception: ...

    def infinite(self, values: np.ndarray, infinite: np.ndarray) -> Exception: ...


def is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def is_number(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)


def is_instant(kind: pa.DataType) -> bool:
    return pa.types.is_date(kind) or pa.types.is_timestamp(kind)


def is_text_or_null(kind: pa.DataType) -> bool:
    """What text may be read from: a column of free text has no other type."""
    return is_text(kind) or pa.types.is_null(kind)


def is_plain(kind: pa.DataType) -> bool:
    """What numbers, categories and booleans may be read from."""
    return is_number(kind) or pa.types.is_boolean(kind) or is_text(kind) or pa.types.is_null(kind)


def read_values(kind: str, column: pa.Array | pa.ChunkedArray, where: Where) -> np.ndarray | pa.Array:
    """A column's values in the form its kind reads (see the module's docstring)."""
    if pa.types.is_dictionary(column.type):
        column = pc.cast(column, column.type.value_type)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if is_text(column.type):
        column = blank_as_null(column)
    return VALUES[kind].read(column, where)


def blank_as_null(text: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    text = pc.cast(text, pa.string())
    return null_where(pc.equal(text, ""), text)


def null_where(mask: pa.Array, values: pa.Array) -> pa.Array:
    return pc.if_else(mask, pa.scalar(None, values.type), values)


def first_failing(values: pa.Array, parse: Callable[[pa.Array], object]) -> int:
    """The first value `parse` refuses, tried one at a time: only once a whole batch was refused."""
    for index in range(len(values)):
        try:
            parse(values.slice(index, 1))
        except pa.ArrowInvalid:
            return index
    return 0


def as_numbers(column: pa.Array, where: Where) -> np.ndarray:
    if is_text(column.type):
        text = pc.utf8_trim_whitespace(column)
        try:
            column = pc.cast(text, pa.float64())
        except pa.ArrowInvalid:
            index = first_failing(text, lambda one: pc.cast(one, pa.float64()))
            raise where.not_a(NUMERIC, text, index) from None
    # Unsafe: an integer beyond 2**53 rounds to the nearest float64, as numpy casts it, where a safe
    # cast refuses it with no column named.
    values = pc.cast(column, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
    infinite = np.isinf(values)
    if infinite.any():
        raise where.infinite(values, infinite)
    return values


def as_categories(column: pa.Array, where: Where) -> pa.Array:
    if pa.types.is_floating(column.type):
        return float_categories(column)
    return pc.cast(column, pa.string())


def float_categories(column: pa.Array) -> pa.Array:
    """Floats as category text, NaN as missing: a whole number below 2**63 as its integer reads, so
    a column of integer codes that a gap made float (pandas) or a float part beside it (a folder of parts)
    gives the same categories: Arrow writes 4006381333905.0 as '4.006381333905e+12'."""
    if pa.types.is_float16(column.type):  # no arithmetic kernels; float32 holds every value
        column = pc.cast(column, pa.float32())
    column = pc.add(column, pa.scalar(0.0, column.type))  # -0.0 as 0.0: the same category
    column = null_where(pc.is_nan(column), column)
    whole = pc.and_(pc.equal(pc.floor(column), column), pc.less(pc.abs(column), 2.0**63))
    integers = pc.cast(pc.if_else(whole, column, pa.scalar(0.0, column.type)), pa.int64())
    return pc.if_else(whole, pc.cast(integers, pa.string()), pc.cast(column, pa.string()))


def category_as_read(value: str) -> str:
    """A category as `float_categories` reads it today: a whole number an earlier release wrote in
    exponent form ('4.006381333905e+12', from a float column) as its integer, so that the vocabulary of
    an older bundle still finds those values; any other value as it is."""
    if not re.fullmatch(r"-?\d(\.\d+)?e[+-]\d+", value):
        return value
    number = float(value)
    return str(int(number)) if number.is_integer() and abs(number) < 2.0**63 else value


def distinct_categories(column: pa.DictionaryArray, where: Where) -> pa.DictionaryArray:
    """A dictionary array's categories as `read_values` reads them from text, each distinct value read
    once: a dictionary of distinct texts, none null (a missing value is a null index)."""
    values = read_values(CATEGORICAL, column.dictionary, where)
    if not values.null_count and len(pc.unique(values)) == len(values):  # a parquet page's dictionary
        return pa.DictionaryArray.from_arrays(column.indices, values)
    distinct = pc.dictionary_encode(values)
    return pa.DictionaryArray.from_arrays(pc.take(distinct.indices, column.indices), distinct.dictionary)


def category_indices(categories: pa.DictionaryArray) -> np.ndarray:
    """Each value's place in the dictionary of `distinct_categories`, -1 where missing."""
    indices = pc.cast(categories.indices, pa.int64())  # an unsigned or narrow type cannot hold -1
    return indices.fill_null(-1).to_numpy(zero_copy_only=False)


def as_booleans(column: pa.Array, where: Where) -> np.ndarray:
    if is_text(column.type):
        column = tokens_as_null(column)
        words = pc.utf8_lower(pc.utf8_trim_whitespace(column))
        index = pc.index_in(words, value_set=pa.array(TEXT_BOOLEANS))
        values = index.to_numpy(zero_copy_only=False) % 2
        unknown = np.flatnonzero(
            pc.and_(pc.is_valid(words), pc.is_null(index)).to_numpy(zero_copy_only=False)
        )
        if len(unknown):  # numbers written as text ('1.0' where pandas wrote a 0/1 column with gaps)
            values[unknown] = text_booleans_as_numbers(
                pc.take(words, pa.array(unknown)), where, column, unknown
            )
        return values
    values = pc.cast(column, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
    other = np.flatnonzero(~np.isnan(values) & (values != 0) & (values != 1))
    if len(other):
        raise where.not_a(BOOLEAN, column, int(other[0]))
    return values


def text_booleans_as_numbers(words: pa.Array, where: Where, column: pa.Array, at: np.ndarray) -> np.ndarray:
    """Words that are no boolean word as numbers, each 0 or 1; the first that is neither is refused."""
    numbers = np.full(len(words), np.nan)
    for index, word in enumerate(words.to_pylist()):
        try:
            numbers[index] = float(word)
        except ValueError:
            break
    other = np.flatnonzero((numbers != 0) & (numbers != 1))
    if len(other):
        raise where.not_a(BOOLEAN, column, int(at[other[0]]))
    return numbers


def as_instants(column: pa.Array, where: Where) -> np.ndarray:
    if is_text(column.type):
        column = tokens_as_null(column)
        try:
            column = text_instants(column)
        except pa.ArrowInvalid:
            raise where.not_a(DATE, column, first_failing(column, text_instants)) from None
    elif pa.types.is_null(column.type):
        column = pa.nulls(len(column), pa.timestamp("us"))
    return instant_micros(column)


def tokens_as_null(text: pa.Array) -> pa.Array:
    return null_where(pc.is_in(pc.utf8_trim_whitespace(text), value_set=NULL_TOKENS), text)


def instant_micros(column: pa.Array) -> np.ndarray:
    """A date or timestamp column as int64 microseconds: a zoned timestamp's storage is UTC already."""
    if pa.types.is_date32(column.type):
        column = pc.cast(column, pa.date64())
    unit = "ms" if pa.types.is_date64(column.type) else column.type.unit
    stored = pc.fill_null(pc.cast(column, pa.int64()), 0).to_numpy(zero_copy_only=False)
    micros = stored // 1_000 if unit == "ns" else stored * MICROS_PER_UNIT[unit]
    return np.where(pc.is_null(column).to_numpy(zero_copy_only=False), MISSING_INSTANT, micros)


def text_instants(text: pa.Array) -> pa.Array:
    """ISO text as naive timestamps in UTC: zoned values converted, naive ones taken as UTC. A fraction
    of a second past microseconds is cut, as a nanosecond timestamp is read (`instant_micros`)."""
    text = pc.replace_substring_regex(pc.utf8_trim_whitespace(text), r"(\.\d{6})\d+", r"\1")
    zoned = pc.match_substring_regex(text, ZONE_SUFFIX)
    naive = pc.cast(null_where(zoned, text), pa.timestamp("us"))
    utc = pc.cast(null_where(pc.invert(zoned), text), pa.timestamp("us", tz="UTC"))
    return pc.coalesce(naive, pc.cast(utc, pa.timestamp("us")))


def text_feed(values: pa.Array) -> np.ndarray:
    return np.asarray(values.fill_null("").to_pylist(), dtype=object)[:, None]


def number_feed(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)[:, None]


def seconds_feed(micros: np.ndarray) -> np.ndarray:
    return np.where(micros == MISSING_INSTANT, np.nan, micros / MICROS_PER_SECOND)[:, None]


@dataclass(frozen=True)
class KindValues:
    name: str
    what: str  # what a value of the kind is, as a refusal says
    accepts: Callable[[pa.DataType], bool]  # the value types a column read as the kind may have
    read: Callable[[pa.Array, Where], np.ndarray | pa.Array]  # `read_values` once the column is flat
    feed: Callable[[np.ndarray | pa.Array], np.ndarray]  # the values as an export's input
    feed_type: str  # the input's type: "string" or "float64"
    # Reads a dictionary array keeping it one, each distinct value read once (preprocessing reads the
    # kind's columns as dictionaries); None: a dictionary is read as its values.
    distinct: Callable[[pa.DictionaryArray, Where], pa.DictionaryArray] | None = None


def csv_reads_as_text(kind: str) -> bool:
    """Whether a CSV column known to be of `kind` (declared, or a bundle's) is read as text, its values
    then read by the kind, rather than typed from the file's first block: every kind but numbers. A
    category or text as the file writes it ('00123' stays '00123'); a boolean or date so that what the
    first block showed cannot refuse a value the kind reads further down ('yes' under 'true' and
    'false', a zoned time under naive ones, a date under an empty block)."""
    return kind in VALUES and kind != NUMERIC


VALUES = {
    values.name: values
    for values in (
        KindValues(NUMERIC, "a number", is_plain, as_numbers, number_feed, "float64"),
        KindValues(
            CATEGORICAL, "a category", is_plain, as_categories, text_feed, "string", distinct_categories
        ),
        KindValues(
            BOOLEAN, "a boolean (true/false, 1/0, yes/no)", is_plain, as_booleans, number_feed, "float64"
        ),
        KindValues(
            DATE,
            "an ISO date or timestamp (e.g. 2024-01-31 or 2024-01-31T12:00:00+02:00)",
            lambda t: is_instant(t) or is_text(t) or pa.types.is_null(t),
            as_instants,
            seconds_feed,
            "float64",
        ),
        KindValues(TEXT, "text", is_text_or_null, as_categories, text_feed, "string"),
    )
}
