"""Seeded synthetic classification tables, written as parquet in chunks (nothing is downloaded)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CHUNK_ROWS = 250_000


def write_table(path: str, rows: int, features: int = 64, classes: int = 10, seed: int = 0) -> str:
    """Gaussian class clusters: learnable, and sized only by `rows` x `features`."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=3.0, size=(classes, features)).astype(np.float32)
    schema = pa.schema([(f"f{i}", pa.float32()) for i in range(features)] + [("label", pa.int64())])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, CHUNK_ROWS):
            n = min(CHUNK_ROWS, rows - start)
            labels = rng.integers(0, classes, size=n)
            values = centers[labels] + rng.normal(size=(n, features)).astype(np.float32)
            columns = [pa.array(values[:, i]) for i in range(features)] + [pa.array(labels)]
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))
    return path
