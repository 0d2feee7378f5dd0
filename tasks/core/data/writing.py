"""Writing the prepared splits: each batch of the input encoded, standardised and hashed, then each row
appended to its split (train and val standardised, the test split raw), with its hash beside it."""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass
from functools import partial
from typing import IO

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from tasks.core.data.background import WriteBehind, ordered_map
from tasks.core.data.column_kinds import is_text, read_as_dictionary
from tasks.core.data.copies import hash_writer, row_hashes
from tasks.core.data.files import filesystem_for, is_local
from tasks.core.data.reading import iter_batches, with_offsets
from tasks.core.data.scaling import split_columns
from tasks.core.data.split_codes import SplitLayout, split_layout
from tasks.core.data.splits import SPLITS
from tasks.core.data.table import PreparedTable

# The split kept as raw feature values: evaluation scores it through the model bundle's loader, as a
# user scores the original rows; the others are standardised for the training loops.
RAW_SPLIT = "test"
# The prepared splits' row groups, at most: a training rank reads its part a row group at a time and
# the streamed epoch shuffles row groups, so small ones bound what two neighbouring ranks both decode
# (the one straddling their ranges) and mix the stream finely.
SPLIT_ROW_GROUP_ROWS = 16_384


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


@dataclass(frozen=True)
class SplitFiles:
    """Where one writer puts each split's rows and their hashes (`row_hashes`), by split; local paths or
    fsspec URIs."""

    rows: dict[str, str]
    hashes: dict[str, str]


def write_splits(
    dataset: ds.Dataset,
    uri: str,
    table: PreparedTable,
    files: SplitFiles,
    codes: np.ndarray,
    assignment: np.ndarray,
    first_row: int = 0,
) -> None:
    """Append each batch's rows to the split they belong to: encoded and standardised, or raw in the raw
    split; and their hashes to the split's hash file. `codes` and `assignment` hold the dataset's rows,
    the first of which is row `first_row` of the input (a row without a label is in no split). Batches are encoded a few at
    once (`ordered_map`) and written, a thread a split, while the next are encoded (`WriteBehind`)."""
    encoding, layout = table.fitted_encoding(), split_layout_of(table)
    hashed = [name for name in table.columns if name not in encoding.left_out]  # the columns the model reads
    categories = [column.name for column in encoding.columns if read_as_dictionary(column.kind)]
    batches = closing(iter_batches(dataset, uri, columns=table.columns, as_dictionary=categories))
    sinks = SplitSinks.open(table, dataset.schema, files.rows, files.hashes)

    def split_rows(numbered: tuple[int, pa.RecordBatch]) -> BatchRows:
        offset, batch = numbered
        rows = slice(offset, offset + batch.num_rows)
        stored = split_columns(encoding, batch, table.scaler, layout, first_row + offset, uri)
        scaled = feature_batch(stored, sinks.schemas["train"])
        return BatchRows(batch, scaled, codes[rows], assignment[rows], row_hashes(batch, hashed, codes[rows]))

    behind = WriteBehind(SPLITS)
    try:
        with batches as read:  # closed on a bad value too: the reading thread ends first
            for batch_rows in ordered_map(split_rows, with_offsets(read)):
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


def split_files(out_dir: str, part: int = 0) -> dict[str, str]:
    """Each split's part file number `part` under `out_dir` (a local folder or an fsspec URI): a split
    is a folder of parts, one per piece of the input that wrote it."""
    filesystem, root = filesystem_for(out_dir)
    paths = {name: f"{out_dir.rstrip('/')}/{name}/part-{part:05d}.parquet" for name in SPLITS}
    for name in SPLITS:
        filesystem.makedirs(f"{root.rstrip('/')}/{name}", exist_ok=True)
    return paths
