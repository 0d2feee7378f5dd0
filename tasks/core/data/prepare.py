"""Preparing a dataset in one pod: read, check, split, encode, standardise and write the splits.

The passes over the input: the label column alone decides every row's class and split; the train rows'
encoding statistics (every feature value read as its kind) give the encoding (encoding.py); the train
rows' encoded moments give the standardisation; then each row is written to its split.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from tasks.core.data.assignment import (
    SPLITS,
    UNLABELLED,
    SplitConfig,
    check_split_sizes,
    checked_assignment,
)
from tasks.core.data.column_kinds import ColumnKind, is_text, propose_kinds
from tasks.core.data.columns import feature_columns, non_feature_columns
from tasks.core.data.encoding import EncodingStats, FittedEncoding, batch_stats
from tasks.core.data.files import DatasetError, filesystem_for, is_local
from tasks.core.data.labels import (
    Labels,
    clean_labels,
    encode_labels,
    label_case_warnings,
    label_kind,
    scan_labels,
)
from tasks.core.data.reading import iter_batches, open_dataset
from tasks.core.data.scaling import (
    ScalerStats,
    check_standardised,
    fitted_scaler,
    standardise,
    train_moments,
)
from tasks.core.data.splits import SplitPaths

# The split kept as raw feature values: evaluation scores it through the model bundle's loader, as a
# user scores the original rows; the others are standardised for the training loops.
RAW_SPLIT = "test"
# The prepared splits' row groups, at most: a training rank reads its part a row group at a time and
# the streamed epoch shuffles row groups, so small ones bound what two neighbouring ranks both decode
# (the one straddling their ranges) and mix the stream finely.
SPLIT_ROW_GROUP_ROWS = 16_384
EMBEDDED_DIGITS_LABEL = "label"


@dataclass
class PreparedTable:
    """What the prepared splits hold. The splits written here (`PreparedSplits`) and the task
    boundary's `PreparedData` both carry it as it is."""

    feature_names: list[str]  # in the order the model reads them
    label_column: str  # holds class codes into `class_labels`
    class_labels: list[str]
    class_counts: dict[str, int]
    rows: dict[str, int]  # by split
    scaler: ScalerStats  # fitted on the train split
    source: str = ""  # the input, as reports name it
    label_kind: str = "string"  # what the class labels were before they became text: see LABEL_KINDS
    notes: list[str] = field(default_factory=list)  # e.g. case-only class differences, columns left out
    # The input's feature columns as read (strings, dates, nulls), in the input's order, and the
    # encoding fitted on the train split that turns them into `feature_names`: the JSON text of
    # `FittedEncoding.to_dict()` (text, so that it crosses task boundaries as one plain literal).
    # Both empty in a table prepared before encodings existed: its features were numbers, read as they are.
    columns: list[str] = field(default_factory=list)
    encoding: str = ""

    def split_paths(self, train: str, val: str) -> SplitPaths:
        """The train and val splits at these paths, as the training loops read them."""
        return SplitPaths(train, val, self.feature_names, self.label_column, len(self.class_labels))

    def fitted_encoding(self) -> FittedEncoding:
        return FittedEncoding.from_dict(json.loads(self.encoding))


def with_encoding(table: PreparedTable, encoding: str) -> PreparedTable:
    """`table` with the encoding fitted on its train rows (the JSON text of `FittedEncoding.to_dict()`):
    the encoded features are what the model reads, and the notes say which columns it left out."""
    fitted = FittedEncoding.from_dict(json.loads(encoding))
    notes = [*table.notes, *fitted.left_out.values()]
    return replace(table, feature_names=fitted.encoded_names(), encoding=encoding, notes=notes)


@dataclass
class PreparedSplits:
    """Where the prepared splits were written, and what they hold."""

    paths: dict[str, str]  # by split
    table: PreparedTable

    def split_paths(self) -> SplitPaths:
        return self.table.split_paths(self.paths["train"], self.paths["val"])


def split_schema(table: PreparedTable, raw: pa.Schema, split: str) -> pa.Schema:
    """Standardised float32 encoded features, or in the raw split the input's feature columns as read
    (`raw`, the input's schema); then the class codes."""
    if split == RAW_SPLIT:
        fields = [raw.field(name) for name in table.columns]
    else:
        fields = [pa.field(name, pa.float32()) for name in table.feature_names]
    return pa.schema([*fields, pa.field(table.label_column, pa.int64())])


def write_splits(
    dataset: ds.Dataset,
    uri: str,
    prepared: PreparedSplits,
    codes: np.ndarray,
    assignment: np.ndarray,
    first_row: int = 0,
) -> None:
    """Append each batch's rows to the split they belong to: encoded and standardised, or raw in the raw
    split. `codes` and `assignment` hold the dataset's rows, the first of which is row `first_row` of the
    input (a row without a label is in no split); `prepared.paths` may be fsspec URIs."""
    table = prepared.table
    encoding, features = table.fitted_encoding(), table.feature_names
    schemas = {name: split_schema(table, dataset.schema, name) for name in SPLITS}
    writers = {name: split_writer(prepared.paths[name], schemas[name]) for name in SPLITS}
    try:
        offset = 0
        for batch in iter_batches(dataset, uri, columns=table.columns):
            rows = slice(offset, offset + batch.num_rows)
            offset += batch.num_rows
            encoded = encoding.transform(batch, first_row + rows.start, uri)
            with np.errstate(over="ignore"):  # refused by name below
                scaled = standardise(encoded, table.scaler)
            check_standardised(scaled, encoded, features, first_row + rows.start, uri)
            for index, name in enumerate(SPLITS):
                keep = assignment[rows] == index
                if keep.any():
                    labels = pa.array(codes[rows][keep], pa.int64())
                    rows_kept = raw_rows(batch, keep) if name == RAW_SPLIT else scaled_rows(scaled, keep)
                    part = pa.Table.from_arrays([*rows_kept, labels], schema=schemas[name])
                    writers[name].write_table(part, row_group_size=SPLIT_ROW_GROUP_ROWS)
    finally:
        for writer in writers.values():
            writer.close()


def raw_rows(batch: pa.RecordBatch, keep: np.ndarray) -> list[pa.Array]:
    return batch.filter(pa.array(keep)).columns


def scaled_rows(scaled: np.ndarray, keep: np.ndarray) -> list[pa.Array]:
    by_column = np.ascontiguousarray(scaled[keep].T)  # one copy; each row is a column
    return [pa.array(column) for column in by_column]


def split_writer(path: str, schema: pa.Schema) -> pq.ParquetWriter:
    """A writer for a local file, or through fsspec for a remote one (a piece writes to the bucket)."""
    filesystem, file = filesystem_for(path)
    if is_local(filesystem):
        filesystem = None  # pyarrow's own, which writes faster than through fsspec
    # Dictionary encoding never pays off for float features (skipping it halves write time); it does
    # for the raw split's text.
    text = [f.name for f in schema if is_text(f.type) or pa.types.is_dictionary(f.type)]
    return pq.ParquetWriter(file, schema, filesystem=filesystem, use_dictionary=text or False)


@dataclass
class RowSplit:
    """Every row's class code and split, decided from the label column of the whole input: the same
    rows land in each split however many pieces then read the features. A row without a label is in
    no split (`UNLABELLED`, code -1)."""

    codes: np.ndarray
    class_labels: list[str]
    label_kind: str
    assignment: np.ndarray  # one byte per row: its index in SPLITS, or UNLABELLED
    notes: list[str] = field(default_factory=list)  # the rows left out for want of a label

    @classmethod
    def of(cls, labels: Labels, uri: str, label_column: str, split: SplitConfig) -> RowSplit:
        """From the cleaned labels of every row (`clean_labels`), refusing a split the rows cannot fill."""
        codes, class_labels = encode_labels(labels.values, uri, label_column)
        check_split_sizes(codes, class_labels, split, uri, label_column)
        assignment = checked_assignment(codes, class_labels, split, uri)
        return cls(
            every_row(codes, labels.missing, -1),
            class_labels,
            label_kind(labels.values),
            every_row(assignment, labels.missing, UNLABELLED),
            labels.note(label_column),
        )

    def table(
        self, columns: list[str], label_column: str, uri: str, left_out: dict[str, str]
    ) -> PreparedTable:
        """What the splits hold, but the encoding and the scaler: fitted afterwards on the train rows
        (`with_encoding`, `fitted_scaler`)."""
        counts = np.bincount(self.codes[self.codes >= 0], minlength=len(self.class_labels))
        return PreparedTable(
            feature_names=[],
            label_column=label_column,
            class_labels=self.class_labels,
            class_counts={c: int(n) for c, n in zip(self.class_labels, counts, strict=True)},
            rows={name: int((self.assignment == i).sum()) for i, name in enumerate(SPLITS)},
            scaler=ScalerStats(mean=[], scale=[]),
            source=uri,
            label_kind=self.label_kind,
            notes=[*left_out.values(), *label_case_warnings(self.class_labels), *self.notes],
            columns=columns,
        )


def every_row(values: np.ndarray, missing: np.ndarray, fill: int) -> np.ndarray:
    """`values` of the labelled rows spread over every row, `fill` where the label is missing."""
    spread = np.full(len(missing), fill, dtype=values.dtype)
    spread[~missing] = values
    return spread


def feature_kinds(
    dataset: ds.Dataset, uri: str, columns: list[str], overrides: Mapping[str, str] | None = None
) -> dict[str, ColumnKind]:
    """Each feature column's kind, from its type and the first batch's values, or as the user's
    `overrides` (column -> kind or 'drop') say (`propose_kinds`)."""
    sample = next((batch for batch in iter_batches(dataset, uri, columns=columns) if batch.num_rows), None)
    try:
        return propose_kinds(dataset.schema, columns, overrides, sample=sample)
    except DatasetError as err:
        raise DatasetError(f"{uri}: {err}") from None


def train_encoding_stats(
    dataset: ds.Dataset, uri: str, kinds: dict[str, ColumnKind], assignment: np.ndarray, first_row: int = 0
) -> EncodingStats:
    """The encoding statistics of the train rows, merged batch by batch; every row's feature values are
    read as their kinds, and a bad one refused by column and row. `assignment` holds the splits of the
    dataset's rows, the first of which is row `first_row` of the input."""
    stats = EncodingStats.empty(kinds)
    offset = 0
    for batch in iter_batches(dataset, uri, columns=list(kinds)):
        in_train = assignment[offset : offset + batch.num_rows] == SPLITS.index("train")
        stats = stats.merge(batch_stats(kinds, batch, first_row + offset, in_train, uri))
        offset += batch.num_rows
    return stats


def fit_encoding(stats: EncodingStats, uri: str) -> str:
    """The encoding the train rows' statistics give, as the JSON text `PreparedTable.encoding` holds."""
    try:
        return json.dumps(stats.fit().to_dict())
    except DatasetError as err:
        raise DatasetError(f"{uri}: {err}") from None


def split_files(out_dir: str, part: int = 0) -> dict[str, str]:
    """Each split's part file number `part` under `out_dir` (a local folder or an fsspec URI): a split
    is a folder of parts, one per piece of the input that wrote it."""
    filesystem, root = filesystem_for(out_dir)
    paths = {name: f"{out_dir.rstrip('/')}/{name}/part-{part:05d}.parquet" for name in SPLITS}
    for name in SPLITS:
        filesystem.makedirs(f"{root.rstrip('/')}/{name}", exist_ok=True)
    return paths


def prepare_dataset(
    uri: str,
    label_column: str,
    out_dir: str,
    split: SplitConfig,
    column_kinds: Mapping[str, str] | None = None,
) -> PreparedSplits:
    """Validate `uri` and write train/val/test parquet files under `out_dir`: encoded and standardised
    train and val splits, and the test split's raw feature columns (`RAW_SPLIT`)."""
    dataset = open_dataset(uri, label_column)
    left_out = non_feature_columns(dataset, uri, label_column)
    columns = feature_columns(dataset.schema, label_column, uri, left_out)
    kinds = feature_kinds(dataset, uri, columns, column_kinds)
    from_csv = isinstance(dataset.format, ds.CsvFileFormat)
    labels = clean_labels(scan_labels(dataset, uri, label_column), uri, label_column, from_csv)
    rows = RowSplit.of(labels, uri, label_column, split)
    encoding = fit_encoding(train_encoding_stats(dataset, uri, kinds, rows.assignment), uri)
    table = with_encoding(rows.table(columns, label_column, uri, left_out), encoding)
    moments = train_moments(dataset, uri, table.fitted_encoding(), rows.assignment)
    table = replace(table, scaler=fitted_scaler(moments, table.feature_names, uri))
    prepared = PreparedSplits(paths=split_files(out_dir), table=table)
    write_splits(dataset, uri, prepared, rows.codes, rows.assignment)
    return prepared


def write_embedded_digits(directory: str | None = None) -> str:
    """scikit-learn's bundled handwritten digits (1797 x 64, 10 classes) as parquet; no network."""
    from sklearn.datasets import load_digits

    digits = load_digits(as_frame=True)
    frame = digits.frame.rename(columns={"target": EMBEDDED_DIGITS_LABEL})
    directory = directory or tempfile.mkdtemp(prefix="mixedml-digits-")
    path = str(Path(directory) / "digits.parquet")
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return path
