"""copies.py: rows copied between splits. A test row that is an exact copy (the same features and label)
of a train row makes test accuracy overstate accuracy on new rows; the count is the same in one pod and
in pieces, equals the count pandas gives on the rows as split, and is read from the row hashes a chunk at
a time."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from tasks.core.data import copies as copies_module
from tasks.core.data import reading
from tasks.core.data.assignment import SPLITS, SplitConfig
from tasks.core.data.copies import COPIED_SPLITS, column_hashes, hash_files, row_hashes, rows_with_copies
from tasks.core.data.labels import clean_labels, scan_labels
from tasks.core.data.prepare import (
    RowSplit,
    prepare_dataset,
)
from tasks.core.data.reading import open_dataset
from tests.conftest import blobs_frame
from tests.unit.data.tables import (
    assert_same_splits,
    digests,
    prepare_in_pieces,
)

LABEL = "species"


NOTE = re.compile(r"^([\d,]+) (\w+) rows \((<?[\d.]+%)\) are exact copies of (\w+) rows \(the same features")


PARTS = 3


# Parquet batches this small leave an integer column's nulls in some batches only: a row is hashed alike
# in each (CSV reads every number column as floats).
BATCH_ROWS = 16


def repeated(frame: pd.DataFrame, times: int) -> pd.DataFrame:
    """Each row `times` times, the copies spread through the table."""
    return pd.concat([frame] * times, ignore_index=True).sample(frac=1.0, random_state=1, ignore_index=True)


def random_labels(n_rows: int, seed: int = 3) -> pd.DataFrame:
    """Features and labels that have nothing to do with each other."""
    frame = blobs_frame(n_rows=n_rows, seed=seed)
    frame[LABEL] = np.random.default_rng(seed).choice(["a", "b", "c"], size=n_rows)
    return frame


def copies_with_gaps() -> pd.DataFrame:
    """Copies holding nulls, in an integer, a float, a text and a category column."""
    frame = random_labels(60, seed=4)
    frame["count"] = pd.array(np.arange(60) % 7, dtype="Int64")
    frame.loc[::15, "count"] = pd.NA  # rare: many a batch holds none
    frame.loc[::4, "f0"] = np.nan
    frame["town"] = pd.Series(np.array(["x", "y", None], dtype=object)[np.arange(60) % 3])
    frame["grade"] = pd.Categorical(np.array(["lo", "hi"])[np.arange(60) % 2])
    return repeated(frame, 4)


def other_labels() -> pd.DataFrame:
    """Each row twice, with another label: no row is a copy."""
    frame = random_labels(150, seed=5)
    flipped = frame.assign(**{LABEL: frame[LABEL].map({"a": "b", "b": "c", "c": "a"})})
    return pd.concat([frame, flipped], ignore_index=True).sample(frac=1.0, random_state=2, ignore_index=True)


# case -> (the table, the split, whether some rows are copies)
CASES: dict[str, tuple[Callable[[], pd.DataFrame], SplitConfig, bool]] = {
    "no copies": (lambda: blobs_frame(n_rows=300), SplitConfig(), False),
    "every row 5 times, random labels": (lambda: repeated(random_labels(100), 5), SplitConfig(), True),
    "copies with nulls": (copies_with_gaps, SplitConfig(seed=1), True),
    "the same features with another label": (other_labels, SplitConfig(), False),
    "a train split smaller than the others": (
        lambda: repeated(random_labels(120), 3),
        SplitConfig(val_fraction=0.4, test_fraction=0.45),
        True,
    ),
}


def write_parts(frame: pd.DataFrame, folder: Path, suffix: str) -> None:
    """CSV parts, or parquet parts without pandas' metadata (as Spark writes them): an integer column
    with nulls reads back into pandas as floats, in a batch that holds a null only."""
    folder.mkdir()
    for index, part in enumerate(np.array_split(np.arange(len(frame)), PARTS)):
        rows = frame.iloc[part]
        path = folder / f"part-{index:05d}{suffix}"
        if suffix == ".csv":
            rows.to_csv(path, index=False)
        else:
            pq.write_table(pa.Table.from_pandas(rows, preserve_index=False).replace_schema_metadata(), path)


def noted_copies(notes: list[str]) -> dict[tuple[str, str], int]:
    found = {}
    for note in notes:
        if match := NOTE.match(note):
            found[(match[2], match[4])] = int(match[1].replace(",", ""))
    return found


def pandas_copies(frame: pd.DataFrame, folder: Path, split: SplitConfig) -> dict[tuple[str, str], int]:
    """The rows of each split with an exact copy in another, by pandas, on the split preprocessing made."""
    dataset = open_dataset(str(folder), LABEL)
    from_csv = isinstance(dataset.format, ds.CsvFileFormat)
    labels = clean_labels(scan_labels(dataset, str(folder), LABEL), str(folder), LABEL, from_csv)
    assignment = RowSplit.of(labels, str(folder), LABEL, split).assignment
    rows = {name: frame[assignment == index].astype(str) for index, name in enumerate(SPLITS)}
    counts = {}
    for first, other in COPIED_SPLITS:
        copied = rows[first].merge(rows[other].drop_duplicates(), how="inner", on=list(frame.columns))
        if len(copied):
            counts[(first, other)] = len(copied)
    return counts


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_rows_copied_between_splits_are_counted_in_a_note(tmp_path, monkeypatch, case, suffix):
    if suffix == ".parquet":
        monkeypatch.setattr(reading, "BATCH_ROWS", BATCH_ROWS)
    make, split, copies = CASES[case]
    frame = make()
    folder = tmp_path / "parts"
    write_parts(frame, folder, suffix)
    before = digests(folder)
    one_pod = prepare_dataset(str(folder), LABEL, str(tmp_path / "one"), split)
    noted = noted_copies(one_pod.table.notes)
    assert noted == pandas_copies(frame, folder, split)
    assert bool(noted) == copies
    if copies:
        assert noted.get(("test", "train"), 0) > 0
        (note,) = [note for note in one_pod.table.notes if " test rows " in note and "of train rows" in note]
        share = 100 * noted[("test", "train")] / one_pod.table.rows["test"]
        assert f"({share:.1f}%)" in note and note.endswith("test accuracy overstates accuracy on new rows")
    pieces = prepare_in_pieces(str(folder), LABEL, str(tmp_path / "pieces"), split, PARTS)
    assert_same_splits(pieces, one_pod)  # the same notes, so the same counts
    assert digests(folder) == before


# case -> (the test split's row hashes by part, the train split's by part, test rows with a copy in train)
HASHES = {
    "a run of copies across chunks": ([[5, 5], [5, 1, 9]], [[7, 5], [2]], 3),
    "every row a copy": ([[4, 4, 4]], [[4], [4], [4, 4]], 3),
    "no copy": ([[1, 2, 3]], [[4, 5, 6, 7]], 0),
    "no train row": ([[1, 2]], [[]], 0),
    "a smaller train split": ([[8, 8, 3, 2], [8, 1]], [[8, 1]], 4),
    "the largest hash": ([[2**64 - 1, 0]], [[2**64 - 1, 2**64 - 1, 5]], 1),
}


@pytest.mark.parametrize("case", sorted(HASHES))
def test_copies_are_counted_from_the_hashes_a_chunk_at_a_time(tmp_path, monkeypatch, case):
    monkeypatch.setattr(copies_module, "HASH_CHUNK", 2)
    test_parts, train_parts, copies = HASHES[case]
    for split, parts in (("test", test_parts), ("train", train_parts)):
        for index, hashes in enumerate(parts):
            path = Path(hash_files(str(tmp_path), index)[split])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(np.array(hashes, dtype="<u8").tobytes())
    rows = {"test": sum(map(len, test_parts)), "train": sum(map(len, train_parts))}
    assert rows_with_copies(str(tmp_path), "test", "train", rows) == copies


# --- text read as dictionaries --------------------------------------------------------------------


def text_batch() -> pa.RecordBatch:
    """Text columns with nulls and blanks, a large text column and a number."""
    towns = ["x", None, "", "y", "x", "", None, "z", "y"]
    return pa.record_batch(
        {
            "town": pa.array(towns),
            "code": pa.array([f"c{i % 3}" if i % 4 else "" for i in range(len(towns))], pa.large_string()),
            "f0": pa.array([float(i % 2) for i in range(len(towns))]),
        }
    )


def keyed(text: pa.Array, repeated_entries: bool) -> pa.DictionaryArray:
    """The text as a dictionary array: as parquet reads it, or with a dictionary that holds a value
    twice, a null and a value no row takes (each row's value unchanged)."""
    if not repeated_entries:
        return text.dictionary_encode()
    values = text.to_pylist()
    dictionary = ["unused", None, *values]
    return pa.DictionaryArray.from_arrays(
        pa.array(range(2, len(values) + 2), pa.int32()), pa.array(dictionary, text.type)
    )


@pytest.mark.parametrize("repeated_entries", [False, True], ids=["distinct entries", "repeated entries"])
def test_rows_hash_alike_with_text_as_a_dictionary_or_plain(repeated_entries):
    plain = text_batch()
    as_dictionary = pa.record_batch(
        {
            name: keyed(plain.column(name), repeated_entries) if name != "f0" else plain.column(name)
            for name in plain.schema.names
        }
    )
    assert pa.types.is_dictionary(as_dictionary.schema.field("town").type)
    codes = np.arange(plain.num_rows) % 2
    columns = ["town", "code", "f0"]
    hashes = row_hashes(plain, columns, codes)
    np.testing.assert_array_equal(row_hashes(as_dictionary, columns, codes), hashes)
    town = column_hashes(as_dictionary.column("town"))
    np.testing.assert_array_equal(town, column_hashes(plain.column("town")))
    assert town[1] != town[2] and town[0] == town[4]  # a null is not a blank; an x is an x


def test_rows_hash_alike_with_a_full_int8_dictionary():
    """128 texts keyed by int8 (pyarrow keeps such an index type through parquet): a null's place, 128,
    is past what int8 holds."""
    dictionary = pa.array([f"t{i}" for i in range(128)])
    column = pa.DictionaryArray.from_arrays(pa.array([0, 127, None, 5], pa.int8()), dictionary)
    codes = np.zeros(4, dtype=np.int64)
    as_dictionary = pa.record_batch({"town": column})
    plain = pa.record_batch({"town": column.cast(pa.string())})
    np.testing.assert_array_equal(
        row_hashes(as_dictionary, ["town"], codes), row_hashes(plain, ["town"], codes)
    )


def copied_text_rows() -> pd.DataFrame:
    """Rows each four times, with text category columns (one with nulls, one with blanks)."""
    frame = random_labels(80, seed=6)
    frame["town"] = np.array(["x", "y", None], dtype=object)[np.arange(80) % 3]
    frame["shade"] = np.array(["", "dark", "light", "pale", "dark"], dtype=object)[np.arange(80) % 5]
    frame["code"] = [f"k{i % 6}" for i in range(80)]
    return repeated(frame, 4)


def test_text_categories_from_parquet_keep_their_types_and_count_copies_as_from_csv(tmp_path, monkeypatch):
    """The parquet file's text categories are hashed as dictionaries, the CSV file's as text."""
    monkeypatch.setattr(reading, "BATCH_ROWS", BATCH_ROWS)  # many batches, each its own dictionaries
    hashed_types = set()

    def noting_types(column: pa.Array) -> np.ndarray:
        hashed_types.add(column.type)
        return column_hashes(column)

    monkeypatch.setattr(copies_module, "column_hashes", noting_types)
    frame = copied_text_rows()
    parquet, csv = tmp_path / "data.parquet", tmp_path / "data.csv"
    text_types = {"town": pa.string(), "shade": pa.string(), "code": pa.large_string(), LABEL: pa.string()}
    table = pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata()
    table = table.cast(pa.schema([f.with_type(text_types.get(f.name, f.type)) for f in table.schema]))
    pq.write_table(table, parquet, row_group_size=100)
    frame.to_csv(csv, index=False)
    split = SplitConfig(seed=2)
    from_parquet = prepare_dataset(str(parquet), LABEL, str(tmp_path / "parquet"), split)
    assert {
        pa.dictionary(pa.int32(), pa.string()),
        pa.dictionary(pa.int32(), pa.large_string()),
    } <= hashed_types
    from_csv = prepare_dataset(str(csv), LABEL, str(tmp_path / "csv"), split)
    names = from_parquet.table.feature_names
    assert {"town=x", "shade=dark", "code=k0"} <= set(names)  # read as categories
    raw = pq.read_table(from_parquet.paths["test"])
    for column in from_parquet.table.columns:
        assert raw.schema.field(column).type == table.schema.field(column).type, column
    assert raw.schema.field("code").type == pa.large_string() and raw.schema.field("town").type == pa.string()
    assert set(raw.column("town").to_pylist()) <= {"x", "y", None}
    copies = [note for note in from_parquet.table.notes if NOTE.match(note)]
    assert copies and copies == [note for note in from_csv.table.notes if NOTE.match(note)]
    assert noted_copies(copies) == pandas_copies(frame, parquet, split)
