"""The tables the data tests prepare, the ways they prepare them, and the checks on what comes out:
shared by the test modules of this folder (and by tests elsewhere that need the messy table)."""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from tasks.core.data.assignment import SPLITS, SplitConfig
from tasks.core.data.column_kinds import propose_kinds
from tasks.core.data.encoding import batch_stats
from tasks.core.data.files import DatasetError
from tasks.core.data.pieces import (
    assign_pieces,
    collected,
    encoded,
    merged_encoding,
    merged_scaler,
    piece_stats,
    plan_pieces,
    write_piece,
)
from tasks.core.data.prepare import PreparedSplits, prepare_dataset
from tasks.core.data.splits import batch_features
from tasks.core.data.writing import RAW_SPLIT
from tests.conftest import blobs_frame

# --- blobs, labelled 'species' ----------------------------------------------------------------


FEATURES = ["f0", "f1", "f2", "f3"]


def prepare(path: str, tmp_path, label: str = "species", **split) -> PreparedSplits:
    """Prepared in one pod into `tmp_path`/out."""
    return prepare_dataset(path, label, str(tmp_path / "out"), SplitConfig(**split))


def split_frames(prepared: PreparedSplits) -> dict[str, pd.DataFrame]:
    return {name: pq.read_table(path).to_pandas() for name, path in prepared.paths.items()}


def row_ids(prepared: PreparedSplits, frame: pd.DataFrame, split: str) -> np.ndarray:
    """Column f0 back as the row id it was: standardised in the train and val splits, raw in the test split."""
    ids = frame["f0"].to_numpy()
    if split != RAW_SPLIT:
        ids = ids * prepared.table.scaler.scale[0] + prepared.table.scaler.mean[0]
    return np.rint(ids).astype(int)


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


# --- two features, labelled 'y' -----------------------------------------------------------------


def two_features(n_rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"f0": rng.normal(size=n_rows), "f1": rng.normal(size=n_rows)})


def with_labels(labels: list, n_rows: int = 60) -> pd.DataFrame:
    """`n_rows` rows whose label cycles through `labels`."""
    return two_features(n_rows).assign(y=[labels[i % len(labels)] for i in range(n_rows)])


def write_frame(frame: pd.DataFrame, path: Path, **csv_options) -> str:
    if path.suffix == ".csv":
        frame.to_csv(path, index=False, **csv_options)
    else:
        frame.to_parquet(path, index=False)
    return str(path)


def prepare_y(path: str, tmp_path: Path, problem_type: str = "auto") -> PreparedSplits:
    """Prepared in one pod into `tmp_path`/out, the label in column 'y'."""
    return prepare_dataset(path, "y", str(tmp_path / "out"), SplitConfig(problem_type=problem_type))


def refusal_y(path: str, tmp_path: Path, problem_type: str = "auto") -> str:
    with pytest.raises(DatasetError) as error:
        prepare_y(path, tmp_path, problem_type)
    return str(error.value)


# --- uneven parts, prepared in one pod and in pieces ---------------------------------------------


# Uneven parts: one of a single row, one holding one class only, one of many rows.
PART_ROWS = (1, 40, 7, 180, 72)


def uneven_parts(folder: Path, suffix: str, labels: str = "species") -> pd.DataFrame:
    """A folder of parts of PART_ROWS rows (not named like a format); the whole table they hold."""
    whole = blobs_frame(n_rows=sum(PART_ROWS), seed=5)
    whole.loc[1:40, labels] = "setosa"  # the second part holds a single class
    folder.mkdir()
    starts = np.cumsum((0, *PART_ROWS))
    for index, (start, end) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        part = whole.iloc[start:end]
        name = folder / f"part-{index:05d}{suffix}"
        part.to_csv(name, index=False) if suffix.startswith(".csv") else part.to_parquet(name, index=False)
    return whole


def split_tables(prepared: PreparedSplits) -> dict[str, pa.Table]:
    return {name: ds.dataset(prepared.paths[name], format="parquet").to_table() for name in SPLITS}


def assert_same_splits(pieces: PreparedSplits, one_pod: PreparedSplits) -> None:
    """The same rows and labels in each split; the raw split's columns bit for bit, the others' encoded
    features within float32 rounding; the same encoding, and a scaler within float64 rounding."""
    expected, found = split_tables(one_pod), split_tables(pieces)
    label = one_pod.table.label_column
    for name in SPLITS:
        assert found[name].schema == expected[name].schema
        assert found[name].column(label).equals(expected[name].column(label))  # bit for bit, in order
        if name == RAW_SPLIT:
            for column in one_pod.table.columns:
                assert found[name].column(column).equals(expected[name].column(column)), column
            continue
        features = one_pod.table.feature_names
        got, want = (batch_features(t, features) for t in (found[name], expected[name]))
        np.testing.assert_allclose(got, want, rtol=2e-7, atol=2e-7)
    assert pieces.table.rows == one_pod.table.rows
    assert pieces.table.class_labels == one_pod.table.class_labels
    assert pieces.table.class_counts == one_pod.table.class_counts
    assert pieces.table.label_kind == one_pod.table.label_kind and pieces.table.notes == one_pod.table.notes
    assert pieces.table.columns == one_pod.table.columns
    assert pieces.table.feature_names == one_pod.table.feature_names
    assert pieces.table.encoding == one_pod.table.encoding  # fitted on exactly merged statistics
    np.testing.assert_allclose(pieces.table.scaler.mean, one_pod.table.scaler.mean, rtol=1e-12)
    np.testing.assert_allclose(pieces.table.scaler.scale, one_pod.table.scaler.scale, rtol=1e-12)


def digests(folder: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.iterdir())}


# --- the messy table: what users bring -----------------------------------------------------------


MESSY_ROWS = 240
MESSY_PART_ROWS = (1, 60, 9, 120, 50)  # uneven parts, one of a single row
MESSY_UNLABELLED = [5, 77, 200]


def messy_frame(csv: bool) -> pd.DataFrame:
    """Row 0 holds a value in every column: a CSV part of that row alone still reads as the others do."""
    frame = blobs_frame(n_rows=MESSY_ROWS, n_features=2, seed=4)
    index = range(MESSY_ROWS)
    frame["colour"] = np.array(["red", "green", "blue", None], dtype=object)[np.arange(MESSY_ROWS) % 4]
    frame["member"] = np.array([True, False, None], dtype=object)[np.arange(MESSY_ROWS) % 3]
    start = datetime.date(2023, 12, 30)
    frame["joined"] = [None if i % 11 == 5 else start + datetime.timedelta(days=3 * i) for i in index]
    amount = np.random.default_rng(2).normal(100.0, 20.0, size=MESSY_ROWS).round(2)
    if csv:  # what a CSV holds: empty cells, 'NA' and 'nan' (pyarrow reads all three as missing)
        frame["amount"] = [("", "NA", "nan")[i % 3] if i % 7 == 3 else str(v) for i, v in enumerate(amount)]
    else:
        frame["amount"] = np.where(np.arange(MESSY_ROWS) % 7 == 3, np.nan, amount)
    frame["rate"] = 7.0
    frame["customer_id"] = [f"c{i:05d}" for i in index]
    frame["channel"] = "web"
    frame.loc[MESSY_UNLABELLED, "species"] = None
    return frame


def write_messy(folder: Path, suffix: str) -> str:
    """The messy table as a folder of uneven parts."""
    frame = messy_frame(csv=suffix == ".csv")
    folder.mkdir()
    starts = np.cumsum((0, *MESSY_PART_ROWS))
    for index, (start, end) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        part, name = frame.iloc[start:end], folder / f"part-{index:05d}{suffix}"
        part.to_csv(name, index=False) if suffix == ".csv" else part.to_parquet(name, index=False)
    return str(folder)


def prepare_messy(path: str, out: Path, pieces: int) -> PreparedSplits:
    """Prepared in one pod (`pieces` 0) or in `pieces` pieces, as the messy tables' tests compare them."""
    if pieces:
        return prepare_in_pieces(path, "species", str(out), SplitConfig(seed=1), pieces)
    return prepare_dataset(path, "species", str(out), SplitConfig(seed=1))


# --- a table with a time column -------------------------------------------------------------------


def timed_frame(n_rows: int = 300, seed: int = 0) -> pd.DataFrame:
    """Blobs with a timestamp column in shuffled order, distinct to the second."""
    frame = blobs_frame(n_rows=n_rows, seed=seed)
    seconds = np.random.default_rng(seed).permutation(n_rows) * 3600
    return frame.assign(at=pd.Timestamp("2024-01-01") + pd.to_timedelta(seconds, unit="s"))


def assignment_of(path, split: SplitConfig, tmp_path, count: int) -> np.ndarray:
    pieces = plan_pieces(str(path), "species", count)
    out = tmp_path / f"out-{count}"
    assign_pieces(str(path), "species", split, pieces, str(out), str(tmp_path / f"a-{count}.npy"))
    return np.load(tmp_path / f"a-{count}.npy")


def times_by_split(times: np.ndarray, assignment: np.ndarray) -> list[np.ndarray]:
    return [times[assignment == index] for index in range(len(SPLITS))]


# --- mixed feature columns, fitted and encoded in memory ------------------------------------------


def fit(table, overrides=None, **fit_args):
    kinds = propose_kinds(table.schema, overrides=overrides, sample=table)
    return batch_stats(kinds, table).fit(**fit_args)


def encoded_columns(fitted, table, **transform_args):
    return dict(zip(fitted.encoded_names(), fitted.transform(table, **transform_args).T, strict=True))


# --- preparing in pieces, in one process ---------------------------------------------------------


def prepare_in_pieces(
    uri: str,
    label_column: str,
    out_dir: str,
    split: SplitConfig,
    count: int,
    column_kinds: Mapping[str, str] | None = None,
) -> PreparedSplits:
    """`prepare_dataset` in at most `count` pieces, one after another, in one process: the core steps in
    the order tasks/preprocess.py's `preprocess_in_pieces` runs them as tasks. Each split is a folder
    of parts under `out_dir`."""
    pieces = plan_pieces(uri, label_column, count)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    assignment_file = f"{out_dir}/assignment.npy"
    layout = assign_pieces(uri, label_column, split, pieces, out_dir, assignment_file, column_kinds)
    assignment = np.load(assignment_file, mmap_mode="r")
    stats = [piece_stats(layout, piece, assignment) for piece in pieces]
    layout = encoded(layout, merged_encoding(layout, stats))
    scaler = merged_scaler(layout, stats)
    written = [write_piece(layout, piece, assignment, scaler) for piece in pieces]
    return collected(layout, scaler, written)
