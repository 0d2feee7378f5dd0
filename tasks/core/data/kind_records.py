"""What preprocessing does differently for each column kind, in one record per kind.

Reading, statistics, encoding, scaling, the stored splits and the data Deck read `RECORDS[kind].xxx` and
never test a kind. A kind's reading and its exports' input live in kind_values.py (the MLflow model
ships that module alone), and its part of the bundle's exports in bundle/kind_exports.py, a layer above:
both tables are keyed by the same names, and tests hold the three to one set of kinds. Adding a kind:
docs/inputs.md, "Adding a column kind".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tasks.core.data.column_kinds import ColumnKind
from tasks.core.data.column_stats import (
    BooleanStats,
    CategoryStats,
    ColumnStats,
    DateStats,
    NumberStats,
    WordStats,
)
from tasks.core.data.encoders import (
    CategoryEncoding,
    ColumnEncoder,
    DateEncoding,
    NumberEncoding,
    TextEncoding,
    boolean_moments,
    category_moments,
    date_moments,
    number_moments,
    text_moments,
)
from tasks.core.data.kind_values import BOOLEAN, CATEGORICAL, DATE, NUMERIC, TEXT, VALUES, KindValues
from tasks.core.data.moments import FeatureMoments
from tasks.core.data.words import buckets_of


def its_own_kind(kind: ColumnKind, stats: ColumnStats, min_identifier_rows: int) -> str:
    return kind.kind


@dataclass(frozen=True)
class KindRecord:
    values: KindValues  # reading a column as the kind, and the exports' input (kind_values.py)
    stats: type  # the statistics of the train rows' values (column_stats.py)
    stats_of: Callable[[np.ndarray | pa.Array, int], ColumnStats]  # a batch's; the int: COUNT_CAP
    empty_stats: Callable[[int], ColumnStats]
    encoder: type  # what the column's values become (encoders.py)
    fit: Callable[[ColumnStats, int], ColumnEncoder]  # from the statistics; the int: VOCABULARY_CAP
    moments: Callable[[ColumnEncoder, ColumnStats], list[FeatureMoments]]  # its features', indicator aside
    # Why the kind's own rules leave a column out, if they do; the int: MIN_IDENTIFIER_ROWS.
    left_out: Callable[[ColumnKind, ColumnStats, int], str | None]
    coded: bool  # a standardised split stores its features as one column of codes (split_codes.py)
    # Its features scaled to mean 0 and deviation 1 on the train rows, or left as they are (`train_scaler`).
    standardised: bool
    deck_vocabulary: Callable[[ColumnEncoder], int | str]  # the data Deck's "vocabulary" cell
    # The kind the column is encoded as, from its statistics: its own, or one that encodes its values
    # better (text, for a proposed category of free text); the int: MIN_IDENTIFIER_ROWS.
    encoded_as: Callable[[ColumnKind, ColumnStats, int], str] = its_own_kind

    @property
    def name(self) -> str:
        return self.values.name


def fit_number(stats: NumberStats, vocabulary_cap: int) -> NumberEncoding:
    return NumberEncoding(stats.mean, stats.missing > 0)


def fit_boolean(stats: BooleanStats, vocabulary_cap: int) -> NumberEncoding:
    return NumberEncoding(stats.true / stats.count, stats.missing > 0)


def fit_category(stats: CategoryStats, vocabulary_cap: int) -> CategoryEncoding:
    return CategoryEncoding(stats.most_frequent(vocabulary_cap), stats.missing > 0)


def fit_date(stats: DateStats, vocabulary_cap: int) -> DateEncoding:
    return DateEncoding(stats.low, stats.low + (stats.high - stats.low) // 2, stats.missing > 0)


def fit_text(stats: CategoryStats, vocabulary_cap: int) -> TextEncoding:
    """Every word counted, so that the statistics' sums are those of the features; the vocabulary cap
    is a category's."""
    words, buckets = stats.words.most_frequent(), len(stats.words.sums)
    table = dict(zip(words, buckets_of(words, buckets).tolist(), strict=True))
    return TextEncoding(table, buckets, stats.missing > 0)


def text_where_words_recur(kind: ColumnKind, stats: CategoryStats, min_identifier_rows: int) -> str:
    """A proposed category is encoded as text where most train rows hold a value that no other row
    holds (so one-hot columns would learn little of them, or it is left out as identifier-like) while
    most of their words recur: names and free text. An identifier ('id-000123': 'id' in every row, the
    number in one) stays a category. Not below `min_identifier_rows` rows, where values differ by chance."""
    if kind.by_user or stats.words is None or stats.count < min_identifier_rows:
        return kind.kind
    return TEXT if stats.long_tailed and stats.words.recurring else kind.kind


def empty_category_stats(count_cap: int) -> CategoryStats:
    """No row yet, words counted: categories may turn out to be text, and text is counted by its words."""
    return CategoryStats(cap=count_cap, words=WordStats(cap=count_cap))


def kept(kind: ColumnKind, stats: ColumnStats, min_identifier_rows: int) -> None:
    """A constant number or boolean is kept: it standardises to 0, and a table of numbers keeps every
    column in place (a model may read them as an image)."""
    return None


def constant(kind: ColumnKind, stats: DateStats | CategoryStats, min_identifier_rows: int) -> str | None:
    if not stats.missing and stats.constant:
        return "it holds the same value in every train row (constant)"
    return None


def constant_or_identifier(kind: ColumnKind, stats: CategoryStats, min_identifier_rows: int) -> str | None:
    if reason := constant(kind, stats, min_identifier_rows):
        return reason
    if stats.overflowed and not stats.counts:
        return f"it holds more than {stats.cap:,} distinct values, none frequent (like an identifier)"
    distinct = not (stats.missing or stats.overflowed) and len(stats.counts) == stats.count
    if distinct and not kind.by_user and stats.count >= min_identifier_rows:
        return f"it holds a different value in each of the {stats.count:,} train rows (like an identifier)"
    return None


def constant_or_wordless(kind: ColumnKind, stats: CategoryStats, min_identifier_rows: int) -> str | None:
    if reason := constant(kind, stats, min_identifier_rows):
        return reason
    if stats.words.counts:
        return None
    if stats.words.other:
        return f"it holds more than {stats.words.cap:,} distinct words, none frequent"
    return "its values hold no word (a run of ASCII letters or digits)"


def no_vocabulary(encoder: ColumnEncoder) -> str:
    return ""


RECORDS = {
    record.name: record
    for record in (
        KindRecord(
            values=VALUES[NUMERIC],
            stats=NumberStats,
            stats_of=lambda values, count_cap: NumberStats.of(values),
            empty_stats=lambda count_cap: NumberStats(),
            encoder=NumberEncoding,
            fit=fit_number,
            moments=number_moments,
            left_out=kept,
            coded=False,
            standardised=True,
            deck_vocabulary=no_vocabulary,
        ),
        KindRecord(
            values=VALUES[CATEGORICAL],
            stats=CategoryStats,
            stats_of=CategoryStats.with_words,
            empty_stats=empty_category_stats,
            encoder=CategoryEncoding,
            fit=fit_category,
            moments=category_moments,
            left_out=constant_or_identifier,
            coded=True,
            standardised=False,
            deck_vocabulary=lambda encoder: len(encoder.vocabulary),
            encoded_as=text_where_words_recur,
        ),
        KindRecord(
            values=VALUES[BOOLEAN],
            stats=BooleanStats,
            stats_of=lambda values, count_cap: BooleanStats.of(values),
            empty_stats=lambda count_cap: BooleanStats(),
            encoder=NumberEncoding,
            fit=fit_boolean,
            moments=boolean_moments,
            left_out=kept,
            coded=False,
            standardised=True,
            deck_vocabulary=no_vocabulary,
        ),
        KindRecord(
            values=VALUES[DATE],
            stats=DateStats,
            stats_of=lambda values, count_cap: DateStats.of(values),
            empty_stats=lambda count_cap: DateStats(),
            encoder=DateEncoding,
            fit=fit_date,
            moments=date_moments,
            left_out=constant,
            coded=False,
            standardised=True,
            deck_vocabulary=no_vocabulary,
        ),
        KindRecord(
            values=VALUES[TEXT],
            stats=CategoryStats,
            stats_of=CategoryStats.with_words,
            empty_stats=empty_category_stats,
            encoder=TextEncoding,
            fit=fit_text,
            moments=text_moments,
            left_out=constant_or_wordless,
            coded=False,
            standardised=True,
            deck_vocabulary=lambda encoder: len(encoder.words),
        ),
    )
}
