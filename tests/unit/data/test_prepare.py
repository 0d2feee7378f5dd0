"""prepare.py: preparing a dataset in one pod. The splits partition the labelled rows; the train and val
splits hold the standardised encoded features, the test split the raw values as read; streaming in small
batches changes nothing; bad tables are refused naming the file, column and problem, and the input is
left as it was; rows copied between splits are counted in a note, as pandas counts them."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.core.data import reading
from tasks.core.data.assignment import SPLITS, SplitConfig
from tasks.core.data.column_kinds import is_text
from tasks.core.data.files import DatasetError
from tasks.core.data.prepare import EMBEDDED_DIGITS_LABEL, prepare_dataset, write_embedded_digits
from tasks.core.data.reading import iter_batches, open_dataset
from tasks.core.data.scaling import standardise
from tasks.core.data.splits import batch_features, read_split
from tasks.core.data.writing import RAW_SPLIT
from tests.conftest import blobs_frame
from tests.unit.data.tables import (
    MESSY_ROWS,
    MESSY_UNLABELLED,
    assignment_of,
    prepare,
    prepare_messy,
    row_ids,
    split_frames,
    split_tables,
    write_messy,
)


@pytest.mark.parametrize("name", ["data.parquet", "data.csv"])
def test_prepares_parquet_and_csv(blobs, write_table, tmp_path, name):
    prepared = prepare(write_table(blobs, name), tmp_path)
    assert prepared.table.feature_names == prepared.table.columns == ["f0", "f1", "f2", "f3"]
    assert [column.kind for column in prepared.table.fitted_encoding().columns] == ["numeric"] * 4
    assert prepared.table.class_labels == ["setosa", "versicolor", "virginica"]
    assert sum(prepared.table.rows.values()) == len(blobs)
    frames = split_frames(prepared)
    assert {n: len(f) for n, f in frames.items()} == prepared.table.rows
    assert set(frames["train"]["species"]) == {0, 1, 2}


def test_splits_partition_the_rows(blobs, write_table, tmp_path):
    blobs = blobs.assign(f0=np.arange(len(blobs), dtype=float))  # a row id that survives scaling
    prepared = prepare(write_table(blobs), tmp_path)
    together = np.concatenate([row_ids(prepared, f, name) for name, f in split_frames(prepared).items()])
    assert len(together) == len(set(together)) == len(blobs)


def test_test_split_is_raw_and_the_others_standardised_bit_for_bit(blobs, write_table, tmp_path):
    blobs = blobs.assign(f0=np.arange(len(blobs)), f3=blobs["f3"] / 3)  # integer ids; f3 not float32-exact
    prepared = prepare(write_table(blobs), tmp_path)
    features = prepared.table.feature_names
    raw = blobs[features].to_numpy(dtype=np.float64)
    for name, frame in split_frames(prepared).items():
        rows = raw[row_ids(prepared, frame, name)]
        values = frame[features].to_numpy()
        if name == RAW_SPLIT:
            assert values.dtype == np.float64
            np.testing.assert_array_equal(values, rows)
        else:
            assert values.dtype == np.float32
            np.testing.assert_array_equal(values, standardise(rows, prepared.table.scaler))
    test_features, _ = read_split(prepared.paths["test"], features, "species")
    assert test_features.dtype == np.float32


def test_streaming_in_small_batches_gives_the_same_result(blobs, write_table, tmp_path, monkeypatch):
    path = write_table(blobs)
    whole = split_frames(prepare(path, tmp_path / "whole"))
    monkeypatch.setattr(reading, "BATCH_ROWS", 17)
    batched = split_frames(prepare(path, tmp_path / "batched"))
    for name in SPLITS:
        pd.testing.assert_frame_equal(whole[name], batched[name])


def test_embedded_digits(tmp_path):
    path = write_embedded_digits(str(tmp_path))
    table = pq.read_table(path)
    assert table.num_rows == 1797 and table.num_columns == 65
    assert EMBEDDED_DIGITS_LABEL in table.column_names


# --- a messy table: what users bring ------------------------------------------------------------


# What the encoding makes of each column; the category columns' order follows their train counts.
ENCODED = {
    "f0": ["f0"],
    "f1": ["f1"],
    "colour": ["colour=red", "colour=green", "colour=blue", "colour=<other>", "colour=<missing>"],
    "member": ["member", "member<missing>"],
    "joined": ["joined:days", "joined:month", "joined:weekday", "joined<missing>"],
    "amount": ["amount", "amount<missing>"],
    "rate": ["rate"],  # a constant number stays in place, standardised to 0
}


LEFT_OUT = {"customer_id": "(like an identifier)", "channel": "(constant)"}


def read_as_input(path: str) -> pa.Table:
    """The input's rows as preprocessing reads them."""
    dataset = open_dataset(path, "species")
    return pa.Table.from_batches(list(iter_batches(dataset, path)), schema=dataset.schema)


@pytest.mark.parametrize("pieces", [0, 3], ids=["one pod", "3 pieces"])
@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_a_messy_table_prepares_and_says_what_it_left_out(tmp_path, suffix, pieces):
    prepared = prepare_messy(write_messy(tmp_path / "parts", suffix), tmp_path / "out", pieces)
    table = prepared.table
    assert table.columns == [*ENCODED, *LEFT_OUT]
    assert sorted(table.feature_names) == sorted(name for names in ENCODED.values() for name in names)
    for column, why in LEFT_OUT.items():
        assert [
            note for note in table.notes if note.startswith(f"column '{column}' is left out") and why in note
        ]
    assert [note for note in table.notes if "label column 'species' has 3 missing values" in note]
    assert sum(table.rows.values()) == MESSY_ROWS - len(MESSY_UNLABELLED)
    splits = split_tables(prepared)
    for name in ("train", "val"):
        features = batch_features(splits[name], table.feature_names)
        assert features.dtype == np.float32 and np.isfinite(features).all()
    train = batch_features(splits["train"], table.feature_names)
    one_hot = np.array(["=" in name for name in table.feature_names])  # a category's columns: 0 and 1
    constant = np.array([name == "rate" for name in table.feature_names])  # in the train rows
    assert one_hot.any() and np.isin(train[:, one_hot], [0.0, 1.0]).all()
    np.testing.assert_allclose(train[:, ~one_hot].mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(train.std(axis=0)[~one_hot & ~constant], 1.0, rtol=1e-4)
    np.testing.assert_array_equal(train[:, constant], 0.0)


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_the_test_split_keeps_the_raw_values_as_read(tmp_path, suffix):
    path = write_messy(tmp_path / "parts", suffix)
    prepared = prepare_messy(path, tmp_path / "out", 0)
    raw, test = read_as_input(path), split_tables(prepared)[RAW_SPLIT]
    columns = prepared.table.columns
    assert test.schema == pa.schema([*(raw.schema.field(c) for c in columns), ("species", pa.int64())])
    assert is_text(test.schema.field("colour").type)
    assert pa.types.is_date(test.schema.field("joined").type) and test.column("joined").null_count
    assert pa.types.is_boolean(test.schema.field("member").type) and test.column("member").null_count
    assert test.column("amount").null_count  # NaN, empty cells and 'NA' alike
    row_of = {customer: row for row, customer in enumerate(raw.column("customer_id").to_pylist())}
    rows = [row_of[customer] for customer in test.column("customer_id").to_pylist()]
    assert rows == sorted(rows) and not set(rows) & set(MESSY_UNLABELLED)
    expected = raw.take(rows)
    for column in columns:
        assert test.column(column).equals(expected.column(column)), column
    classes = [prepared.table.class_labels[code] for code in test.column("species").to_pylist()]
    assert classes == expected.column("species").to_pylist()


# --- bad input: each error names the file, the column and the problem -------------------------


def with_inf(frame):
    frame.loc[9, "f1"] = np.inf
    return frame


def with_several_infs(frame):
    frame.loc[[4, 7, 11, 12, 20, 31, 40], "f0"] = -np.inf
    return frame


BAD_TABLES = {
    "missing label column": (lambda f: f.drop(columns="species"), ["label column 'species' not found"]),
    "inf in a feature": (with_inf, ["'f1'", "an infinite value (inf)", "at row 9", "clip"]),
    "several infs in a feature": (
        with_several_infs,
        ["'f0'", "infinite values (-inf)", "at rows 4, 7, 11, 12, 20, ..."],
    ),
    "single class": (lambda f: f.assign(species="setosa"), ["single class", "'setosa'"]),
    "rare class": (lambda f: pd.concat([f, f.iloc[:1].assign(species="rare")]), ["'rare' (1 rows)"]),
    "too few rows": (lambda f: f.iloc[:12], ["too few rows", "val_fraction"]),
    "every label missing": (lambda f: f.assign(species=None), ["label column 'species' has no value"]),
}


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
@pytest.mark.parametrize("name", ["data.parquet", "data.csv"])
def test_bad_tables_are_rejected_with_a_clear_message(blobs, write_table, tmp_path, case, name):
    mutate, expected = BAD_TABLES[case]
    path = write_table(mutate(blobs.copy()), name)
    with pytest.raises(DatasetError) as error:
        prepare(path, tmp_path)
    message = str(error.value)
    assert path in message
    for fragment in expected:
        assert fragment in message


def test_bad_input_is_left_untouched(blobs, write_table, tmp_path):
    path = write_table(with_inf(blobs.copy()))
    before = Path(path).read_bytes()
    with pytest.raises(DatasetError):
        prepare(path, tmp_path)
    assert Path(path).read_bytes() == before


@pytest.mark.parametrize("pass_at_fault", ["statistics", "write"])
def test_a_refused_value_leaves_no_thread_behind_while_its_error_is_held(
    tmp_path, monkeypatch, pass_at_fault
):
    """The passes read, encode and write in threads: a bad value ends them all before its error is
    raised, even while a caller holds the error (and with it the passes' frames). An infinite value is
    refused as the statistics are gathered; a huge one in a test row only once it is standardised."""
    monkeypatch.setattr(reading, "BATCH_ROWS", 16)
    frame, path = blobs_frame(), tmp_path / "data.parquet"
    frame.to_parquet(path, index=False)
    split = SplitConfig(seed=0)
    if pass_at_fault == "statistics":
        row, value, refusal = 5, np.inf, "infinite value"
    else:
        row, value, refusal = (
            int(np.flatnonzero(assignment_of(path, split, tmp_path, 1) == 2)[0]),
            1e300,
            "float32",
        )
    frame.loc[row, "f1"] = value
    frame.to_parquet(path, index=False)
    with pytest.raises(DatasetError) as refused:
        prepare_dataset(str(path), "species", str(tmp_path / "out"), split)
    assert f"at row {row}" in str(refused.value) and refusal in str(refused.value)
    ours = ("read-ahead", "batch-work", "write-")  # other tests' threads (fsspec's loop) may run
    assert [t.name for t in threading.enumerate() if t.name.startswith(ours)] == []
