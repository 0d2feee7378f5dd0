"""Mixed feature columns encoded as numbers: fitted on the train rows in one streaming pass, and applied
the same way wherever rows are encoded (training, evaluation, scoring of raw rows).

1. `propose_kinds` (column_kinds.py) gives each feature column a kind, or 'drop'.
2. `batch_stats` gives the statistics of a batch's train rows; `EncodingStats.merge` adds those of the
   batches and pieces up exactly (column_stats.py), so a split run fits what one pass fits.
3. `EncodingStats.fit` gives the `FittedEncoding`, whose `transform` turns any batch holding the feature
   columns (in any order, among others) into float64 rows, and `transform_scaled` into the standardised
   float32 features a prepared split holds; `to_dict` stores it in a bundle's manifest.
Each kind's statistics, encoder (encoders.py) and rules for leaving a column out are its record in
kind_records.py.

The rules:
- Numbers: a missing value (null or NaN) takes the train mean, and `name<missing>` (1 where missing)
  follows wherever a train value was missing. The mean rather than the median: a mean comes from a
  count and an exact integer sum, which add up to the same value however the rows are split into
  pieces; a median needs every value, or a sketch whose answer depends on the split. An infinite
  value is refused by column and row.
- Categories: one-hot over a vocabulary of the `VOCABULARY_CAP` most frequent train values (ties broken
  by value), then `name=<other>` for any other value, unseen ones included (never an error), then
  `name=<missing>` where a train value was missing (elsewhere a missing value counts as other). Counting
  holds at most `COUNT_CAP` distinct values per column: exact while the train rows hold no more, and
  beyond that a Misra-Gries summary that keeps every value in more than 1/(COUNT_CAP+1) of the rows
  (see `CategoryStats`), which may then depend on how the rows were split into pieces.
- Booleans: 0/1; a missing value takes the train share of true, with `name<missing>` as for numbers.
- Dates: `name:days` (days since the earliest train instant, fractional), `name:month` (1-12) and
  `name:weekday` (0 = Monday ... 6 = Sunday), as plain numbers; a missing date takes the midpoint of
  the train range, with `name<missing>`. All in UTC: a zoned timestamp is converted, a naive one or a
  date is taken as UTC.
- Text: `name:words0` ... `name:words127`, each the count of the value's words (runs of ASCII letters
  and digits, lowercased: words.py) that hash to that bucket, over every word the train rows held
  (counted as categories are: exactly up to `COUNT_CAP` distinct words, Misra-Gries beyond); a word the
  train rows did not hold counts nowhere, and a missing value counts none, with `name<missing>` where a train
  value was missing. A text column proposed categorical is encoded as text where most train rows hold
  a value no other row holds and most of their words recur in other rows (`text_where_words_recur`).
- Left out, each with a note that names the column and why: all missing in the train rows; a category
  or date column constant (one value in every train row, none missing); identifier-like: a text or dictionary column proposed
  categorical (not marked so by the user) with a different value in each of at least
  `MIN_IDENTIFIER_ROWS` train rows, none missing, or any categorical column with more than `COUNT_CAP`
  distinct values, none frequent enough to keep; and columns marked 'drop'. A constant number or
  boolean is kept, as it always was: it standardises to 0, and a table of numbers keeps every column
  in place (a model may read them as an image, 8x8 pixels whose border is blank).
- A column's kind comes from its Arrow type, or from the user's overrides; text proposed as a date is
  ISO text in the first batch (column_kinds.py). Every value of every row is read as its kind, train
  rows or not, so a bad value is refused by column and row wherever it is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

from tasks.core.data.column_kinds import DROP, ColumnKind, Place, canonical
from tasks.core.data.column_stats import COUNT_CAP, ColumnStats, stats_from_dict, stats_to_dict
from tasks.core.data.encoders import CategoryEncoding as CategoryEncoding  # importers name them from here
from tasks.core.data.encoders import ColumnEncoder
from tasks.core.data.encoders import DateEncoding as DateEncoding
from tasks.core.data.encoders import NumberEncoding as NumberEncoding
from tasks.core.data.files import DatasetError
from tasks.core.data.kind_records import RECORDS
from tasks.core.messages import preview

ENCODING_VERSION = 1
VOCABULARY_CAP = 100  # one-hot columns per categorical feature, besides <other> and <missing>
MIN_IDENTIFIER_ROWS = 50  # fewer train rows than this may all differ by chance


def check_columns(present: list[str], wanted: list[str], source: str = "") -> None:
    absent = [name for name in wanted if name not in set(present)]
    if absent:
        prefix = f"{source}: " if source else ""
        names = preview([repr(name) for name in absent])
        what = f"feature column {names} is" if len(absent) == 1 else f"feature columns {names} are"
        raise DatasetError(
            f"{prefix}{what} missing, which the encoding reads; the data has columns {preview(present)}"
        )


@dataclass
class EncodingStats:
    """The train rows' statistics of every feature column not dropped."""

    kinds: dict[str, ColumnKind]  # every feature column, in the encoded order; 'drop' included
    columns: dict[str, ColumnStats]

    @classmethod
    def empty(cls, kinds: dict[str, ColumnKind], count_cap: int = COUNT_CAP) -> EncodingStats:
        return cls(
            kinds,
            {name: RECORDS[k.kind].empty_stats(count_cap) for name, k in kinds.items() if k.kind != DROP},
        )

    def merge(self, other: EncodingStats) -> EncodingStats:
        return EncodingStats(
            self.kinds, {name: s.merge(other.columns[name]) for name, s in self.columns.items()}
        )

    def fit(
        self, vocabulary_cap: int = VOCABULARY_CAP, min_identifier_rows: int = MIN_IDENTIFIER_ROWS
    ) -> FittedEncoding:
        """The encoding these statistics give; a column left out gets a note instead."""
        columns, left_out = [], {}
        for name, proposed in self.kinds.items():
            stats = self.columns.get(name)  # none where dropped
            kind = encoded_kind(proposed, stats, min_identifier_rows)
            reason = left_out_reason(kind, stats, min_identifier_rows)
            if reason:
                left_out[name] = f"column {name!r} is left out of the features: {reason}"
            else:
                encoder = RECORDS[kind.kind].fit(stats, vocabulary_cap)
                columns.append(ColumnEncoding(name, kind.kind, encoder, missing_share(stats)))
        if not columns:
            raise DatasetError(f"no feature column is left to encode: {'; '.join(left_out.values())}")
        return FittedEncoding(columns, left_out)

    def to_dict(self) -> dict:
        return {
            "version": ENCODING_VERSION,
            "kinds": {name: asdict(kind) for name, kind in self.kinds.items()},
            "columns": {name: stats_to_dict(stats) for name, stats in self.columns.items()},
        }

    @classmethod
    def from_dict(cls, saved: dict) -> EncodingStats:
        check_version(saved)
        kinds = {name: ColumnKind(**kind) for name, kind in saved["kinds"].items()}
        columns = {
            name: stats_from_dict(RECORDS[kinds[name].kind].stats, s) for name, s in saved["columns"].items()
        }
        return cls(kinds, columns)


def batch_stats(
    kinds: dict[str, ColumnKind],
    batch: pa.RecordBatch | pa.Table,
    first_row: int = 0,
    keep: np.ndarray | None = None,
    source: str = "",
    count_cap: int = COUNT_CAP,
) -> EncodingStats:
    """The statistics of the batch's train rows (`keep`, a mask; all rows without it). Every row's values
    are checked, as errors name them: the batch's first row is row `first_row` of `source`."""
    names = [name for name, kind in kinds.items() if kind.kind != DROP]
    check_columns(batch.schema.names, names, source)
    columns = {}
    for name in names:
        kind = kinds[name].kind
        values = canonical(kind, batch.column(name), Place(name, first_row, source))
        if keep is not None:
            values = values.filter(pa.array(keep)) if isinstance(values, pa.Array) else values[keep]
        columns[name] = RECORDS[kind].stats_of(values, count_cap)
    return EncodingStats(kinds, columns)


def encoded_kind(kind: ColumnKind, stats: ColumnStats | None, min_identifier_rows: int) -> ColumnKind:
    """The kind the column is encoded as: the one proposed or declared, or the one its statistics show
    it to be (`KindRecord.encoded_as`: free text proposed as a category)."""
    if stats is None or not stats.count:
        return kind
    return ColumnKind(RECORDS[kind.kind].encoded_as(kind, stats, min_identifier_rows), kind.by_user)


def left_out_reason(kind: ColumnKind, stats: ColumnStats | None, min_identifier_rows: int) -> str | None:
    if stats is None:
        return f"it is marked {DROP!r}"
    if not stats.count:
        return "it has no value in the train rows (all missing)"
    return RECORDS[kind.kind].left_out(kind, stats, min_identifier_rows)


def missing_share(stats: ColumnStats) -> float:
    return stats.missing / (stats.count + stats.missing)


@dataclass
class ColumnEncoding:
    name: str
    kind: str
    encoder: ColumnEncoder
    missing_share: float = 0.0  # of the train rows: what the data Deck shows, not used to encode

    def write(self, column: pa.Array | pa.ChunkedArray, out: np.ndarray, first_row: int, source: str) -> None:
        """The column's encoded features into `out`, zeros (rows x its width)."""
        self.encoder.write(canonical(self.kind, column, Place(self.name, first_row, source)), out)

    def write_scaled(
        self,
        column: pa.Array,
        mean: np.ndarray,
        scale: np.ndarray,
        out: np.ndarray,
        first_row: int,
        source: str,
    ) -> None:
        """The column's encoded features standardised by `mean` and `scale` into `out` (width x rows)."""
        values = canonical(self.kind, column, Place(self.name, first_row, source))
        self.encoder.write_scaled(values, mean, scale, out)

    def category_codes(self, column: pa.Array, first_row: int, source: str) -> np.ndarray:
        """A categorical column's values as the places of their one-hot columns (`CategoryEncoding.codes`)."""
        return self.encoder.codes(canonical(self.kind, column, Place(self.name, first_row, source)))

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "missing_share": self.missing_share,
            **asdict(self.encoder),
        }

    @classmethod
    def from_dict(cls, saved: dict) -> ColumnEncoding:
        described = ("name", "kind", "missing_share")
        fields = {key: value for key, value in saved.items() if key not in described}
        encoder = RECORDS[saved["kind"]].encoder(**fields)
        return cls(saved["name"], saved["kind"], encoder, saved.get("missing_share", 0.0))


@dataclass
class FittedEncoding:
    columns: list[ColumnEncoding]  # in the encoded order
    left_out: dict[str, str]  # column -> the note that says why

    def encoded_names(self) -> list[str]:
        return [encoded for column in self.columns for encoded in column.encoder.names(column.name)]

    def transform(self, batch: pa.RecordBatch | pa.Table, first_row: int = 0, source: str = "") -> np.ndarray:
        """The batch's rows encoded (rows x len(encoded_names()), float64); other columns are ignored.
        Errors name a bad value's row as `first_row` plus its index in the batch, and `source`."""
        check_columns(batch.schema.names, [column.name for column in self.columns], source)
        widths = [column.encoder.width() for column in self.columns]
        out = np.zeros((batch.num_rows, sum(widths)))  # written in place: stacking blocks copied each twice
        start = 0
        for column, width in zip(self.columns, widths, strict=True):
            column.write(batch.column(column.name), out[:, start : start + width], first_row, source)
            start += width
        return out

    def transform_scaled(
        self, batch: pa.RecordBatch, mean: np.ndarray, scale: np.ndarray, first_row: int = 0, source: str = ""
    ) -> np.ndarray:
        """`transform`'s rows standardised by `mean` and `scale` (float64, one per encoded feature) as
        `scaling.standardise` does, bit for bit, laid out by feature: features x rows, float32. One-hot
        columns are never built in float64; a value beyond float32's range becomes inf."""
        check_columns(batch.schema.names, [column.name for column in self.columns], source)
        out = np.empty((len(mean), batch.num_rows), dtype=np.float32)
        start = 0
        for column in self.columns:
            part = slice(start, start + column.encoder.width())
            column.write_scaled(
                batch.column(column.name), mean[part], scale[part], out[part], first_row, source
            )
            start = part.stop
        return out

    def to_dict(self) -> dict:
        return {
            "version": ENCODING_VERSION,
            "columns": [column.to_dict() for column in self.columns],
            "left_out": dict(self.left_out),
        }

    @classmethod
    def from_dict(cls, saved: dict) -> FittedEncoding:
        check_version(saved)
        return cls([ColumnEncoding.from_dict(column) for column in saved["columns"]], dict(saved["left_out"]))


def check_version(saved: dict) -> None:
    if saved.get("version") != ENCODING_VERSION:
        raise ValueError(
            f"a feature encoding of version {saved.get('version')!r}; this code reads version {ENCODING_VERSION}"
        )
