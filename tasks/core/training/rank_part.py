"""A rank's part of a prepared split: the row groups it reads, as blocks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq

from tasks.core.data.files import DatasetError, parquet_split
from tasks.core.data.split_codes import stored_columns
from tasks.core.data.splits import batch_features, label_array


@dataclass(frozen=True)
class Block:
    """Rows [start, stop) of row group `row_group` of a split's file; `first_id` is the split's row id
    of its first row (rows count through the split's files in order)."""

    file: str
    row_group: int
    start: int
    stop: int
    first_id: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass
class RankPart:
    """A rank's part of a prepared split: a contiguous range of its rows, cut into blocks at the
    files' row groups, so that the rank reads its own row groups alone (a row group that straddles
    two ranks' ranges is decoded by both, each keeping its own rows). The ranges of n rows over
    `world_size` ranks differ by one row at most; a shorter one ends with a copy of its first row,
    so that every rank takes the same number of steps."""

    path: str
    filesystem: pa_fs.FileSystem
    blocks: list[Block]
    opened: dict[str, pq.ParquetFile] = field(default_factory=dict, repr=False)  # footer read once a file

    @property
    def rows(self) -> int:
        return sum(block.rows for block in self.blocks)

    def row_ids(self) -> np.ndarray:
        return np.concatenate([np.arange(b.first_id, b.first_id + b.rows) for b in self.blocks])

    def read_block(
        self, block: Block, feature_names: list[str], label_column: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """One block's (features float32, label codes int64), read from its row group alone."""
        if block.file not in self.opened:
            self.opened[block.file] = pq.ParquetFile(self.filesystem.open_input_file(block.file))
        file = self.opened[block.file]
        columns = [*stored_columns(file.schema_arrow, feature_names), label_column]
        group = file.read_row_group(block.row_group, columns=columns)
        rows = group.slice(block.start, block.rows)
        return batch_features(rows, feature_names), label_array(rows.column(label_column).to_numpy())

    def read(
        self, blocks: list[Block], feature_names: list[str], label_column: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """`blocks` laid end to end."""
        features, labels = zip(
            *(self.read_block(b, feature_names, label_column) for b in blocks), strict=True
        )
        return np.concatenate(features), np.concatenate(labels)


def row_groups(path: str) -> tuple[pa_fs.FileSystem, list[tuple[str, int, int]]]:
    """A split's filesystem and its row groups as (file, index, rows), in the order the rows count.
    `path` may be an object-store URI: the rows are then read from there, a row group at a time."""
    split = parquet_split(path)
    groups = []
    for file in split.files:
        metadata = pq.read_metadata(file, filesystem=split.filesystem)
        groups += [
            (file, index, metadata.row_group(index).num_rows) for index in range(metadata.num_row_groups)
        ]
    return split.filesystem, groups


def rank_part(path: str, rank: int, world_size: int) -> RankPart:
    """Rank `rank`'s part of the split at `path` (a parquet file or a folder of parts): see `RankPart`."""
    filesystem, groups = row_groups(path)
    total = sum(rows for _, _, rows in groups)
    first, stop = rank * total // world_size, (rank + 1) * total // world_size
    if first == stop:
        raise DatasetError(
            f"{path}: rank {rank} of {world_size} got no rows; the split has only {total} rows"
        )
    blocks, group_start = [], 0
    for file, index, rows in groups:
        low, high = max(first, group_start), min(stop, group_start + rows)
        if low < high:
            blocks.append(Block(file, index, low - group_start, high - group_start, low))
        group_start += rows
    if stop - first < math.ceil(total / world_size):
        head = blocks[0]
        blocks.append(Block(head.file, head.row_group, head.start, head.start + 1, head.first_id))
    return RankPart(path, filesystem, blocks)
