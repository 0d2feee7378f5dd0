"""pieces.py: preprocessing in pieces gives what one pod gives: the same rows in each split, in the same
order, with the same labels, and features within float32 rounding, however many pieces did the work;
for a messy table, a regression and a time-ordered split too, and through the map tasks a run launches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.core.data.assignment import SPLITS, UNLABELLED, SplitConfig
from tasks.core.data.files import DatasetError
from tasks.core.data.pieces import (
    assign_pieces,
    encoded,
    merged_stats,
    piece_stats,
    plan_pieces,
)
from tasks.core.data.prepare import PreparedSplits, fit_encoding, prepare_dataset
from tasks.core.data.scaling import encoded_moments
from tasks.core.data.splits import read_split
from tests.conftest import blobs_frame
from tests.unit.data.tables import (
    PART_ROWS,
    assert_same_splits,
    assignment_of,
    prepare_in_pieces,
    prepare_messy,
    timed_frame,
    times_by_split,
    uneven_parts,
    write_messy,
)


@pytest.mark.parametrize("count", [1, 3, 7])
@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".csv.gz"])
def test_pieces_give_the_one_pod_splits(tmp_path, count, suffix):
    folder = tmp_path / "parts"
    uneven_parts(folder, suffix)
    split = SplitConfig(seed=3)
    one_pod = prepare_dataset(str(folder), "species", str(tmp_path / "one"), split)
    pieces = prepare_in_pieces(str(folder), "species", str(tmp_path / "pieces"), split, count)
    planned = plan_pieces(str(folder), "species", count)
    assert len(planned) <= count and (len(planned) > 1) == (count > 1)
    assert len(list(Path(pieces.paths["train"]).glob("part-*.parquet"))) == len(planned)
    assert_same_splits(pieces, one_pod)


@pytest.mark.parametrize("count", [3, 7])
def test_row_groups_of_one_file_are_pieces(tmp_path, count):
    path = tmp_path / "large.parquet"
    frame = blobs_frame(n_rows=500, seed=6).assign(species=lambda f: f["species"].str.upper())
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path, row_group_size=64)
    split = SplitConfig(seed=1)
    pieces = plan_pieces(str(path), "species", count)
    assert len(pieces) == count and all(piece.files == [str(path)] for piece in pieces)
    one_pod = prepare_dataset(str(path), "species", str(tmp_path / "one"), split)
    assert_same_splits(
        prepare_in_pieces(str(path), "species", str(tmp_path / "pieces"), split, count), one_pod
    )


def test_integer_and_float_labels_keep_their_classes_in_every_piece(tmp_path):
    """A CSV part of integers alone is read as the whole column's floats, not as integers."""
    folder = tmp_path / "parts"
    whole = uneven_parts(folder, ".csv")
    codes = {"setosa": 1.0, "versicolor": 2.5, "virginica": 4.0, "other": 8.0}
    labelled = whole.assign(species=whole["species"].map(codes))
    starts = np.cumsum((0, *PART_ROWS))
    for index, start in enumerate(starts[:-1]):
        labelled.iloc[start : starts[index + 1]].to_csv(folder / f"part-{index:05d}.csv", index=False)
    split = SplitConfig(seed=0)
    one_pod = prepare_dataset(str(folder), "species", str(tmp_path / "one"), split)
    assert one_pod.table.label_kind == "float"
    assert_same_splits(prepare_in_pieces(str(folder), "species", str(tmp_path / "pieces"), split, 5), one_pod)


def test_merged_piece_statistics_equal_numpy_on_the_train_rows(tmp_path):
    folder = tmp_path / "parts"
    whole = uneven_parts(folder, ".parquet")
    pieces = plan_pieces(str(folder), "species", 4)
    layout = assign_pieces(
        str(folder), "species", SplitConfig(), pieces, str(tmp_path / "out"), str(tmp_path / "a.npy")
    )
    assignment = np.load(tmp_path / "a.npy")
    assert assignment.dtype == np.uint8 and len(assignment) == len(whole) == layout.first_rows[-1]
    stats = merged_stats(layout, [piece_stats(layout, piece, assignment) for piece in pieces])
    layout = encoded(layout, fit_encoding(stats, "parts"))
    assert layout.table.feature_names == layout.table.columns  # numbers, none missing: as they are
    total = encoded_moments(stats, layout.table.fitted_encoding())
    train = whole[layout.table.feature_names].to_numpy()[assignment == SPLITS.index("train")]
    assert total.count == len(train)
    np.testing.assert_allclose(total.mean, train.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(total.variance, train.var(axis=0), rtol=1e-10)
    np.testing.assert_array_equal(total.low, train.min(axis=0))


def test_a_bad_value_in_a_piece_is_named_by_its_row_in_the_input(tmp_path):
    folder = tmp_path / "parts"
    whole = uneven_parts(folder, ".parquet")
    whole.loc[200, "f2"] = np.inf
    whole.iloc[48:228].to_parquet(folder / "part-00003.parquet", index=False)
    with pytest.raises(DatasetError, match=r"feature column 'f2' has an infinite value \(inf\) at row 200"):
        prepare_in_pieces(str(folder), "species", str(tmp_path / "pieces"), SplitConfig(), 3)


@pytest.mark.parametrize("count", [1, 3, 7])
@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_pieces_give_the_one_pod_splits_and_encoding_of_a_messy_table(tmp_path, suffix, count):
    path = write_messy(tmp_path / "parts", suffix)
    one_pod = prepare_messy(path, tmp_path / "one", 0)
    assert_same_splits(prepare_messy(path, tmp_path / "pieces", count), one_pod)


def test_pieces_give_what_one_pod_gives_for_a_regression(diabetes, tmp_path):
    frame = pd.read_parquet(diabetes)
    folder = tmp_path / "parts"
    folder.mkdir()
    for index, rows in enumerate(np.array_split(np.arange(len(frame)), 3)):
        frame.iloc[rows].to_parquet(folder / f"part-{index}.parquet", index=False)
    split = SplitConfig(problem_type="regression")
    one_pod = prepare_dataset(str(folder), "target", str(tmp_path / "one"), split)
    pieces = prepare_in_pieces(str(folder), "target", str(tmp_path / "pieces"), split, 3)
    assert pieces.table.target == one_pod.table.target and pieces.table.rows == one_pod.table.rows
    for name in ("train", "val"):
        expected = read_split(one_pod.paths[name], one_pod.table.feature_names, "target")
        got = read_split(pieces.paths[name], pieces.table.feature_names, "target")
        np.testing.assert_array_equal(expected[1], got[1])
        np.testing.assert_allclose(expected[0], got[0], atol=1e-6)


def test_a_csv_regression_split_by_time_gives_the_same_splits_in_pieces(tmp_path):
    rng = np.random.default_rng(4)
    rows = 600
    frame = pd.DataFrame({
        "day": pd.date_range("2024-01-01", periods=rows, freq="D").strftime("%Y-%m-%d"),
        "x": rng.normal(size=rows),
        "price": rng.integers(100, 5_000, rows),  # whole numbers, many distinct: a regression under auto
    })  # fmt: skip
    folder = tmp_path / "csv"
    folder.mkdir()
    for index, part in enumerate(np.array_split(np.arange(rows), 3)):
        frame.iloc[part].to_csv(folder / f"part-{index}.csv", index=False)
    split = SplitConfig(split_by="day")
    one_pod = prepare_dataset(str(folder), "price", str(tmp_path / "one"), split)
    pieces = prepare_in_pieces(str(folder), "price", str(tmp_path / "pieces"), split, 3)
    table = one_pod.table
    assert table.target.regression and table.label_kind == "integer" and pieces.table.target == table.target
    assert any("split by 'day'" in note for note in table.notes)
    test = pd.read_parquet(one_pod.paths["test"])
    assert sorted(test["price"]) == sorted(frame["price"].iloc[-len(test) :])  # the latest rows test
    for name in ("train", "val"):
        expected = read_split(one_pod.paths[name], table.feature_names, "price")[1]
        np.testing.assert_array_equal(
            expected, read_split(pieces.paths[name], table.feature_names, "price")[1]
        )


@pytest.mark.parametrize("count", [3, 7])
@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_pieces_cut_at_the_same_times_as_one_pod(tmp_path, count, suffix):
    frame = timed_frame(sum(PART_ROWS), seed=5)
    frame["at"] = frame["at"].dt.strftime("%Y-%m-%dT%H:%M:%S")  # ISO text: read as dates
    frame.loc[[3, 77], "species"] = None  # rows without a label are in no split, in one pod or pieces
    folder = tmp_path / "parts"
    folder.mkdir()
    starts = np.cumsum((0, *PART_ROWS))
    for index, (start, end) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        part, name = frame.iloc[start:end], folder / f"part-{index:05d}{suffix}"
        part.to_csv(name, index=False) if suffix == ".csv" else part.to_parquet(name, index=False)
    split = SplitConfig(split_by="at")
    one_pod = assignment_of(folder, split, tmp_path, 1)
    assert np.array_equal(assignment_of(folder, split, tmp_path, count), one_pod)
    assert (one_pod[[3, 77]] == UNLABELLED).all()
    train, val, test = times_by_split(frame["at"].to_numpy(), one_pod)
    assert train.max() < val.min() and val.max() < test.min()


# --- the map tasks, as a run launches them -------------------------------------------------------


def test_prepare_data_maps_the_pieces_of_an_input_past_the_threshold(tmp_path, monkeypatch):
    from tasks.core.data.config import DataConfig
    from tasks.core.planning import planner
    from tasks.core.training.config import TrainConfig
    from tasks.plumbing.storage import dataset_uri
    from tasks.right_sizing import prepare_data

    folder = tmp_path / "parts"
    uneven_parts(folder, ".parquet")
    monkeypatch.setattr(planner, "PIECE_ROWS", 60)
    prepared, plan = prepare_data(
        data=DataConfig(str(folder), "species", split=SplitConfig(seed=2)), target="gpu",
        hyperparameters=TrainConfig(), plan_resources=True,
    )  # fmt: skip
    assert plan.pieces > 1 and plan.piece_mem
    one_pod = prepare_dataset(str(folder), "species", str(tmp_path / "one"), SplitConfig(seed=2))
    folders = {name: dataset_uri(getattr(prepared, name)) for name in SPLITS}
    assert all(len(list(Path(path).glob("part-*.parquet"))) == plan.pieces for path in folders.values())
    assert_same_splits(PreparedSplits(folders, prepared.table), one_pod)


@pytest.mark.slow  # runs the preprocessing tasks through Flyte's local map tasks
@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_the_map_tasks_give_the_one_pod_splits_of_a_messy_table(tmp_path, monkeypatch, suffix):
    """The kinds, the pieces' statistics and the fitted encoding cross the task boundaries unchanged."""
    from tasks.core.data.config import DataConfig
    from tasks.core.planning import planner
    from tasks.core.training.config import TrainConfig
    from tasks.plumbing.storage import dataset_uri
    from tasks.right_sizing import prepare_data

    path = write_messy(tmp_path / "parts", suffix)
    monkeypatch.setattr(planner, "PIECE_ROWS", 60)
    prepared, plan = prepare_data(
        data=DataConfig(path, "species", split=SplitConfig(seed=1)), target="gpu",
        hyperparameters=TrainConfig(), plan_resources=True,
    )  # fmt: skip
    assert plan.pieces > 1
    folders = {name: dataset_uri(getattr(prepared, name)) for name in ("train", "val", "test")}
    assert_same_splits(PreparedSplits(folders, prepared.table), prepare_messy(path, tmp_path / "one", 0))


def test_the_plan_summary_says_when_preprocessing_runs_in_pieces():
    from tasks.core.planning.planner import PreprocessPlan
    from tasks.types import ResourcePlan

    def summary(**pieces) -> str:
        plan = PreprocessPlan(10 * 2**30, 40_000_000, 65, "2", "3Gi", **pieces)
        return ResourcePlan(applied=True, target="gpu", framework="pytorch", preprocess=plan).summary()

    assert "preprocess: 2 CPU, 3Gi, then 10 pieces of 2Gi each for 40,000,000 rows x 65 columns" in summary(
        pieces=10, piece_mem="2Gi"
    )
    assert "preprocess: 2 CPU, 3Gi for 40,000,000 rows" in summary()
