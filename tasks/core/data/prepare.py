"""Preparing a dataset in one pod: read, check, split, standardise and write the splits."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from tasks.core.data.assignment import SPLITS, SplitConfig, check_split_sizes, checked_assignment
from tasks.core.data.columns import feature_columns, non_feature_columns
from tasks.core.data.files import filesystem_for, is_local
from tasks.core.data.labels import clean_labels, encode_labels, label_case_warnings, label_kind, scan_labels
from tasks.core.data.reading import iter_batches, open_dataset
from tasks.core.data.scaling import (
    ScalerStats,
    batch_features,
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


@dataclass
class PreparedSplits:
    """Where the prepared splits were written, and what they hold."""

    paths: dict[str, str]  # by split
    table: PreparedTable

    def split_paths(self) -> SplitPaths:
        return self.table.split_paths(self.paths["train"], self.paths["val"])


def split_schema(features: list[str], label_column: str, split: str) -> pa.Schema:
    """Standardised float32 features, or the raw values as float64 in the raw split; class codes."""
    kind = pa.float64() if split == RAW_SPLIT else pa.float32()
    return pa.schema([(name, kind) for name in features] + [(label_column, pa.int64())])


def write_splits(
    dataset: ds.Dataset,
    uri: str,
    prepared: PreparedSplits,
    codes: np.ndarray,
    assignment: np.ndarray,
    first_row: int = 0,
) -> None:
    """Append each batch's rows to the split they belong to: standardised, or raw in the raw split.
    `codes` and `assignment` hold the dataset's rows, the first of which is row `first_row` of the input;
    `prepared.paths` may be fsspec URIs."""
    features, label = prepared.table.feature_names, prepared.table.label_column
    schemas = {name: split_schema(features, label, name) for name in SPLITS}
    writers = {name: split_writer(prepared.paths[name], schemas[name]) for name in SPLITS}
    try:
        offset = 0
        for batch in iter_batches(dataset, uri, columns=features):
            rows = slice(offset, offset + batch.num_rows)
            offset += batch.num_rows
            raw = batch_features(batch, features, np.float64)
            with np.errstate(over="ignore"):  # refused by name below
                scaled = standardise(raw, prepared.table.scaler)
            check_standardised(scaled, raw, features, first_row + rows.start, uri)
            for index, name in enumerate(SPLITS):
                keep = assignment[rows] == index
                if keep.any():
                    values = raw if name == RAW_SPLIT else scaled
                    by_column = np.ascontiguousarray(values[keep].T)  # one copy; each row is a column
                    columns = [pa.array(column) for column in by_column]
                    columns.append(pa.array(codes[rows][keep]))
                    table = pa.Table.from_arrays(columns, schema=schemas[name])
                    writers[name].write_table(table, row_group_size=SPLIT_ROW_GROUP_ROWS)
    finally:
        for writer in writers.values():
            writer.close()


def split_writer(path: str, schema: pa.Schema) -> pq.ParquetWriter:
    """A writer for a local file, or through fsspec for a remote one (a piece writes to the bucket)."""
    filesystem, file = filesystem_for(path)
    if is_local(filesystem):
        filesystem = None  # pyarrow's own, which writes faster than through fsspec
    # Dictionary encoding never pays off for float features; skipping it halves write time.
    return pq.ParquetWriter(file, schema, filesystem=filesystem, use_dictionary=False)


@dataclass
class RowSplit:
    """Every row's class code and split, decided from the label column of the whole input: the same
    rows land in each split however many pieces then read the features."""

    codes: np.ndarray
    class_labels: list[str]
    label_kind: str
    assignment: np.ndarray  # one byte per row: its index in SPLITS

    @classmethod
    def of(cls, labels: np.ndarray, uri: str, label_column: str, split: SplitConfig) -> RowSplit:
        """From the cleaned labels of every row (`clean_labels`), refusing a split the rows cannot fill."""
        codes, class_labels = encode_labels(labels, uri, label_column)
        check_split_sizes(codes, class_labels, split, uri, label_column)
        assignment = checked_assignment(codes, class_labels, split, uri)
        return cls(codes, class_labels, label_kind(labels), assignment)

    def table(
        self, features: list[str], label_column: str, uri: str, left_out: dict[str, str]
    ) -> PreparedTable:
        """What the splits hold, but the scaler: fitted afterwards on the train rows (`fitted_scaler`)."""
        counts = np.bincount(self.codes, minlength=len(self.class_labels))
        return PreparedTable(
            feature_names=features,
            label_column=label_column,
            class_labels=self.class_labels,
            class_counts={c: int(n) for c, n in zip(self.class_labels, counts, strict=True)},
            rows={name: int((self.assignment == i).sum()) for i, name in enumerate(SPLITS)},
            scaler=ScalerStats(mean=[], scale=[]),
            source=uri,
            label_kind=self.label_kind,
            notes=[*left_out.values(), *label_case_warnings(self.class_labels)],
        )


def split_files(out_dir: str, part: int = 0) -> dict[str, str]:
    """Each split's part file number `part` under `out_dir` (a local folder or an fsspec URI): a split
    is a folder of parts, one per piece of the input that wrote it."""
    filesystem, root = filesystem_for(out_dir)
    paths = {name: f"{out_dir.rstrip('/')}/{name}/part-{part:05d}.parquet" for name in SPLITS}
    for name in SPLITS:
        filesystem.makedirs(f"{root.rstrip('/')}/{name}", exist_ok=True)
    return paths


def prepare_dataset(uri: str, label_column: str, out_dir: str, split: SplitConfig) -> PreparedSplits:
    """Validate `uri` and write train/val/test parquet files under `out_dir`: standardised train and
    val splits, and the test split's raw features (`RAW_SPLIT`)."""
    dataset = open_dataset(uri, label_column)
    left_out = non_feature_columns(dataset, uri, label_column)
    features = feature_columns(dataset.schema, label_column, uri, left_out)
    from_csv = isinstance(dataset.format, ds.CsvFileFormat)
    labels = clean_labels(scan_labels(dataset, uri, label_column, features), uri, label_column, from_csv)
    rows = RowSplit.of(labels, uri, label_column, split)
    scaler = fitted_scaler(train_moments(dataset, uri, features, rows.assignment), features, uri)
    table = replace(rows.table(features, label_column, uri, left_out), scaler=scaler)
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
