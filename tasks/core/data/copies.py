"""Rows that appear in two splits: a 64-bit hash of each row (its feature values and label), written
beside the splits as they are written, and the count of one split's rows that another split holds,
read back from those hashes a chunk at a time."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from typing import IO

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tasks.core.data.files import filesystem_for
from tasks.core.data.kind_values import category_indices, is_text
from tasks.core.data.splits import SPLITS

# The folder, beside the splits' folders, of each split's row hashes: a file of 64-bit hashes per part.
ROW_HASHES = "row-hashes"
# The rows of a split counted as copies of another split's rows, and what such copies overstate.
COPIED_SPLITS = {
    ("test", "train"): "test accuracy overstates accuracy on new rows",
    ("val", "train"): "val accuracy overstates accuracy on new rows",
    ("test", "val"): "the test and val splits are not independent",
}
HASH_MULTIPLIER = np.uint64(0x100000001B3)  # FNV's 64-bit prime: mixes each column's hash into the row's
NULL_HASH = np.uint64(np.iinfo(np.uint64).max)  # a null integer or boolean, as pandas hashes a null text
HASH_CHUNK = 1 << 20  # row hashes read or looked up at once (8 MiB): counting holds little beside them


def hash_writer(path: str) -> IO[bytes]:
    """A binary file of row hashes, local or through fsspec."""
    filesystem, file = filesystem_for(path)
    filesystem.makedirs(file.rsplit("/", 1)[0], exist_ok=True)
    return filesystem.open(file, "wb")


def row_hashes(batch: pa.RecordBatch, columns: list[str], codes: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row's values in `columns` and its class code: equal rows hash equal in any
    batch or piece, as each column is hashed by its Arrow type (pandas would convert an integer column
    to floats in a batch with a null only)."""
    hashes = pd.util.hash_array(codes) if codes.dtype.kind == "f" else integer_hashes(codes)
    for name in columns:
        hashes = (hashes * HASH_MULTIPLIER) ^ column_hashes(batch.column(name))
    return hashes


def integer_hashes(values: np.ndarray) -> np.ndarray:
    """Each integer hashed as an int64: once per value in their range where it is narrower than they
    are many (class codes, booleans, small counts)."""
    low, high = int(values.min(initial=0)), int(values.max(initial=0))
    if high - low >= len(values):
        return pd.util.hash_array(values.astype(np.int64))
    return pd.util.hash_array(np.arange(low, high + 1, dtype=np.int64))[values - low]


def column_hashes(column: pa.Array) -> np.ndarray:
    """A 64-bit hash of each value: numbers by value (a null float as NaN), dates and times by their
    integer value in the column's type, anything else by its text."""
    if pa.types.is_dictionary(column.type):
        if is_text(column.type.value_type):
            return text_hashes(column)
        column = column.dictionary_decode()
    if pa.types.is_temporal(column.type):  # making text of each instant took most of a row's hashing
        column = column.view(pa.int64() if column.type.bit_width == 64 else pa.int32())
    if pa.types.is_floating(column.type):
        return pd.util.hash_array(pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False))
    if pa.types.is_integer(column.type) or pa.types.is_boolean(column.type):
        values = pc.fill_null(pc.cast(column, pa.int64(), safe=False), 0).to_numpy()
        nulls = column.is_null().to_numpy(zero_copy_only=False)
        return np.where(nulls, NULL_HASH, integer_hashes(values))
    if is_text(column.type):
        return text_hashes(column)
    return pd.util.hash_array(pc.cast(column, pa.string()).to_numpy(zero_copy_only=False))


def text_hashes(column: pa.Array) -> np.ndarray:
    """Each value's hash, as pandas hashes an object array of the texts: each distinct value is made a
    Python string and hashed once (a null as pandas hashes None). Of text, or a dictionary of texts."""
    if pa.types.is_dictionary(column.type):  # its dictionary may be the batch before's
        return DICTIONARY_HASHES.of(column.dictionary)[category_indices(column)]  # -1, a null: the last
    encoded = pc.dictionary_encode(column)
    return distinct_text_hashes(encoded.dictionary)[category_indices(encoded)]


class DictionaryHashes:
    """The hashes of each text of the last few dictionaries, and one more for a null: the batches of a
    parquet row group share their text columns' dictionaries."""

    def __init__(self, size: int = 16) -> None:
        self.known: deque[tuple[pa.Array, np.ndarray]] = deque(maxlen=size)
        self.lock = threading.Lock()

    def of(self, dictionary: pa.Array) -> np.ndarray:
        with self.lock:
            for seen, hashes in self.known:
                if len(seen) == len(dictionary) and seen.equals(dictionary):
                    return hashes
        hashes = distinct_text_hashes(dictionary)
        with self.lock:
            self.known.append((dictionary, hashes))
        return hashes


DICTIONARY_HASHES = DictionaryHashes()


def distinct_text_hashes(dictionary: pa.Array) -> np.ndarray:
    """The hash of each text, then of a null."""
    return pd.util.hash_array(np.array([*dictionary.to_pylist(), None], dtype=object))


def hash_files(out_dir: str, part: int = 0) -> dict[str, str]:
    """Each split's file of row hashes for part number `part` under `out_dir` (see `split_files`)."""
    return {name: f"{out_dir.rstrip('/')}/{ROW_HASHES}/{name}/part-{part:05d}.u64" for name in SPLITS}


def split_hashes(out_dir: str, split: str) -> Iterator[np.ndarray]:
    """The row hashes of a split under `out_dir`, part by part, at most `HASH_CHUNK` at a time."""
    filesystem, root = filesystem_for(out_dir)
    for file in sorted(filesystem.find(f"{root.rstrip('/')}/{ROW_HASHES}/{split}")):
        with filesystem.open(file, "rb") as stream:
            while chunk := stream.read(HASH_CHUNK * 8):
                yield np.frombuffer(chunk, dtype="<u8")


def sorted_hashes(out_dir: str, split: str, rows: int) -> np.ndarray:
    """The `rows` row hashes of a split, sorted: 8 bytes a row."""
    held, start = np.empty(rows, dtype="<u8"), 0
    for chunk in split_hashes(out_dir, split):
        end = start + len(chunk)
        if end > rows:
            break
        held[start:end] = chunk
        start = end
    else:
        if start == rows:
            held.sort()
            return held
    raise RuntimeError(
        f"the row hashes of the {split} split under {out_dir} are not those of its {rows:,} rows"
    )


def lookup(known: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of `values` first is in the sorted `known`, and whether it is there at all. The
    callers count and mark, which the order of `values` does not change, so they pass them sorted: the
    searches then walk `known` in order (several times faster than at random in a large split)."""
    at = np.minimum(np.searchsorted(known, values), max(len(known) - 1, 0))
    found = known[at] == values if len(known) else np.zeros(len(values), dtype=bool)
    return at, found


def rows_with_copies(out_dir: str, split: str, other: str, rows: dict[str, int]) -> int:
    """How many rows of `split` have an exact copy among the rows of `other`. The hashes of the smaller
    of the two are held in memory, sorted (8 bytes a row, and a byte a row to mark them); the other's
    are read `HASH_CHUNK` at a time."""
    if rows[other] <= rows[split]:
        known = sorted_hashes(out_dir, other, rows[other])
        chunks = split_hashes(out_dir, split)
        return sum(int(np.count_nonzero(lookup(known, np.sort(chunk))[1])) for chunk in chunks)
    held = sorted_hashes(out_dir, split, rows[split])
    first_copied = np.zeros(len(held), dtype=bool)  # the first of each run of equal hashes with a copy
    for chunk in split_hashes(out_dir, other):
        at, found = lookup(held, np.sort(chunk))
        first_copied[at[found]] = True
    return marked_runs(held, first_copied)


def marked_runs(held: np.ndarray, first: np.ndarray) -> int:
    """How many of the sorted `held` hashes are in a run of equal ones whose first is marked in `first`."""
    total = 0
    for start in range(0, len(held), HASH_CHUNK):
        marked = start + np.flatnonzero(first[start : start + HASH_CHUNK])
        total += int((np.searchsorted(held, held[marked], side="right") - marked).sum())
    return total


def copy_notes(out_dir: str, rows: dict[str, int]) -> list[str]:
    """Notes on the rows of a split that are exact copies (the same features and label) of rows of
    another split, from the row hashes `write_splits` wrote under `out_dir`; `rows` by split. One pair
    of splits at a time: two at once held some 80 MB more at 10M rows for half a second less."""
    notes = []
    for (split, other), overstated in COPIED_SPLITS.items():
        if copies := rows_with_copies(out_dir, split, other, rows):
            notes.append(
                f"{copies:,} {split} rows ({share(copies, rows[split])}) are exact copies of {other} rows "
                f"(the same features and label): {overstated}"
            )
    return notes


def share(part: int, whole: int) -> str:
    percent = 100 * part / whole
    return f"{percent:.1f}%" if percent >= 0.1 else "<0.1%"
