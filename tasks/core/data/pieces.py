"""Preprocessing an input too large for one pod, in pieces that give what one pod gives.

1. `plan_pieces` cuts the input, from its metadata, into contiguous pieces: runs of its part files, or
   of a parquet file's row groups, of about equal size.
2. `assign_pieces` reads only the label column (and a time column to split by), of every piece in
   turn, and decides every row's class and split exactly as one pod does (`RowSplit`); it saves the split assignment (one byte a row) and
   notes where each piece's rows start in it. It proposes the feature columns' kinds from the input's
   first batch, as one pod does.
3. `piece_stats`: each piece reads its feature values as their kinds (refusing a bad one by its row in
   the input) and gives the encoding statistics of its train rows; they merge exactly, so
   `merged_encoding` fits, once, the encoding one pass over the rows fits, and `merged_scaler` the
   standardisation it fits, within float64 rounding (`train_scaler`).
4. `write_piece`: each piece writes its rows of each split as the part file numbered by its index,
   so a split is a folder of parts holding the same rows, in the same order, as one pod writes; and
   their hashes beside them, from which `collected` counts the rows copied between splits as one pod
   does (`copy_notes`).
Step 4 reads the layout with the fitted encoding (`encoded`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from itertools import groupby

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from tasks.core.data.assignment import SPLITS, SplitConfig, split_times
from tasks.core.data.column_kinds import ColumnKind, declared
from tasks.core.data.columns import feature_columns, non_feature_columns
from tasks.core.data.copies import hash_files
from tasks.core.data.encoding import EncodingStats
from tasks.core.data.files import row_group_fragments
from tasks.core.data.labels import Labels, clean_labels
from tasks.core.data.prepare import (
    PreparedSplits,
    PreparedTable,
    RowSplit,
    every_row,
    feature_kinds,
    fit_encoding,
    train_encoding_stats,
    with_copy_notes,
    with_encoding,
)
from tasks.core.data.reading import iter_batches, open_dataset
from tasks.core.data.scaling import ScalerStats, train_scaler
from tasks.core.data.writing import SplitFiles, split_files, write_splits


@dataclass
class DataPiece:
    """Some contiguous rows of the input: whole files, or runs of a parquet file's row groups."""

    index: int
    files: list[str]  # as the input's filesystem names them, in the order the rows are read
    row_groups: list[list[int]]  # per file, the row groups read; empty: the whole file


@dataclass
class PieceLayout:
    """What every piece shares: the rows' classes and splits were decided over the whole input."""

    uri: str
    # What the splits hold; its encoding is empty until the pieces' statistics merge (`encoded`), its
    # scaler until their moments do.
    table: PreparedTable
    pieces: list[DataPiece]
    first_rows: list[int]  # each piece's first row in the input, then the input's row count
    output: str  # the folder (local or fsspec URI) that holds a folder of parts per split
    kinds: dict[str, ColumnKind] = field(default_factory=dict)  # of every feature column

    def rows_of(self, piece: DataPiece) -> slice:
        return slice(self.first_rows[piece.index], self.first_rows[piece.index + 1])


@dataclass(frozen=True)
class ReadUnit:
    """The smallest run of rows a piece takes: a parquet row group, or a whole CSV file."""

    file: str
    row_group: int | None
    size: int  # rows of a row group, bytes of a CSV file: what the pieces are balanced on


def plan_pieces(uri: str, label_column: str, count: int) -> list[DataPiece]:
    """At most `count` contiguous pieces of about equal size; fewer when the input has fewer units."""
    units = read_units(open_dataset(uri, label_column))
    total = max(sum(unit.size for unit in units), 1)
    before, groups = 0, {}
    for unit in units:
        middle = before + unit.size / 2  # the unit goes to the piece its middle falls in
        groups.setdefault(min(count - 1, int(middle * count / total)), []).append(unit)
        before += unit.size
    return [piece_of(index, group) for index, group in enumerate(groups.values())]


def read_units(dataset: ds.Dataset) -> list[ReadUnit]:
    units = []
    for fragment in dataset.get_fragments():
        if isinstance(fragment, ds.ParquetFileFragment):
            units += [ReadUnit(fragment.path, group.id, group.num_rows) for group in fragment.row_groups]
        else:
            units.append(ReadUnit(fragment.path, None, dataset.filesystem.get_file_info(fragment.path).size))
    return units


def piece_of(index: int, units: list[ReadUnit]) -> DataPiece:
    by_file = [(file, list(run)) for file, run in groupby(units, key=lambda unit: unit.file)]
    row_groups = [[unit.row_group for unit in run if unit.row_group is not None] for _, run in by_file]
    return DataPiece(index, [file for file, _ in by_file], row_groups)


def piece_dataset(dataset: ds.Dataset, piece: DataPiece) -> ds.Dataset:
    """The piece's rows of the whole input's dataset, read with its schema and format. A row group is
    a fragment of its own, as one pod reads no more of a file ahead than that."""
    wanted = dict(zip(piece.files, piece.row_groups, strict=True))
    fragments = []
    for fragment in dataset.get_fragments():
        if fragment.path in wanted:
            groups = wanted[fragment.path]
            fragments += row_group_fragments(fragment, groups) if groups else [fragment]
    return ds.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem)


def label_column_of(dataset: ds.Dataset, uri: str, label_column: str) -> pa.ChunkedArray:
    batches = iter_batches(dataset, uri, columns=[label_column])
    return pa.chunked_array(
        [batch.column(label_column) for batch in batches], type=dataset.schema.field(label_column).type
    )


def assign_pieces(
    uri: str,
    label_column: str,
    split: SplitConfig,
    pieces: list[DataPiece],
    output: str,
    assignment_file: str,
    column_kinds: Mapping[str, str] | None = None,
) -> PieceLayout:
    """Every row's class and split from the label column alone (and the `split.split_by` column, read
    piece by piece in the input's order: the cuts come from every row's value, as in one pod), as
    `prepare_dataset` decides them; the assignment is saved to `assignment_file` (.npy, one byte a row)."""
    dataset = open_dataset(uri, label_column, column_kinds=column_kinds)
    left_out = non_feature_columns(dataset, uri, label_column)
    columns = feature_columns(dataset.schema, label_column, uri, left_out)
    kinds = feature_kinds(dataset, uri, columns, column_kinds)
    labels = [label_column_of(piece_dataset(dataset, piece), uri, label_column) for piece in pieces]
    first_rows = np.cumsum([0] + [len(column) for column in labels]).tolist()
    whole = pa.chunked_array([chunk for column in labels for chunk in column.chunks], type=labels[0].type)
    from_csv = isinstance(dataset.format, ds.CsvFileFormat)
    times = split_times([piece_dataset(dataset, piece) for piece in pieces], uri, split, label_column)
    rows = RowSplit.of(clean_labels(whole, uri, label_column, from_csv), uri, label_column, split, times)
    np.save(assignment_file, rows.assignment)
    table = rows.table(columns, label_column, uri, left_out, split)
    return PieceLayout(uri, table, pieces, first_rows, output, kinds)


def piece_stats(layout: PieceLayout, piece: DataPiece, assignment: np.ndarray) -> EncodingStats:
    """The encoding statistics of the piece's train rows, once every feature value of the piece is read
    as its kind."""
    dataset = piece_dataset(
        open_dataset(layout.uri, layout.table.label_column, column_kinds=declared(layout.kinds)), piece
    )
    rows = layout.rows_of(piece)
    return train_encoding_stats(dataset, layout.uri, layout.kinds, assignment[rows], rows.start)


def merged_stats(layout: PieceLayout, stats: list[EncodingStats]) -> EncodingStats:
    total = EncodingStats.empty(layout.kinds)
    for piece in stats:
        total = total.merge(piece)
    return total


def merged_encoding(layout: PieceLayout, stats: list[EncodingStats]) -> str:
    """The encoding fitted on every piece's train rows: the JSON text `encoded` reads."""
    return fit_encoding(merged_stats(layout, stats), layout.uri)


def encoded(layout: PieceLayout, encoding: str) -> PieceLayout:
    """The layout whose table holds the fitted encoding (`merged_encoding`): the encoded features."""
    return replace(layout, table=with_encoding(layout.table, encoding))


def merged_scaler(layout: PieceLayout, stats: list[EncodingStats]) -> ScalerStats:
    """The standardisation fitted on every piece's train rows; `layout` is `encoded`."""
    return train_scaler(merged_stats(layout, stats), layout.table.fitted_encoding(), layout.uri)


def write_piece(
    layout: PieceLayout, piece: DataPiece, assignment: np.ndarray, scaler: ScalerStats
) -> dict[str, int]:
    """Write the piece's rows of each split as part `piece.index`; the rows written, by split. `layout`
    is `encoded`."""
    label_column = layout.table.label_column
    dataset = piece_dataset(
        open_dataset(layout.uri, label_column, column_kinds=declared(layout.kinds)), piece
    )
    from_csv = isinstance(dataset.format, ds.CsvFileFormat)
    column = label_column_of(dataset, layout.uri, label_column)
    labels = clean_labels(column, layout.uri, label_column, from_csv, layout.table.label_kind)
    codes = encode_as(labels, layout)
    rows = layout.rows_of(piece)
    table, paths = replace(layout.table, scaler=scaler), split_files(layout.output, piece.index)
    hashes = hash_files(layout.output, piece.index)
    write_splits(dataset, layout.uri, table, SplitFiles(paths, hashes), codes, assignment[rows], rows.start)
    return {name: int((assignment[rows] == index).sum()) for index, name in enumerate(SPLITS)}


def encode_as(labels: Labels, layout: PieceLayout) -> np.ndarray:
    """Some rows' labels as codes into the whole input's classes (`encode_labels` named them by text);
    -1 where the label is missing, as `RowSplit` has it. A regression's are its values, NaN where
    missing."""
    if layout.table.target.regression:
        return every_row(labels.values.astype(np.float64), labels.missing, np.nan)
    code_of = {label: code for code, label in enumerate(layout.table.class_labels)}
    classes, inverse = np.unique(labels.values, return_inverse=True)
    codes = np.full(len(labels.missing), -1, dtype=np.int64)
    codes[~labels.missing] = np.array([code_of[str(label)] for label in classes], dtype=np.int64)[inverse]
    return codes


def collected(layout: PieceLayout, scaler: ScalerStats, written: list[dict[str, int]]) -> PreparedSplits:
    """The splits the pieces wrote, once every piece wrote all of its rows."""
    rows = {name: sum(piece[name] for piece in written) for name in SPLITS}
    if rows != layout.table.rows:
        raise RuntimeError(
            f"the pieces wrote {rows} rows of {layout.uri}, not the {layout.table.rows} assigned"
        )
    paths = {name: f"{layout.output.rstrip('/')}/{name}" for name in SPLITS}
    return with_copy_notes(PreparedSplits(paths, replace(layout.table, scaler=scaler)), layout.output)
