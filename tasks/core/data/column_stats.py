"""Per-column statistics of the train rows, a batch at a time, that merge exactly in any grouping.

Every statistic is a count, an integer sum, a minimum or a maximum, so the statistics of the pieces of
the rows (batches, part files, pods) merge to those of one pass over all of them, whatever the number
or the order of the pieces:
- numbers: count, missing, the exact sum (`exact_sum`: float64 values as whole multiples of 2**-1126,
  summed as Python integers), minimum and maximum;
- categories: counts by value and missing; see `CategoryStats` for the bound on distinct values; and,
  for the categorical and text kinds, the words of the values (`WordStats`): the rows holding each word,
  bounded alike, and the sums of each bucket's count of a row's words and of its square;
- booleans: true, false and missing;
- dates: count, missing, the exact sum, earliest and latest instant (microseconds, UTC), and counts
  by month and by day of the week.
Besides, numbers and dates hold the sum of squared deviations from their mean (`m2`), which merges
with Chan, Golub and LeVeque's pairwise update, so within float64 rounding: with the counts it gives
the moments of every encoded feature, and so the standardisation, without another pass over the rows
(scaling.py). Each takes its kind's values as `column_kinds.canonical` gives them; which kind
keeps which: kind_records.py.
"""

from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.core.data.column_kinds import month_of, weekday_of
from tasks.core.data.kind_values import MISSING_INSTANT, category_indices
from tasks.core.data.words import TEXT_BUCKETS, Occurrences

# float64 is m * 2**e with m a 53-bit integer and e >= -1126 (the least subnormal is 2**-1074), so every
# value times 2**SUM_SCALE_BITS is an integer.
SUM_SCALE_BITS = 1126
# The distinct values a categorical column's counts hold: the vocabulary (at most `VOCABULARY_CAP`
# values, in encoding.py) is far smaller, so the values it takes are counted exactly or nearly so.
COUNT_CAP = 10_000


def exact_sum(values: np.ndarray) -> int:
    """The sum of finite float64 `values` times 2**SUM_SCALE_BITS, exactly: integer sums add up the same
    in any grouping, where float sums round differently. Small whole numbers are summed as floats;
    otherwise values with the same exponent are summed in int64 as 26-bit halves of their mantissas,
    which cannot overflow below 2**36 values."""
    if not len(values):
        return 0
    with np.errstate(over="ignore"):
        small = np.abs(values).max() * len(values) < 2.0**53
    if small and (np.floor(values) == values).all():
        # Whole numbers whose every partial sum is a whole number below 2**53: float64 adds them exactly.
        return int(values.sum()) << SUM_SCALE_BITS
    mantissa, exponent = np.frexp(values)
    whole = (mantissa * 2.0**53).astype(np.int64)
    order = np.argsort(exponent, kind="stable")
    exponents, starts = np.unique(exponent[order], return_index=True)
    ordered = whole[order]
    high = np.add.reduceat(ordered >> 26, starts)  # whole == (whole >> 26) * 2**26 + (whole & 2**26 - 1)
    low = np.add.reduceat(ordered & ((1 << 26) - 1), starts)
    return sum(
        ((int(h) << 26) + int(lo)) << (int(e) - 53 + SUM_SCALE_BITS)
        for h, lo, e in zip(high, low, exponents, strict=True)
    )


def squared_deviations(values: np.ndarray, mean: float) -> float:
    """The sum of (value - mean)**2, in float64; inf where it overflows (refused by column later)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.square(values - mean).sum())


def merged_m2(a: NumberStats | DateStats, b: NumberStats | DateStats) -> float:
    """The squared deviations of two groups' values from their joint mean (Chan, Golub and LeVeque)."""
    if not (a.count and b.count):
        return a.m2 + b.m2
    delta = b.mean - a.mean
    with np.errstate(over="ignore", invalid="ignore"):
        return a.m2 + b.m2 + delta * delta * (a.count * b.count / (a.count + b.count))


def lower(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def higher(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


@dataclass
class NumberStats:
    count: int = 0  # values present
    missing: int = 0
    total: int = 0  # their exact sum times 2**SUM_SCALE_BITS
    low: float | None = None
    high: float | None = None
    m2: float = 0.0  # the values' squared deviations from their mean

    @classmethod
    def of(cls, values: np.ndarray) -> NumberStats:
        present = values[~np.isnan(values)]
        if not len(present):
            return cls(missing=len(values))
        low, high = float(present.min()), float(present.max())
        stats = cls(len(present), len(values) - len(present), exact_sum(present), low, high)
        stats.m2 = squared_deviations(present, stats.mean)
        return stats

    def merge(self, other: NumberStats) -> NumberStats:
        return NumberStats(
            self.count + other.count,
            self.missing + other.missing,
            self.total + other.total,
            lower(self.low, other.low),
            higher(self.high, other.high),
            merged_m2(self, other),
        )

    @property
    def mean(self) -> float:
        return self.total / (self.count << SUM_SCALE_BITS)  # Python rounds an int quotient correctly

    @property
    def constant(self) -> bool:
        return self.low == self.high

    def to_dict(self) -> dict:
        """The sum as text, 'odd<<shift', as JSON readers other than Python's cap integers; `m2` as
        hexadecimal text, exact and readable where it overflowed."""
        shift = (self.total & -self.total).bit_length() - 1 if self.total else 0
        return {**asdict(self), "total": f"{self.total >> shift}<<{shift}", "m2": self.m2.hex()}

    @classmethod
    def from_dict(cls, saved: dict) -> NumberStats:
        odd, shift = saved["total"].split("<<")
        return cls(**{**saved, "total": int(odd) << int(shift), "m2": float.fromhex(saved["m2"])})


@dataclass
class BooleanStats:
    true: int = 0
    false: int = 0
    missing: int = 0

    @classmethod
    def of(cls, values: np.ndarray) -> BooleanStats:
        true = int((values == 1).sum())
        missing = int(np.isnan(values).sum())
        return cls(true, len(values) - true - missing, missing)

    def merge(self, other: BooleanStats) -> BooleanStats:
        return BooleanStats(self.true + other.true, self.false + other.false, self.missing + other.missing)

    @property
    def count(self) -> int:
        return self.true + self.false

    @property
    def constant(self) -> bool:
        return not (self.true and self.false)


@dataclass
class DateStats:
    count: int = 0
    missing: int = 0
    low: int | None = None  # microseconds since 1970-01-01 UTC
    high: int | None = None
    total: int = 0  # the instants' exact sum
    m2: float = 0.0  # their squared deviations from their mean
    months: list[int] = field(default_factory=lambda: [0] * 12)  # instants by month, January first
    weekdays: list[int] = field(default_factory=lambda: [0] * 7)  # by day of the week, Monday first

    @classmethod
    def of(cls, micros: np.ndarray) -> DateStats:
        present = micros[micros != MISSING_INSTANT]
        if not len(present):
            return cls(missing=len(micros))
        # Summed as 32-bit halves, which int64 holds for 2**31 rows: the instants themselves overflow.
        total = (int((present >> 32).sum()) << 32) + int((present & 0xFFFFFFFF).sum())
        return cls(
            len(present),
            len(micros) - len(present),
            int(present.min()),
            int(present.max()),
            total,
            squared_deviations(present.astype(np.float64), total / len(present)),
            np.bincount(month_of(present) - 1, minlength=12).tolist(),
            np.bincount(weekday_of(present), minlength=7).tolist(),
        )

    def merge(self, other: DateStats) -> DateStats:
        return DateStats(
            self.count + other.count,
            self.missing + other.missing,
            lower(self.low, other.low),
            higher(self.high, other.high),
            self.total + other.total,
            merged_m2(self, other),
            [a + b for a, b in zip(self.months, other.months, strict=True)],
            [a + b for a, b in zip(self.weekdays, other.weekdays, strict=True)],
        )

    @property
    def mean(self) -> float:
        return self.total / self.count

    @property
    def constant(self) -> bool:
        return self.low == self.high


@dataclass
class CategoryStats:
    """Counts by value, holding at most `cap` values. While the rows hold no more distinct values than
    that, the counts are exact, in any grouping. Beyond it, the counts are Misra and Gries' mergeable
    summary: every count is lowered by the (cap+1)-th largest and those left positive are kept, so any
    value in more than 1/(cap+1) of the rows is kept, its count short by at most that share; which
    values are kept and their counts may then differ with the grouping. `other` counts the rows no
    longer counted by value, so `count` stays exact."""

    counts: dict[str, int] = field(default_factory=dict)
    other: int = 0
    missing: int = 0
    cap: int = COUNT_CAP
    words: WordStats | None = None  # where counted: what a column of text is encoded by

    @classmethod
    def of(cls, text: pa.Array, cap: int = COUNT_CAP) -> CategoryStats:
        """Of text, or of a dictionary of distinct texts (`distinct_categories`)."""
        return cls.counted(*value_counts(text), cap)

    @classmethod
    def with_words(cls, text: pa.Array, cap: int = COUNT_CAP) -> CategoryStats:
        """`of`, and the words of the values (`WordStats`)."""
        values, counts, missing = value_counts(text)
        return cls.counted(values, counts, missing, cap, WordStats.of(values, counts, cap))

    @classmethod
    def counted(
        cls, values: pa.Array, counts: np.ndarray, missing: int, cap: int, words: WordStats | None = None
    ) -> CategoryStats:
        kept, dropped = heavy_hitters(dict(zip(values.to_pylist(), counts.tolist(), strict=True)), cap)
        return cls(kept, dropped, missing, cap, words)

    def merge(self, other: CategoryStats) -> CategoryStats:
        counts = dict(self.counts)
        for value, count in other.counts.items():
            counts[value] = counts.get(value, 0) + count
        kept, dropped = heavy_hitters(counts, self.cap)
        words = None if self.words is None else self.words.merge(other.words)
        missing = self.missing + other.missing
        return CategoryStats(kept, self.other + other.other + dropped, missing, self.cap, words)

    @property
    def count(self) -> int:
        return sum(self.counts.values()) + self.other

    @property
    def constant(self) -> bool:
        return len(self.counts) == 1 and not self.other

    @property
    def overflowed(self) -> bool:
        return self.other > 0

    @property
    def long_tailed(self) -> bool:
        """Whether most rows hold a value no other row holds, or one too rare to be counted."""
        alone = sum(1 for count in self.counts.values() if count == 1)
        return 2 * (alone + self.other) > self.count

    def most_frequent(self, limit: int) -> list[str]:
        """Up to `limit` values, the most frequent first; ties by value, so the choice is deterministic."""
        ranked = sorted(self.counts.items(), key=lambda item: (-item[1], item[0]))
        return [value for value, _ in ranked[:limit]]

    def to_dict(self) -> dict:
        words = None if self.words is None else self.words.to_dict()
        return {**asdict(self), "counts": dict(sorted(self.counts.items())), "words": words}

    @classmethod
    def from_dict(cls, saved: dict) -> CategoryStats:
        words = saved.get("words")
        return cls(**{**saved, "words": None if words is None else WordStats(**words)})


def value_counts(text: pa.Array) -> tuple[pa.Array, np.ndarray, int]:
    """The distinct values of text, or of a dictionary of distinct texts, their counts and the missing."""
    if pa.types.is_dictionary(text.type):
        at = category_indices(text)
        counts = np.bincount(at[at >= 0], minlength=len(text.dictionary))
        present = np.flatnonzero(counts)
        return text.dictionary.take(present), counts[present], int((at < 0).sum())
    counted = pc.value_counts(text.drop_null())
    counts = counted.field("counts").to_numpy(zero_copy_only=False).astype(np.int64)
    return counted.field("values"), counts, text.null_count


@dataclass
class WordStats:
    """The words of a column's values (words.py): the rows holding each word, at most `cap` words, exact
    while the rows hold no more and Misra and Gries' summary beyond, as `CategoryStats` counts values
    (`other`: the word-rows no longer counted by word); and over the rows, for each of the buckets, the
    sum of a row's count of words hashing to it, of its square, and its least and largest value. The
    encoding keeps every counted word, so the sums are those of its features while no word was dropped."""

    rows: int = 0  # values counted
    counts: dict[str, int] = field(default_factory=dict)
    other: int = 0
    sums: list[int] = field(default_factory=lambda: [0] * TEXT_BUCKETS)
    squares: list[int] = field(default_factory=lambda: [0] * TEXT_BUCKETS)
    low: list[int] | None = None  # None: no row yet
    high: list[int] | None = None
    cap: int = COUNT_CAP

    @classmethod
    def of(cls, values: pa.Array, rows: np.ndarray, cap: int = COUNT_CAP) -> WordStats:
        """Of distinct texts `values`, each held by `rows` rows."""
        occurrences = Occurrences.of(values)
        kept, dropped = heavy_hitters(occurrences.rows_by_word(rows), cap)
        return cls(int(rows.sum()), kept, dropped, **occurrences.bucket_sums(rows, TEXT_BUCKETS), cap=cap)

    def merge(self, other: WordStats) -> WordStats:
        counts = dict(self.counts)
        for word, count in other.counts.items():
            counts[word] = counts.get(word, 0) + count
        kept, dropped = heavy_hitters(counts, self.cap)
        return WordStats(
            self.rows + other.rows,
            kept,
            self.other + other.other + dropped,
            [a + b for a, b in zip(self.sums, other.sums, strict=True)],
            [a + b for a, b in zip(self.squares, other.squares, strict=True)],
            each_of(min, self.low, other.low),
            each_of(max, self.high, other.high),
            self.cap,
        )

    @property
    def recurring(self) -> bool:
        """Whether most word-rows are of words held by more than one row but not by every row: words
        that tell rows apart and recur in other rows."""
        shared = sum(count for count in self.counts.values() if 2 <= count < self.rows)
        return 2 * shared > sum(self.counts.values()) + self.other

    def most_frequent(self) -> list[str]:
        """Every counted word, the most frequent first; ties by word, so the order is deterministic."""
        return [word for word, _ in sorted(self.counts.items(), key=lambda item: (-item[1], item[0]))]

    def to_dict(self) -> dict:
        return {**asdict(self), "counts": dict(sorted(self.counts.items()))}


def each_of(pick, a: list[int] | None, b: list[int] | None) -> list[int] | None:
    """`pick` (min or max) of two lists place by place; either is None where it counted no row."""
    return b if a is None else a if b is None else [pick(x, y) for x, y in zip(a, b, strict=True)]


def heavy_hitters(counts: dict[str, int], cap: int) -> tuple[dict[str, int], int]:
    """`counts` when they hold at most `cap` values; else Misra and Gries' summary of them. Also the
    rows the summary no longer counts by value."""
    if len(counts) <= cap:
        return counts, 0
    cut = heapq.nlargest(cap + 1, counts.values())[-1]
    kept = {value: count - cut for value, count in counts.items() if count > cut}
    return kept, sum(counts.values()) - sum(kept.values())


ColumnStats = NumberStats | BooleanStats | DateStats | CategoryStats


def stats_to_dict(stats: ColumnStats) -> dict:
    return stats.to_dict() if hasattr(stats, "to_dict") else asdict(stats)


def stats_from_dict(cls: type, saved: dict) -> ColumnStats:
    return cls.from_dict(saved) if hasattr(cls, "from_dict") else cls(**saved)
