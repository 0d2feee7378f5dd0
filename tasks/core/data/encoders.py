"""Each column kind's encoder: the features a column's values become, as the fitted encoding writes them
(encoding.py), and their moments in the train rows from the column's statistics (scaling.py). Which
kind uses which: kind_records.py."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.core.data.column_kinds import MICROS_PER_DAY, month_of, weekday_of
from tasks.core.data.column_stats import BooleanStats, CategoryStats, DateStats, NumberStats
from tasks.core.data.kind_values import MISSING_INSTANT, category_as_read, category_indices
from tasks.core.data.moments import FeatureMoments
from tasks.core.data.words import bucket_counts


@dataclass
class NumberEncoding:
    """A number or a boolean (as 0/1): missing values imputed, then the missing indicator if any."""

    fill: float
    indicator: bool

    def names(self, name: str) -> list[str]:
        return [name, *missing_name(name, self.indicator)]

    def width(self) -> int:
        return 1 + self.indicator

    def write(self, values: np.ndarray, out: np.ndarray) -> None:
        missing = np.isnan(values)
        out[:, 0] = np.where(missing, self.fill, values)
        write_indicator(out, missing, self.indicator)

    def write_scaled(self, values: np.ndarray, mean: np.ndarray, scale: np.ndarray, out: np.ndarray) -> None:
        write_scaled_block(self, values, mean, scale, out)


@dataclass
class CategoryEncoding:
    vocabulary: list[str]
    indicator: bool

    def names(self, name: str) -> list[str]:
        return (
            [f"{name}={value}" for value in self.vocabulary]
            + [f"{name}=<other>"]
            + ([f"{name}=<missing>"] if self.indicator else [])
        )

    def width(self) -> int:
        return len(self.vocabulary) + 1 + self.indicator

    @cached_property
    def lookup(self) -> pa.Array:
        """The vocabulary as values are read today (`category_as_read`), made once, not per batch."""
        return pa.array([category_as_read(value) for value in self.vocabulary], pa.string())

    def codes(self, text: pa.Array) -> np.ndarray:
        """Each value's one-hot column: its place in the vocabulary, else <other>, or <missing>. Of text,
        or of a dictionary of distinct texts (`distinct_categories`), looked up once per distinct value."""
        other = len(self.vocabulary)
        vocabulary = self.lookup
        if pa.types.is_dictionary(text.type):
            found = pc.fill_null(pc.index_in(text.dictionary, value_set=vocabulary), other)
            missing = other + 1 if self.indicator else other
            by_value = np.append(found.to_numpy(zero_copy_only=False), missing).astype(np.intp)
            return by_value[category_indices(text)]  # -1, missing, is the last
        found = pc.index_in(text, value_set=vocabulary)
        codes = pc.fill_null(found, other).to_numpy(zero_copy_only=False).astype(np.intp)
        if self.indicator:
            codes[text.is_null().to_numpy(zero_copy_only=False)] = other + 1
        return codes

    def write(self, text: pa.Array, out: np.ndarray) -> None:
        """Into `out`, zeros (rows x width()), the ones."""
        out[np.arange(len(text)), self.codes(text)] = 1.0

    def scaled_values(self, mean: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each one-hot column's two standardised values, for 0 and for 1 (float32): computed in float64
        and cast once, as `scaling.standardise` computes them."""
        zero, one = ((np.array([[0.0], [1.0]]) - mean) / scale).astype(np.float32)
        return zero, one

    def write_scaled(self, text: pa.Array, mean: np.ndarray, scale: np.ndarray, out: np.ndarray) -> None:
        """Each one-hot column standardised takes one of two values, computed once for 0 and for 1."""
        zero, one = self.scaled_values(mean, scale)
        out[:] = zero[:, None]
        codes = self.codes(text)
        out[codes, np.arange(len(text))] = one[codes]


@dataclass
class DateEncoding:
    origin: int  # microseconds since 1970-01-01 UTC: the earliest train instant
    fill: int  # what a missing date is taken as: the middle of the train range
    indicator: bool

    def names(self, name: str) -> list[str]:
        return [f"{name}:days", f"{name}:month", f"{name}:weekday", *missing_name(name, self.indicator)]

    def width(self) -> int:
        return 3 + self.indicator

    def write(self, micros: np.ndarray, out: np.ndarray) -> None:
        missing = micros == MISSING_INSTANT
        filled = np.where(missing, self.fill, micros)
        out[:, 0] = (filled - self.origin) / MICROS_PER_DAY
        out[:, 1] = month_of(filled)
        out[:, 2] = weekday_of(filled)
        write_indicator(out, missing, self.indicator)

    def write_scaled(self, micros: np.ndarray, mean: np.ndarray, scale: np.ndarray, out: np.ndarray) -> None:
        write_scaled_block(self, micros, mean, scale, out)


@dataclass
class TextEncoding:
    """Free text: for each of `buckets` buckets, the count of the value's words (words.py) whose bucket
    `words` gives; a word the train rows did not hold counts nowhere. Then the missing indicator, if any."""

    words: dict[str, int]  # each train word's bucket, the most frequent word first
    buckets: int
    indicator: bool

    def names(self, name: str) -> list[str]:
        return [f"{name}:words{bucket}" for bucket in range(self.buckets)] + missing_name(
            name, self.indicator
        )

    def width(self) -> int:
        return self.buckets + self.indicator

    def write(self, text: pa.Array, out: np.ndarray) -> None:
        out[:, : self.buckets] = bucket_counts(text, self.words, self.buckets)
        write_indicator(out, text.is_null().to_numpy(zero_copy_only=False), self.indicator)

    def write_scaled(self, text: pa.Array, mean: np.ndarray, scale: np.ndarray, out: np.ndarray) -> None:
        write_scaled_block(self, text, mean, scale, out)


ColumnEncoder = NumberEncoding | CategoryEncoding | DateEncoding | TextEncoding


def missing_name(name: str, indicator: bool) -> list[str]:
    return [f"{name}<missing>"] if indicator else []


def write_indicator(out: np.ndarray, missing: np.ndarray, indicator: bool) -> None:
    """The missing indicator, where there is one, in the block's last column."""
    if indicator:
        out[:, -1] = missing


def write_scaled_block(
    encoder: NumberEncoding | DateEncoding | TextEncoding,
    values: np.ndarray,
    mean: np.ndarray,
    scale: np.ndarray,
    out: np.ndarray,
) -> None:
    """The encoder's few columns in float64, standardised as `scaling.standardise` does, into `out`
    (width x rows, float32): the assignment casts as its `astype` does."""
    block = np.zeros((encoder.width(), len(values))).T  # each feature's values side by side: `out`'s layout
    encoder.write(values, block)
    block -= mean
    block /= scale
    out[:] = block.T


def number_moments(encoder: NumberEncoding, stats: NumberStats) -> list[FeatureMoments]:
    """The moments of a number's feature; a missing value is the fill."""
    values = FeatureMoments.one(stats.count, stats.mean, stats.m2, stats.low, stats.high)
    return [values.merge(FeatureMoments.repeated(stats.missing, encoder.fill))]


def boolean_moments(encoder: NumberEncoding, stats: BooleanStats) -> list[FeatureMoments]:
    return [FeatureMoments.of_counts([0, 1, encoder.fill], [stats.false, stats.true, stats.missing])]


def category_moments(encoder: CategoryEncoding, stats: CategoryStats) -> list[FeatureMoments]:
    """The moments of each one-hot column, the vocabulary's and <other>."""
    rows = stats.count + stats.missing
    ones = [stats.counts.get(value, 0) for value in encoder.vocabulary]
    other = rows - sum(ones) - (stats.missing if encoder.indicator else 0)
    return [FeatureMoments.of_counts([0, 1], [rows - n, n]) for n in [*ones, other]]


def date_moments(encoder: DateEncoding, stats: DateStats) -> list[FeatureMoments]:
    """The moments of a date's days since the origin, month and weekday; a missing date is the fill."""
    day = MICROS_PER_DAY
    # The mean in integers first: the instants' float64 sum would round.
    mean_days = (stats.total - stats.count * encoder.origin) / (stats.count * day)
    low, high = ((stats.low - encoder.origin) / day, (stats.high - encoder.origin) / day)
    days = FeatureMoments.one(stats.count, mean_days, stats.m2 / day**2, low, high)
    fill = np.array([encoder.fill])
    months, weekdays = np.array(stats.months), np.array(stats.weekdays)
    months[month_of(fill)[0] - 1] += stats.missing
    weekdays[weekday_of(fill)[0]] += stats.missing
    return [
        days.merge(FeatureMoments.repeated(stats.missing, (encoder.fill - encoder.origin) / day)),
        FeatureMoments.of_counts(list(range(1, 13)), months.tolist()),
        FeatureMoments.of_counts(list(range(7)), weekdays.tolist()),
    ]


def text_moments(encoder: TextEncoding, stats: CategoryStats) -> list[FeatureMoments]:
    """The moments of each bucket's count, from the sums of the counts and of their squares (exact
    integers, so each mean and M2 is rounded once); a missing value counts no word."""
    words, rows = stats.words, stats.words.rows + stats.missing
    mean = [total / rows for total in words.sums]
    m2 = [
        (rows * square - total * total) / rows
        for total, square in zip(words.sums, words.squares, strict=True)
    ]
    low = np.minimum(words.low, 0) if stats.missing else np.asarray(words.low)
    high = np.asarray(words.high, dtype=np.float64)
    return [FeatureMoments(rows, np.array(mean), np.array(m2), low.astype(np.float64), high)]
