"""Input rules that used to give a wrong result or a library's traceback: a pandas index saved with
the data, extreme magnitudes, fractions too large for the rows, empty part files, trailing
delimiters, decimal columns and long CSV lines. Each input file is left as it was."""

from __future__ import annotations

import decimal
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.core.data import reading
from tasks.core.data.assignment import SPLITS, SplitConfig, assign_splits, checked_assignment, split_rows
from tasks.core.data.files import DatasetError
from tasks.core.data.prepare import PreparedSplits, prepare_dataset
from tasks.core.data.scaling import ScalerStats, check_standardised, standardise
from tasks.core.serving.bundle import arrow_features
from tests.conftest import blobs_frame

FEATURES = ["f0", "f1", "f2", "f3"]


def snapshot(path: Path) -> dict[str, bytes]:
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    return {str(file): file.read_bytes() for file in files if file.is_file()}


def prepare_unchanged(path: Path, tmp_path: Path, **split) -> PreparedSplits:
    """Prepare `path`, asserting that the input is byte for byte as it was, refused or not."""
    before = snapshot(path)
    try:
        return prepare_dataset(str(path), "species", str(tmp_path / "out"), SplitConfig(**split))
    finally:
        assert snapshot(path) == before


def refusal(path: Path, tmp_path: Path, **split) -> str:
    with pytest.raises(DatasetError) as error:
        prepare_unchanged(path, tmp_path, **split)
    return str(error.value)


def split_features(prepared: PreparedSplits, split: str) -> np.ndarray:
    return pq.read_table(prepared.paths[split], columns=prepared.table.feature_names).to_pandas().to_numpy()


# --- a pandas index saved with the data is not a feature ------------------------------------------


def in_label_order(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows stored by class: an index saved with them would predict the class on its own."""
    return frame.sort_values("species")


def csv_written_twice(frame: pd.DataFrame, path: Path) -> None:
    """Read back and written again without the index: pandas names the old index 'Unnamed: 0'."""
    frame.to_csv(path)
    pd.read_csv(path).to_csv(path, index=False)


INDEX_COLUMNS: dict[str, tuple[str, Callable[[pd.DataFrame, Path], None], str]] = {
    "parquet, unnamed index": ("parquet", lambda f, p: f.to_parquet(p), "__index_level_0__"),
    "parquet, named index": (
        "parquet",
        lambda f, p: f.rename_axis("row_id").to_parquet(p),
        "row_id",
    ),
    "csv, to_csv's index": ("csv", lambda f, p: f.to_csv(p), ""),
    "csv, index read back": ("csv", csv_written_twice, "Unnamed: 0"),
    "csv, row labels": ("csv", lambda f, p: f.set_axis([f"r{i}" for i in f.index]).to_csv(p), ""),
}


@pytest.mark.parametrize("case", sorted(INDEX_COLUMNS))
def test_a_saved_index_is_left_out_of_the_features_with_a_note(tmp_path, case):
    suffix, write, column = INDEX_COLUMNS[case]
    path = tmp_path / f"data.{suffix}"
    write(in_label_order(blobs_frame()), path)
    prepared = prepare_unchanged(path, tmp_path)
    assert prepared.table.feature_names == FEATURES
    assert [note for note in prepared.table.notes if repr(column) in note and "left out" in note]


KEPT_COLUMNS = {
    "an unnamed first column with repeated values": lambda f: f.assign(**{"Unnamed: 0": np.arange(300) % 7}),
    "a named first column of row numbers": lambda f: f.assign(row=np.arange(300)),
}


@pytest.mark.parametrize("case", sorted(KEPT_COLUMNS))
def test_a_column_that_may_be_a_feature_stays_one(tmp_path, case):
    frame = KEPT_COLUMNS[case](blobs_frame())
    frame = frame[[frame.columns[-1], *frame.columns[:-1]]]  # the added column first
    path = tmp_path / "data.csv"
    frame.to_csv(path, index=False)
    prepared = prepare_unchanged(path, tmp_path)
    assert prepared.table.feature_names == [frame.columns[0], *FEATURES]
    assert prepared.table.notes == []


def test_a_range_index_is_not_stored_so_nothing_is_left_out(tmp_path):
    path = tmp_path / "data.parquet"
    blobs_frame().to_parquet(path)
    assert prepare_unchanged(path, tmp_path).table.notes == []


def test_scoring_rows_that_carry_their_index_reads_the_features_only():
    table = pa.Table.from_pandas(in_label_order(blobs_frame()))
    assert "__index_level_0__" in table.schema.names
    assert arrow_features(table, FEATURES, "rows").schema.names == FEATURES


# --- extreme magnitudes: standardised in float64, refused by name only when unrepresentable --------


def scaled(column: str, factor: float) -> Callable[[pd.DataFrame], pd.DataFrame]:
    return lambda frame: frame.assign(**{column: frame[column] * factor})


def lone_value(value: float) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """f0 zero but in one row: in training its variance overflows; elsewhere the training rows'
    scale of 1 leaves it beyond float32's range. Refused either way."""
    return lambda frame: frame.assign(f0=np.where(frame.index == 17, value, 0.0))


PREPARED_MAGNITUDES = {
    "tiny values": scaled("f0", 1e-46),
    "huge values": scaled("f1", 1e39),
    "a tiny constant": lambda frame: frame.assign(f2=1e-46),
    "a huge constant": lambda frame: frame.assign(f3=1e39),
    "a constant near float64's limit": lambda frame: frame.assign(f3=1e300),
}


@pytest.mark.parametrize("case", sorted(PREPARED_MAGNITUDES))
def test_extreme_magnitudes_are_standardised(tmp_path, case):
    path = tmp_path / "data.parquet"
    PREPARED_MAGNITUDES[case](blobs_frame()).to_parquet(path, index=False)
    prepared = prepare_unchanged(path, tmp_path)
    train = split_features(prepared, "train")
    assert np.isfinite(train).all() and np.isfinite(prepared.table.scaler.scale).all()
    varies = train.std(axis=0) > 0
    np.testing.assert_allclose(train.std(axis=0)[varies], 1.0, rtol=1e-4)
    np.testing.assert_array_equal(train[:, ~varies], 0.0)  # a constant column
    np.testing.assert_array_equal(np.asarray(prepared.table.scaler.scale)[~varies], 1.0)  # as scikit-learn


REFUSED_MAGNITUDES = {
    "differences that underflow": (scaled("f0", 1e-170), "differ by too little"),
    "values whose variance overflows": (scaled("f0", 1e200), "too large"),
    "a lone huge value": (lone_value(1e300), "rescale the column"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_MAGNITUDES))
def test_unrepresentable_magnitudes_are_refused_by_column(tmp_path, case):
    mutate, expected = REFUSED_MAGNITUDES[case]
    path = tmp_path / "data.parquet"
    mutate(blobs_frame()).to_parquet(path, index=False)
    message = refusal(path, tmp_path)
    assert f"{path}: feature column 'f0'" in message and expected in message


def test_a_standardised_value_beyond_float32_names_the_column_and_row():
    raw = np.array([[0.0, 1.0], [2.0, 1e39]])
    with np.errstate(over="ignore"):
        values = standardise(raw, ScalerStats(mean=[0.0, 0.0], scale=[1.0, 1.0]))
    with pytest.raises(DatasetError, match=r"in.csv: feature column 'g' at row 11 holds 1e\+39"):
        check_standardised(values, raw, ["f", "g"], 10, "in.csv")


# --- fractions that leave a split too few rows for the classes -------------------------------------


TOO_FEW = {  # rows, val_fraction, test_fraction -> the split named
    "train": (12, 0.3, 0.45, "2 train rows", "lower val_fraction or test_fraction"),
    "val": (12, 0.1, 0.15, "val rows", "raise val_fraction"),
    "test": (30, 0.3, 0.05, "1 test rows", "raise test_fraction"),
}


@pytest.mark.parametrize("case", sorted(TOO_FEW))
def test_fractions_that_leave_a_split_too_few_rows_are_refused(tmp_path, case):
    rows, val, test, split, fix = TOO_FEW[case]
    path = tmp_path / "data.parquet"
    frame = blobs_frame(n_rows=rows)
    frame.assign(species=np.array(["a", "b", "c"])[np.arange(rows) % 3]).to_parquet(path, index=False)
    message = refusal(path, tmp_path, val_fraction=val, test_fraction=test)
    assert f"val_fraction={val} and test_fraction={test}" in message
    assert split in message and fix in message and "'a': " in message


RARE_CLASSES = {  # rows of each rare class beside 1,000 of a common one -> the refusal
    "the test split leaves a rare class one row": (3, "a single row to share between train and val"),
    "the draw leaves train without a rare class": (4, "the train split of 1008 rows"),
}


@pytest.mark.parametrize("case", sorted(RARE_CLASSES))
def test_a_split_without_a_row_of_every_class_is_refused(case):
    rare, expected = RARE_CLASSES[case]
    codes = np.repeat([0, 1, 2], [1000, rare, rare])
    with pytest.raises(DatasetError) as error:
        checked_assignment(codes, ["a", "b", "c"], SplitConfig(0.45, 0.45), "in.csv")
    message = str(error.value)
    assert message.startswith("in.csv: ") and expected in message
    assert f"'b': {rare}" in message and "val_fraction=0.45 and test_fraction=0.45" in message


@pytest.mark.parametrize(
    "rows, val, test", [(12, 0.3, 0.45), (30, 0.15, 0.15), (101, 0.2, 0.3), (1000, 0.49, 0.49), (7, 0.4, 0.1)]
)
def test_split_rows_counts_as_the_split_draws(rows, val, test):
    split = SplitConfig(val_fraction=val, test_fraction=test)
    codes = np.arange(rows) % 2
    sure = split_rows(rows, split)
    if min(sure.values()) < 2:  # scikit-learn would refuse, as check_split_sizes does first
        return
    assignment = assign_splits(codes, split)
    drawn = {name: int((assignment == i).sum()) for i, name in enumerate(SPLITS)}
    assert drawn["train"] == sure["train"]
    assert drawn["val"] >= sure["val"] and drawn["test"] >= sure["test"]


# --- part files with no rows ---------------------------------------------------------------------


def no_columns(path: Path) -> None:
    pq.write_table(pa.table({}), path)


EMPTY_PARTS = {
    "no rows": lambda path: blobs_frame().iloc[:0].to_parquet(path, index=False),
    "no rows and no columns": no_columns,
    "0 bytes": lambda path: path.write_bytes(b""),
}


@pytest.mark.parametrize("case", sorted(EMPTY_PARTS))
def test_empty_part_files_are_skipped(tmp_path, case):
    parts = tmp_path / "parts.parquet"
    parts.mkdir()
    EMPTY_PARTS[case](parts / "part-00000.parquet")
    blobs_frame().to_parquet(parts / "part-00001.parquet", index=False)
    EMPTY_PARTS[case](parts / "part-00002.parquet")
    (parts / "_SUCCESS").write_bytes(b"")  # Spark's marker and an unfinished attempt: not data
    (parts / "_temporary" / "0").mkdir(parents=True)
    (parts / "_temporary" / "0" / "part-00003.parquet").write_bytes(b"half written")
    prepared = prepare_unchanged(parts, tmp_path)
    assert sum(prepared.table.rows.values()) == 300 and prepared.table.feature_names == FEATURES


def test_a_folder_of_empty_parts_has_no_rows(tmp_path):
    parts = tmp_path / "parts.parquet"
    parts.mkdir()
    for index, write in enumerate(EMPTY_PARTS.values()):
        write(parts / f"part-{index:05d}.parquet")
    assert "no rows" in refusal(parts, tmp_path)


# --- trailing delimiters, decimals, long lines ---------------------------------------------------


def test_lines_ending_with_a_delimiter_leave_no_column(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text(blobs_frame().to_csv(index=False).replace("\n", ",\n"))
    prepared = prepare_unchanged(path, tmp_path)
    assert prepared.table.feature_names == FEATURES
    assert any("end with a delimiter" in note for note in prepared.table.notes)


def test_decimal_columns_are_read_as_numbers(tmp_path):
    frame = blobs_frame().round(3)
    as_decimals = frame.assign(f0=[decimal.Decimal(f"{value:.3f}") for value in frame["f0"]])
    decimals, floats = tmp_path / "decimals.parquet", tmp_path / "floats.parquet"
    as_decimals.to_parquet(decimals, index=False)
    frame.to_parquet(floats, index=False)
    assert pa.types.is_decimal(pq.read_schema(decimals).field("f0").type)
    prepared = prepare_unchanged(decimals, tmp_path / "d")
    expected = prepare_unchanged(floats, tmp_path / "f")
    np.testing.assert_array_equal(split_features(prepared, "train"), split_features(expected, "train"))


def with_a_long_label(frame: pd.DataFrame, length: int) -> pd.DataFrame:
    """Three rows of a class whose label is `length` characters: valid data, very long lines."""
    return pd.concat([frame, frame.iloc[:3].assign(species="x" * length)], ignore_index=True)


def test_a_2_mib_line_is_read(tmp_path):
    path = tmp_path / "data.csv"
    with_a_long_label(blobs_frame(), 2 << 20).to_csv(path, index=False)
    prepared = prepare_unchanged(path, tmp_path)
    assert len(prepared.table.class_labels) == 4 and sum(prepared.table.rows.values()) == 303


@pytest.mark.parametrize("first_row", [False, True], ids=["later line", "first line"])
def test_a_line_longer_than_the_block_is_named_with_its_length(tmp_path, monkeypatch, first_row):
    monkeypatch.setattr(reading, "CSV_BLOCK_BYTES", 1 << 12)
    monkeypatch.setattr(reading, "GUESS_BLOCK_BYTES", 1 << 12)
    frame = with_a_long_label(blobs_frame(), 10_000)
    if first_row:
        frame = frame.iloc[::-1]
    path = tmp_path / "data.csv"
    frame.to_csv(path, index=False)
    line = 2 if first_row else 302
    message = refusal(path, tmp_path)
    assert message.startswith(f"{path}: a line is longer than the 4,096 bytes")
    assert f"line {line} has 10,0" in message and "parquet" in message
