"""A table as users bring it: text categories, booleans and dates with gaps, numbers with NaN, empty
cells and 'NA', an id column, constant columns and rows without a label. It prepares, in one pod or in
pieces, from CSV or parquet: the notes say what was left out, the train and val splits hold finite
encoded features, and the test split keeps the raw values for evaluation to score as a user would."""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from tasks.core.data.assignment import SplitConfig
from tasks.core.data.column_kinds import is_text
from tasks.core.data.files import DatasetError
from tasks.core.data.pieces import prepare_in_pieces
from tasks.core.data.prepare import RAW_SPLIT, PreparedSplits, prepare_dataset
from tasks.core.data.reading import iter_batches, open_dataset
from tasks.core.data.scaling import batch_features
from tests.conftest import blobs_frame
from tests.unit.data.test_pieces import assert_same_splits, split_tables

ROWS = 240
PART_ROWS = (1, 60, 9, 120, 50)  # uneven parts, one of a single row
UNLABELLED = [5, 77, 200]
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


def messy_frame(csv: bool) -> pd.DataFrame:
    """Row 0 holds a value in every column: a CSV part of that row alone still reads as the others do."""
    frame = blobs_frame(n_rows=ROWS, n_features=2, seed=4)
    index = range(ROWS)
    frame["colour"] = np.array(["red", "green", "blue", None], dtype=object)[np.arange(ROWS) % 4]
    frame["member"] = np.array([True, False, None], dtype=object)[np.arange(ROWS) % 3]
    start = datetime.date(2023, 12, 30)
    frame["joined"] = [None if i % 11 == 5 else start + datetime.timedelta(days=3 * i) for i in index]
    amount = np.random.default_rng(2).normal(100.0, 20.0, size=ROWS).round(2)
    if csv:  # what a CSV holds: empty cells, 'NA' and 'nan' (pyarrow reads all three as missing)
        frame["amount"] = [("", "NA", "nan")[i % 3] if i % 7 == 3 else str(v) for i, v in enumerate(amount)]
    else:
        frame["amount"] = np.where(np.arange(ROWS) % 7 == 3, np.nan, amount)
    frame["rate"] = 7.0
    frame["customer_id"] = [f"c{i:05d}" for i in index]
    frame["channel"] = "web"
    frame.loc[UNLABELLED, "species"] = None
    return frame


def write_messy(folder: Path, suffix: str) -> str:
    """The messy table as a folder of uneven parts."""
    frame = messy_frame(csv=suffix == ".csv")
    folder.mkdir()
    starts = np.cumsum((0, *PART_ROWS))
    for index, (start, end) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        part, name = frame.iloc[start:end], folder / f"part-{index:05d}{suffix}"
        part.to_csv(name, index=False) if suffix == ".csv" else part.to_parquet(name, index=False)
    return str(folder)


def prepare(path: str, out: Path, pieces: int) -> PreparedSplits:
    if pieces:
        return prepare_in_pieces(path, "species", str(out), SplitConfig(seed=1), pieces)
    return prepare_dataset(path, "species", str(out), SplitConfig(seed=1))


def read_as_input(path: str) -> pa.Table:
    """The input's rows as preprocessing reads them."""
    dataset = open_dataset(path, "species")
    return pa.Table.from_batches(list(iter_batches(dataset, path)), schema=dataset.schema)


@pytest.mark.parametrize("pieces", [0, 3], ids=["one pod", "3 pieces"])
@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_a_messy_table_prepares_and_says_what_it_left_out(tmp_path, suffix, pieces):
    prepared = prepare(write_messy(tmp_path / "parts", suffix), tmp_path / "out", pieces)
    table = prepared.table
    assert table.columns == [*ENCODED, *LEFT_OUT]
    assert sorted(table.feature_names) == sorted(name for names in ENCODED.values() for name in names)
    for column, why in LEFT_OUT.items():
        assert [
            note for note in table.notes if note.startswith(f"column '{column}' is left out") and why in note
        ]
    assert [note for note in table.notes if "label column 'species' has 3 missing values" in note]
    assert sum(table.rows.values()) == ROWS - len(UNLABELLED)
    splits = split_tables(prepared)
    for name in ("train", "val"):
        features = batch_features(splits[name], table.feature_names)
        assert features.dtype == np.float32 and np.isfinite(features).all()
    train = batch_features(splits["train"], table.feature_names)
    varies = np.array([name not in ("rate", "colour=<other>") for name in table.feature_names])
    np.testing.assert_allclose(train.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(train.std(axis=0)[varies], 1.0, rtol=1e-4)
    np.testing.assert_array_equal(train[:, ~varies], 0.0)  # constant in the train rows


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_the_test_split_keeps_the_raw_values_as_read(tmp_path, suffix):
    path = write_messy(tmp_path / "parts", suffix)
    prepared = prepare(path, tmp_path / "out", 0)
    raw, test = read_as_input(path), split_tables(prepared)[RAW_SPLIT]
    columns = prepared.table.columns
    assert test.schema == pa.schema([*(raw.schema.field(c) for c in columns), ("species", pa.int64())])
    assert is_text(test.schema.field("colour").type)
    assert pa.types.is_date(test.schema.field("joined").type) and test.column("joined").null_count
    assert pa.types.is_boolean(test.schema.field("member").type) and test.column("member").null_count
    assert test.column("amount").null_count  # NaN, empty cells and 'NA' alike
    row_of = {customer: row for row, customer in enumerate(raw.column("customer_id").to_pylist())}
    rows = [row_of[customer] for customer in test.column("customer_id").to_pylist()]
    assert rows == sorted(rows) and not set(rows) & set(UNLABELLED)
    expected = raw.take(rows)
    for column in columns:
        assert test.column(column).equals(expected.column(column)), column
    classes = [prepared.table.class_labels[code] for code in test.column("species").to_pylist()]
    assert classes == expected.column("species").to_pylist()


@pytest.mark.parametrize("count", [1, 3, 7])
@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_pieces_give_the_one_pod_splits_and_encoding_of_a_messy_table(tmp_path, suffix, count):
    path = write_messy(tmp_path / "parts", suffix)
    one_pod = prepare(path, tmp_path / "one", 0)
    assert_same_splits(prepare(path, tmp_path / "pieces", count), one_pod)


def test_a_messy_single_file_prepares_alike_as_csv_and_parquet(tmp_path):
    """The same rows, from a CSV file or a parquet file, give the same encoded splits."""
    prepared = {}
    for suffix in (".parquet", ".csv"):
        frame, path = messy_frame(csv=suffix == ".csv"), tmp_path / f"data{suffix}"
        frame.to_csv(path, index=False) if suffix == ".csv" else frame.to_parquet(path, index=False)
        prepared[suffix] = prepare(str(path), tmp_path / suffix, 0)
    parquet, csv = prepared[".parquet"], prepared[".csv"]
    assert parquet.table.feature_names == csv.table.feature_names and parquet.table.notes == csv.table.notes
    for name in ("train", "val"):
        a, b = (
            batch_features(ds.dataset(p.paths[name]).to_table(), p.table.feature_names)
            for p in (parquet, csv)
        )
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.slow  # runs the preprocessing tasks through Flyte's local map tasks
@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_the_map_tasks_give_the_one_pod_splits_of_a_messy_table(tmp_path, monkeypatch, suffix):
    """The kinds, the pieces' statistics and the fitted encoding cross the task boundaries unchanged."""
    from tasks.core.planning import planner
    from tasks.core.training.config import TrainConfig
    from tasks.plumbing.storage import dataset_uri
    from tasks.right_sizing import prepare_data

    path = write_messy(tmp_path / "parts", suffix)
    monkeypatch.setattr(planner, "PIECE_ROWS", 60)
    prepared, plan = prepare_data(
        dataset=path, label_column="species", val_fraction=0.15, test_fraction=0.15, target="gpu",
        hyperparameters=TrainConfig(seed=1), plan_resources=True,
    )  # fmt: skip
    assert plan.pieces > 1
    folders = {name: dataset_uri(getattr(prepared, name)) for name in ("train", "val", "test")}
    assert_same_splits(PreparedSplits(folders, prepared.table), prepare(path, tmp_path / "one", 0))


@pytest.mark.parametrize("pieces", [0, 3], ids=["one pod", "3 pieces"])
def test_the_user_forces_a_kind_and_drops_a_column(tmp_path, pieces):
    """A zip code stored as integers is a category, not a number; a column the user drops is left out
    with a note, whatever its kind."""
    frame = messy_frame(csv=False)
    frame["zip"] = np.array([10115, 20095, 80331])[np.arange(ROWS) % 3]
    path = str(tmp_path / "zips.parquet")
    frame.to_parquet(path, index=False)
    kinds = {"zip": "categorical", "amount": "drop"}
    if pieces:
        split = SplitConfig(seed=0)
        prepared = prepare_in_pieces(
            path, "species", str(tmp_path / "out"), split, pieces, column_kinds=kinds
        )
    else:
        prepared = prepare_dataset(path, "species", str(tmp_path / "out"), SplitConfig(seed=0), kinds)
    names = prepared.table.feature_names
    assert {"zip=10115", "zip=20095", "zip=80331", "zip=<other>"} <= set(names)
    assert "zip" not in names and not any(name.startswith("amount") for name in names)
    assert any("'amount'" in note for note in prepared.table.notes), prepared.table.notes


def test_a_kind_the_values_cannot_take_is_refused_naming_the_column_and_value(tmp_path):
    frame = messy_frame(csv=False)
    path = str(tmp_path / "messy.parquet")
    frame.to_parquet(path, index=False)
    with pytest.raises(DatasetError, match="colour") as refused:
        prepare_dataset(path, "species", str(tmp_path / "out"), SplitConfig(seed=0), {"colour": "date"})
    assert "red" in str(refused.value) and "messy.parquet" in str(refused.value)
