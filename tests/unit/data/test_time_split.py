"""A time-ordered split (`SplitConfig.split_by`): the earliest rows train, the next validate, the latest
test; equal times stay in one split; one pod and pieces cut at the same times."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest

from tasks.core.data.assignment import SPLITS, UNLABELLED, SplitConfig
from tasks.core.data.files import DatasetError
from tasks.core.data.pieces import assign_pieces, plan_pieces
from tasks.core.data.prepare import prepare_dataset
from tests.conftest import blobs_frame

PART_ROWS = (1, 40, 7, 180, 72)  # uneven parts, as tests/unit/data/test_pieces.py cuts them


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


def test_the_earliest_rows_train_and_the_latest_test(tmp_path, write_table):
    frame = timed_frame()
    split = SplitConfig(val_fraction=0.2, test_fraction=0.1, split_by="at")
    assignment = assignment_of(write_table(frame), split, tmp_path, 1)
    train, val, test = times_by_split(frame["at"].to_numpy(), assignment)
    assert train.max() < val.min() and val.max() < test.min()
    assert (len(train), len(val), len(test)) == (210, 60, 30)  # distinct times: the shares exactly


def test_the_prepared_splits_follow_the_times_and_the_note_names_the_cuts(tmp_path, write_table):
    frame = timed_frame()
    split = SplitConfig(split_by="at")
    prepared = prepare_dataset(write_table(frame), "species", str(tmp_path / "out"), split)
    assert prepared.table.rows == {"train": 210, "val": 45, "test": 45}
    test = ds.dataset(prepared.paths["test"], format="parquet").to_table()
    ordered = np.sort(frame["at"].to_numpy())
    assert test.column("at").to_numpy().min() == ordered[255]  # the raw split keeps the column
    assert "at:days" in prepared.table.feature_names  # still a feature: days since the first train time
    note = next(note for note in prepared.table.notes if note.startswith("split by"))
    assert note == (
        "split by 'at' (in time order, not at random): train 2024-01-01..2024-01-09T17:00, "
        "val after 2024-01-09T17:00 up to 2024-01-11T14:00, test after 2024-01-11T14:00 up to 2024-01-13T11:00"
    )


def test_a_dropped_time_column_still_orders_the_split(tmp_path, write_table):
    frame = timed_frame()
    split = SplitConfig(split_by="at")
    path = write_table(frame)
    prepared = prepare_dataset(path, "species", str(tmp_path / "out"), split, {"at": "drop"})
    assert not any(name.startswith("at") for name in prepared.table.feature_names)
    assert prepared.table.rows == {"train": 210, "val": 45, "test": 45}


def test_equal_times_stay_in_the_earlier_split(tmp_path, write_table):
    frame = blobs_frame(n_rows=200, seed=1).assign(day=np.repeat(np.arange(10), 20))  # 20 rows a day
    split = SplitConfig(val_fraction=0.15, test_fraction=0.15, split_by="day")
    assignment = assignment_of(write_table(frame), split, tmp_path, 1)
    train, val, test = times_by_split(frame["day"].to_numpy(), assignment)
    # 140 rows train by share: days 0-6 exactly; val reaches row 170, within day 8, which it takes whole.
    assert (set(train), set(val), set(test)) == ({0, 1, 2, 3, 4, 5, 6}, {7, 8}, {9})


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


def test_numbers_order_the_split_too(tmp_path, write_table):
    frame = blobs_frame(n_rows=100, seed=2).assign(step=np.random.default_rng(2).permutation(100) / 10)
    assignment = assignment_of(write_table(frame), SplitConfig(split_by="step"), tmp_path, 1)
    train, val, test = times_by_split(frame["step"].to_numpy(), assignment)
    assert train.max() < val.min() and val.max() < test.min() and len(train) == 70


@pytest.mark.parametrize(
    ("column", "values", "match"),
    [
        ("kind", ["a", "b", "c"], r"split_by column 'kind' holds text, not dates, times or numbers"),
        ("flag", [True, False, True], r"split_by column 'flag' holds bool, not dates"),
        ("when", [1.0, np.nan, 3.0], r"split_by column 'when' is missing in 20 labelled rows"),
        (
            "nowhere",
            None,
            r"split_by column 'nowhere' is not a column of the data; the columns to split by: 'f0'",
        ),
        ("species", None, r"split_by column 'species' is the label column"),
    ],
)
def test_unusable_columns_are_refused_by_name(tmp_path, write_table, column, values, match):
    frame = blobs_frame(n_rows=60)
    if values is not None:
        frame[column] = np.resize(np.array(values, dtype=object if column == "kind" else None), 60)
    with pytest.raises(DatasetError, match=match):
        prepare_dataset(write_table(frame), "species", str(tmp_path / "out"), SplitConfig(split_by=column))


def test_too_few_distinct_times_are_refused(tmp_path, write_table):
    frame = blobs_frame(n_rows=60).assign(day=[0] * 50 + [1] * 10)
    with pytest.raises(
        DatasetError, match=r"split by 'day' leaves the test split empty: .* 2 distinct values"
    ):
        prepare_dataset(write_table(frame), "species", str(tmp_path / "out"), SplitConfig(split_by="day"))


def test_a_class_only_in_the_latest_rows_is_refused(tmp_path, write_table):
    frame = blobs_frame(n_rows=90).assign(t=np.arange(90))
    frame["species"] = np.where(np.arange(90) < 80, "early", "late")
    with pytest.raises(
        DatasetError, match=r"the train split \(the earliest rows\) has no row of class 'late'"
    ):
        prepare_dataset(write_table(frame), "species", str(tmp_path / "out"), SplitConfig(split_by="t"))


def test_held_out_splits_missing_a_class_are_noted(tmp_path, write_table):
    frame = blobs_frame(n_rows=100, seed=3).assign(t=np.arange(100))
    frame.loc[frame.index >= 70, "species"] = "setosa"  # the latest rows: one class only
    frame.loc[:1, "species"] = ["versicolor", "virginica"]  # every class among the earliest rows
    prepared = prepare_dataset(
        write_table(frame), "species", str(tmp_path / "out"), SplitConfig(split_by="t")
    )
    assert any(
        note.startswith("the test split (split by time) has no row of class") for note in prepared.table.notes
    )


def test_a_random_split_is_unchanged_by_the_new_field(tmp_path, write_table):
    path = write_table(blobs_frame(n_rows=120))
    before = assignment_of(path, SplitConfig(seed=2), tmp_path, 1)
    assert np.array_equal(before, assignment_of(path, SplitConfig(seed=2, split_by=""), tmp_path, 3))


def test_the_label_column_is_refused_before_the_data_is_read():
    from tasks.core.validation import split_by_problems

    assert split_by_problems("", "label") == split_by_problems("day", "label") == []
    assert split_by_problems("label", "label") == [
        "input 'split_by' = 'label': is the label column; name a column of dates, times or numbers to "
        "split by, or leave it empty for a stratified random split"
    ]
