"""Prepared splits cut into many small row groups, the train split a folder of part files: so that a
rank's part spans several blocks and files, and the epoch order shuffles blocks and windows."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq

from tasks.core.data.splits import SplitPaths

ROW_GROUP_ROWS = 23  # not a divisor of the batch, so steps straddle blocks


def small_row_groups(splits: SplitPaths, directory: Path) -> SplitPaths:
    train = pq.read_table(splits.train)
    parts = directory / "train"
    parts.mkdir(parents=True)
    half = train.num_rows // 2
    pq.write_table(train.slice(0, half), parts / "part-0.parquet", row_group_size=ROW_GROUP_ROWS)
    pq.write_table(train.slice(half), parts / "part-1.parquet", row_group_size=ROW_GROUP_ROWS)
    val = directory / "val.parquet"
    pq.write_table(pq.read_table(splits.val), val, row_group_size=ROW_GROUP_ROWS)
    return replace(splits, train=str(parts), val=str(val))
