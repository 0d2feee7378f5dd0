"""Seeded synthetic classification tables, written as parquet in chunks (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.core.data.splits import SplitPaths

CHUNK_ROWS = 250_000


def write_table(path: str, rows: int, features: int = 64, classes: int = 10, seed: int = 0) -> str:
    """Gaussian class clusters: learnable, and sized only by `rows` x `features`."""
    return write_parts(path, rows, 1, features, classes, seed)[0]


def write_parts(
    path: str, rows: int, parts: int, features: int = 64, classes: int = 10, seed: int = 0
) -> list[str]:
    """`write_table`'s rows in `parts` files of (nearly) equal rows: `path` itself for one part,
    else `path` as a folder of part-<i>.parquet files."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=3.0, size=(classes, features)).astype(np.float32)
    schema = pa.schema([(f"f{i}", pa.float32()) for i in range(features)] + [("label", pa.int64())])
    if parts > 1:
        Path(path).mkdir(parents=True, exist_ok=True)
    files = [path] if parts == 1 else [str(Path(path) / f"part-{i:05d}.parquet") for i in range(parts)]
    for index, file in enumerate(files):
        part_rows = rows // parts + (index < rows % parts)
        with pq.ParquetWriter(file, schema) as writer:
            for start in range(0, part_rows, CHUNK_ROWS):
                n = min(CHUNK_ROWS, part_rows - start)
                labels = rng.integers(0, classes, size=n)
                values = centers[labels] + rng.normal(size=(n, features)).astype(np.float32)
                columns = [pa.array(values[:, i]) for i in range(features)] + [pa.array(labels)]
                writer.write_table(pa.Table.from_arrays(columns, schema=schema))
    return files


def synthetic_splits(root: Path, name: str, rows: int, features: int) -> SplitPaths:
    """Training and validation splits of `write_table`'s classes under `root` (`name`-train/-val.parquet).
    The same seed draws the same class centres, so the validation rows repeat the first training rows:
    enough for figures of speed and memory, and to tell a run that learned from one that did not."""
    train = write_table(str(root / f"{name}-train.parquet"), rows, features)
    val = write_table(str(root / f"{name}-val.parquet"), max(rows // 32, 2048), features)
    return SplitPaths(train, val, [f"f{i}" for i in range(features)], "label", 10)
