"""Preparing a dataset in one pod: read, check, split, encode, standardise and write the splits.

The passes over the input: the label column alone decides every row's class and split; the train rows'
encoding statistics (every feature value read as its kind) give the encoding (encoding.py); the train
rows' encoded moments give the standardisation; then each row is written to its split, and its hash
beside it, so that rows copied from one split into another are counted (`copy_notes`).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import IO

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from tasks.core.data.assignment import (
    SPLITS,
    UNLABELLED,
    SplitConfig,
    SplitTimes,
    assign_splits,
    check_split_sizes,
    checked_assignment,
    split_times,
    time_assignment,
)
from tasks.core.data.background import WriteBehind, ordered_map
from tasks.core.data.column_kinds import CATEGORICAL, ColumnKind, is_text, propose_kinds
from tasks.core.data.columns import feature_columns, non_feature_columns
from tasks.core.data.copies import copy_notes, hash_files, hash_writer, row_hashes
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
from tasks.core.data.scaling import ScalerStats, split_columns, train_scaler
from tasks.core.data.split_codes import SplitLayout, split_layout
from tasks.core.data.splits import SplitPaths
from tasks.core.data.table import PreparedTable
from tasks.core.data.target import (
    Target,
    decide_problem_type,
    fitted_target,
    quantile_bins,
    regression_values,
)

# The split kept as raw feature values: evaluation scores it through the model bundle's loader, as a
# user scores the original rows; the others are standardised for the training loops.
RAW_SPLIT = "test"
# The prepared splits' row groups, at most: a training rank reads its part a row group at a time and
# the streamed epoch shuffles row groups, so small ones bound what two neighbouring ranks both decode
# (the one straddling their ranges) and mix the stream finely.
SPLIT_ROW_GROUP_ROWS = 16_384
EMBEDDED_DIGITS_LABEL = "label"


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


def split_layout_of(table: PreparedTable) -> SplitLayout:
    """The stored feature columns of `table`'s standardised splits (split_codes.py)."""
    mean, scale = np.asarray(table.scaler.mean, np.float64), np.asarray(table.scaler.scale, np.float64)
    return split_layout(table.fitted_encoding(), mean, scale, table.label_column)


def split_schema(table: PreparedTable, raw: pa.Schema, split: str) -> pa.Schema:
    """Standardised float32 encoded features, categories as codes with the metadata that expands them
    (split_codes.py), or in the raw split the input's feature columns as read (`raw`, the input's
    schema); then the class codes, or a regression's label (`split_labels`)."""
    metadata = None
    if split == RAW_SPLIT:
        fields = [raw.field(name) for name in table.columns]
    else:
        layout = split_layout_of(table)
        fields, metadata = layout.fields, layout.metadata()
    label_type = pa.int64()
    if table.target.regression:
        label_type = pa.float64() if split == RAW_SPLIT else pa.float32()
    return pa.schema([*fields, pa.field(table.label_column, label_type)], metadata=metadata)


def split_labels(table: PreparedTable, codes: np.ndarray, split: str) -> pa.Array:
    """A split's label column: class codes; a regression's label as read in the raw split, else
    standardised as the model learns it."""
    if not table.target.regression:
        return pa.array(codes, pa.int64())
    return pa.array(codes if split == RAW_SPLIT else table.target.standardised(codes))


def write_splits(
    dataset: ds.Dataset,
    uri: str,
    prepared: PreparedSplits,
    codes: np.ndarray,
    assignment: np.ndarray,
    hash_paths: dict[str, str],
    first_row: int = 0,
) -> None:
    """Append each batch's rows to the split they belong to: encoded and standardised, or raw in the raw
    split; and their hashes to the split's file in `hash_paths` (`row_hashes`). `codes` and `assignment`
    hold the dataset's rows, the first of which is row `first_row` of the input (a row without a label
    is in no split); `prepared.paths` and `hash_paths` may be fsspec URIs. Batches are encoded a few at
    once (`ordered_map`) and written, a thread a split, while the next are encoded (`WriteBehind`)."""
    table = prepared.table
    encoding, layout = table.fitted_encoding(), split_layout_of(table)
    hashed = [name for name in table.columns if name not in encoding.left_out]  # the columns the model reads
    categories = [column.name for column in encoding.columns if column.kind == CATEGORICAL]
    batches = iter_batches(dataset, uri, columns=table.columns, as_dictionary=categories)
    sinks = SplitSinks.open(table, dataset.schema, prepared.paths, hash_paths)

    def split_rows(numbered: tuple[int, pa.RecordBatch]) -> BatchRows:
        offset, batch = numbered
        rows = slice(offset, offset + batch.num_rows)
        stored = split_columns(encoding, batch, table.scaler, layout, first_row + offset, uri)
        scaled = feature_batch(stored, sinks.schemas["train"])
        return BatchRows(batch, scaled, codes[rows], assignment[rows], row_hashes(batch, hashed, codes[rows]))

    behind = WriteBehind(SPLITS)
    try:
        for batch_rows in ordered_map(split_rows, with_offsets(batches)):
            for name in SPLITS:
                behind.submit(name, partial(sinks.write, name, batch_rows))
    finally:
        try:
            behind.finish()
        finally:
            sinks.close()


@dataclass
class BatchRows:
    """A batch's rows as read (`raw`) and as the standardised splits store them (`scaled`), with their
    class codes (or a regression's values), splits and hashes."""

    raw: pa.RecordBatch
    scaled: pa.RecordBatch
    codes: np.ndarray
    assignment: np.ndarray
    hashes: np.ndarray


@dataclass
class SplitSinks:
    """Each split's parquet writer and file of row hashes, and what it holds (`split_schema`)."""

    table: PreparedTable
    schemas: dict[str, pa.Schema]
    writers: dict[str, pq.ParquetWriter]
    hash_sinks: dict[str, IO[bytes]]

    @classmethod
    def open(
        cls, table: PreparedTable, raw: pa.Schema, paths: dict[str, str], hash_paths: dict[str, str]
    ) -> SplitSinks:
        schemas = {name: split_schema(table, raw, name) for name in SPLITS}
        writers = {name: split_writer(paths[name], schemas[name]) for name in SPLITS}
        return cls(table, schemas, writers, {name: hash_writer(hash_paths[name]) for name in SPLITS})

    def write(self, split: str, rows: BatchRows) -> None:
        """The batch's rows of `split`, raw in the raw split, else standardised; and their hashes."""
        keep = rows.assignment == SPLITS.index(split)
        if keep.any():
            labels = split_labels(self.table, rows.codes[keep], split)
            kept = raw_rows(rows.raw if split == RAW_SPLIT else rows.scaled, keep, self.schemas[split])
            part = pa.Table.from_arrays([*kept, labels], schema=self.schemas[split])
            self.writers[split].write_table(part, row_group_size=SPLIT_ROW_GROUP_ROWS)
            self.hash_sinks[split].write(rows.hashes[keep].astype("<u8", copy=False).tobytes())

    def close(self) -> None:
        for writer in [*self.writers.values(), *self.hash_sinks.values()]:
            writer.close()


def raw_rows(batch: pa.RecordBatch, keep: np.ndarray, schema: pa.Schema) -> list[pa.Array]:
    """The kept rows of each column, as `schema` types it: text read as a dictionary is written as text."""
    columns = batch.filter(pa.array(keep)).columns
    fields = list(schema)[: len(columns)]  # the label follows
    return [c.cast(f.type) if c.type != f.type else c for c, f in zip(columns, fields, strict=True)]


def feature_batch(stored: list[np.ndarray], schema: pa.Schema) -> pa.RecordBatch:
    """The split's stored feature columns (`split_columns`) as a batch, each a view of its values; Arrow
    then filters each split's rows in one copy."""
    return pa.RecordBatch.from_arrays([pa.array(values) for values in stored], names=schema.names[:-1])


def split_writer(path: str, schema: pa.Schema) -> pq.ParquetWriter:
    """A writer for a local file, or through fsspec for a remote one (a piece writes to the bucket)."""
    filesystem, file = filesystem_for(path)
    if is_local(filesystem):
        filesystem = None  # pyarrow's own, which writes faster than through fsspec
    # Dictionary encoding never pays off for float features (skipping it halves write time); it does
    # for the raw split's text.
    text = [f.name for f in schema if is_text(f.type) or pa.types.is_dictionary(f.type)]
    return pq.ParquetWriter(file, schema, filesystem=filesystem, use_dictionary=text or False)


def with_copy_notes(prepared: PreparedSplits, out_dir: str) -> PreparedSplits:
    """`prepared` with notes on the rows copied between its splits (`copy_notes`)."""
    notes = [*prepared.table.notes, *copy_notes(out_dir, prepared.table.rows)]
    return replace(prepared, table=replace(prepared.table, notes=notes))


@dataclass
class RowSplit:
    """Every row's class code and split, decided from the label column of the whole input: the same
    rows land in each split however many pieces then read the features. A row without a label is in
    no split (`UNLABELLED`, code -1). A regression's `codes` are the label's values (float64, NaN
    where missing) and it has no classes."""

    codes: np.ndarray
    class_labels: list[str]
    label_kind: str
    assignment: np.ndarray  # one byte per row: its index in SPLITS, or UNLABELLED
    notes: list[str] = field(default_factory=list)  # the rows left out for want of a label
    target: Target = field(default_factory=Target)

    @classmethod
    def of(
        cls, labels: Labels, uri: str, label_column: str, split: SplitConfig, times: SplitTimes | None = None
    ) -> RowSplit:
        """From the cleaned labels of every row (`clean_labels`), refusing a split the rows cannot fill;
        with the `times` of every row (`split_times`), in time order rather than at random."""
        pa.default_memory_pool().release_unused()  # the label column's Arrow memory, read and cleaned
        text = labels.distinct.dtype == object  # its type decides alone: each row's text is not needed
        values = labels.distinct if text else labels.values
        target = decide_problem_type(values, split.problem_type, uri, label_column)
        if target.regression:
            return cls.of_numbers(labels, uri, label_column, split, times, target)
        codes, class_labels = encode_labels(labels, uri, label_column)
        if times is None:
            check_split_sizes(codes, class_labels, split, uri, label_column)
            assignment, notes = checked_assignment(codes, class_labels, split, uri), []
        else:
            labelled = times.labelled(labels.missing)
            assignment, notes = time_assignment(codes, class_labels, labelled, split, uri)
        return cls(
            every_row(codes, labels.missing, -1),
            class_labels,
            label_kind(labels.distinct),
            every_row(assignment, labels.missing, UNLABELLED),
            [*labels.note(label_column), *notes],
            target,
        )

    @classmethod
    def of_numbers(
        cls,
        labels: Labels,
        uri: str,
        label_column: str,
        split: SplitConfig,
        times: SplitTimes | None,
        target: Target,
    ) -> RowSplit:
        """A regression's rows: split at random stratified by the label's quantile bins (or in time
        order), and the label's train mean and deviation fitted."""
        values = regression_values(labels.values, uri, label_column)
        if times is None:
            assignment = assign_splits(quantile_bins(values), split)
            notes = [
                "split at random, stratified by quantile bins of the label (each split covers its range)"
            ]
        else:
            one_class = np.zeros(len(values), dtype=np.int64)
            assignment, notes = time_assignment(
                one_class, [label_column], times.labelled(labels.missing), split, uri
            )
        target = fitted_target(target, values[assignment == SPLITS.index("train")], uri, label_column)
        return cls(
            every_row(values, labels.missing, np.nan),
            [],
            label_kind(labels.distinct),
            every_row(assignment, labels.missing, UNLABELLED),
            [*labels.note(label_column), *notes],
            target,
        )

    def table(
        self, columns: list[str], label_column: str, uri: str, left_out: dict[str, str]
    ) -> PreparedTable:
        """What the splits hold, but the encoding and the scaler: fitted afterwards on the train rows
        (`with_encoding`, `train_scaler`)."""
        classes = self.class_labels
        counts = np.bincount(self.codes + 1, minlength=len(classes) + 1)[1:] if classes else []  # -1: none
        rows = np.bincount(self.assignment, minlength=len(SPLITS))
        return PreparedTable(
            feature_names=[],
            label_column=label_column,
            class_labels=self.class_labels,
            class_counts={c: int(n) for c, n in zip(self.class_labels, counts, strict=True)},
            rows={name: int(rows[i]) for i, name in enumerate(SPLITS)},
            scaler=ScalerStats(mean=[], scale=[]),
            source=uri,
            label_kind=self.label_kind,
            notes=[*left_out.values(), *label_case_warnings(self.class_labels), *self.notes],
            columns=columns,
            target=self.target,
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
    categories = [name for name, kind in kinds.items() if kind.kind == CATEGORICAL]
    batches = iter_batches(dataset, uri, columns=list(kinds), as_dictionary=categories)

    def train_stats(numbered: tuple[int, pa.RecordBatch]) -> EncodingStats:
        offset, batch = numbered
        in_train = assignment[offset : offset + batch.num_rows] == SPLITS.index("train")
        return batch_stats(kinds, batch, first_row + offset, in_train, uri)

    stats = EncodingStats.empty(kinds)
    for batch_stats_ in ordered_map(train_stats, with_offsets(batches)):
        stats = stats.merge(batch_stats_)
    return stats


def with_offsets(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Each batch with the number of rows before it."""
    offset = 0
    for batch in batches:
        yield offset, batch
        offset += batch.num_rows


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
    rows = RowSplit.of(labels, uri, label_column, split, split_times([dataset], uri, split, label_column))
    del labels  # 8 bytes a row of text labels, not kept: the rows' codes stand for them now
    stats = train_encoding_stats(dataset, uri, kinds, rows.assignment)
    table = with_encoding(rows.table(columns, label_column, uri, left_out), fit_encoding(stats, uri))
    table = replace(table, scaler=train_scaler(stats, table.fitted_encoding(), uri))
    prepared = PreparedSplits(paths=split_files(out_dir), table=table)
    write_splits(dataset, uri, prepared, rows.codes, rows.assignment, hash_files(out_dir))
    return with_copy_notes(prepared, out_dir)


def write_embedded_digits(directory: str | None = None) -> str:
    """scikit-learn's bundled handwritten digits (1797 x 64, 10 classes) as parquet; no network."""
    from sklearn.datasets import load_digits

    digits = load_digits(as_frame=True)
    frame = digits.frame.rename(columns={"target": EMBEDDED_DIGITS_LABEL})
    directory = directory or tempfile.mkdtemp(prefix="mixedml-digits-")
    path = str(Path(directory) / "digits.parquet")
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return path
