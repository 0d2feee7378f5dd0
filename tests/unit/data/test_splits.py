"""splits.py: the prepared splits read back, whole or as one rank's share."""

from __future__ import annotations

import numpy as np

from tasks.core.data.splits import read_split
from tasks.core.training.rank_part import rank_part
from tests.unit.data.tables import prepare


def test_rank_parts_split_rows_between_ranks(blobs, write_table, tmp_path):
    prepared = prepare(write_table(blobs.iloc[:101]), tmp_path, val_fraction=0.2, test_fraction=0.2)
    n = prepared.table.rows["train"]
    parts = [rank_part(prepared.paths["train"], rank, 2) for rank in (0, 1)]
    shards = [
        (*part.read(part.blocks, prepared.table.feature_names, "species"), part.row_ids()) for part in parts
    ]
    assert all(len(ids) == -(-n // 2) for _, _, ids in shards)
    assert set(shards[0][2]) | set(shards[1][2]) == set(range(n))
    assert not set(shards[0][2]) & set(shards[1][2])
    features, labels = read_split(prepared.paths["train"], prepared.table.feature_names, "species")
    np.testing.assert_array_equal(shards[1][0], features[shards[1][2]])
    np.testing.assert_array_equal(shards[0][1], labels[shards[0][2]])
