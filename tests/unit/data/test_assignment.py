"""assignment.py: which split each row goes to. A stratified, seeded random split, refused when the
fractions leave a split too few rows for the classes; or a time-ordered split (`SplitConfig.split_by`):
the earliest rows train, the next validate, the latest test, and equal times stay in one split."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest
from sklearn.model_selection import train_test_split

from tasks.core.data import assignment as assignment_module
from tasks.core.data.assignment import (
    SPLITS,
    SplitConfig,
    approximate_mode,
    assign_splits,
    checked_assignment,
    grouped_positions,
    split_rows,
    val_share,
)
from tasks.core.data.files import DatasetError
from tasks.core.data.prepare import prepare_dataset
from tasks.core.data.target import quantile_bins
from tests.conftest import blobs_frame
from tests.unit.data.tables import (
    assignment_of,
    prepare,
    prepare_y,
    refusal,
    refusal_y,
    split_frames,
    timed_frame,
    times_by_split,
    two_features,
    write_frame,
)

# --- a stratified random split -------------------------------------------------------------------


def test_split_is_stratified_and_deterministic(blobs, write_table, tmp_path):
    path = write_table(blobs)
    first = prepare(path, tmp_path / "a", seed=7)
    again = prepare(path, tmp_path / "b", seed=7)
    other = prepare(path, tmp_path / "c", seed=8)
    a, b, c = split_frames(first), split_frames(again), split_frames(other)
    for name in SPLITS:
        pd.testing.assert_frame_equal(a[name], b[name])
    assert not a["test"].equals(c["test"])
    overall = blobs["species"].value_counts(normalize=True).sort_index().to_numpy()
    for frame in a.values():
        shares = frame["species"].value_counts(normalize=True).sort_index().to_numpy()
        np.testing.assert_allclose(shares, overall, atol=0.05)


def test_split_fractions_are_validated():
    with pytest.raises(DatasetError, match="test_fraction"):
        SplitConfig(test_fraction=0.0)


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


def test_a_continuous_label_gives_a_bounded_message(tmp_path):
    frame = two_features(2_000).assign(y=np.random.default_rng(1).normal(size=2_000))
    message = refusal_y(write_frame(frame, tmp_path / "data.csv"), tmp_path, "classification")
    assert len(message) < 1_000
    assert "2,000 of 2,000 classes have fewer than 3 rows" in message
    assert "and 1,992 more" in message and "looks continuous" in message
    assert "problem_type='regression'" in message
    assert prepare_y(
        write_frame(frame, tmp_path / "data.csv"), tmp_path
    ).table.target.regression  # under auto


def test_a_classification_of_the_same_table_is_refused_as_before_but_hints_at_regression(diabetes, tmp_path):
    with pytest.raises(DatasetError, match="problem_type='regression'"):
        prepare_dataset(diabetes, "target", str(tmp_path), SplitConfig(problem_type="classification"))


# --- a time-ordered split ------------------------------------------------------------------------


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


# ---- the stratified split, against scikit-learn's train_test_split ---------------------------------


def sklearn_assignment(codes: np.ndarray, split: SplitConfig) -> np.ndarray:
    """The assignment as it was drawn before: two train_test_split calls, test then val."""
    rows = np.arange(len(codes))
    rest, test = train_test_split(
        rows, test_size=split.test_fraction, stratify=codes, random_state=split.seed
    )
    _, val = train_test_split(rest, test_size=val_share(split), stratify=codes[rest], random_state=split.seed)
    assignment = np.zeros(len(codes), dtype=np.uint8)
    assignment[val] = SPLITS.index("val")
    assignment[test] = SPLITS.index("test")
    return assignment


def outcome(draw, codes: np.ndarray, split: SplitConfig) -> np.ndarray | type:
    try:
        return draw(codes, split)
    except ValueError as error:
        return type(error)


def labels(kind: str, rows: int) -> np.ndarray:
    rng = np.random.default_rng(rows)
    if kind == "balanced":
        return np.arange(rows) % 2
    if kind == "95:5":
        return (rng.random(rows) < 0.05).astype(np.int64)
    if kind == "many classes":
        return rng.integers(0, max(2, rows // 20), rows)
    if kind == "a class of 2 rows":
        return np.concatenate([rng.integers(0, 3, rows - 2), [3, 3]])[rng.permutation(rows)]
    if kind == "some codes unused":
        return rng.choice([1, 4, 9], rows)
    return quantile_bins(rng.lognormal(size=rows))  # a regression's strata


KINDS = ["balanced", "95:5", "many classes", "a class of 2 rows", "some codes unused", "quantile bins"]


def assert_same_outcome(codes: np.ndarray, split: SplitConfig) -> None:
    """The same assignment as scikit-learn's, or a ValueError where it raised one."""
    ours, theirs = outcome(assign_splits, codes, split), outcome(sklearn_assignment, codes, split)
    if isinstance(theirs, type):
        assert ours is theirs, split
    else:
        assert isinstance(ours, np.ndarray) and ours.dtype == np.uint8
        np.testing.assert_array_equal(ours, theirs, err_msg=str(split))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [10, 37, 1000, 100_000])
def test_the_split_is_the_one_scikit_learn_drew(kind, rows):
    codes = labels(kind, rows)
    for seed, val, test in [(0, 0.15, 0.15), (7, 0.2, 0.1), (12345, 0.3, 0.45)]:
        assert_same_outcome(codes, SplitConfig(val_fraction=val, test_fraction=test, seed=seed))


def test_a_split_scikit_learn_refuses_is_refused():
    for rare in (2, 3, 4):  # the test split may leave a rare class a single row for the val split
        for seed in range(5):
            assert_same_outcome(np.repeat([0, 1, 2], [1000, rare, rare]), SplitConfig(0.45, 0.45, seed=seed))
    with pytest.raises(ValueError, match="only 1 member"):
        assign_splits(np.repeat([0, 1, 2], [1000, 3, 3]), SplitConfig(0.45, 0.45))
    with pytest.raises(ValueError, match="only 1 member"):
        assign_splits(np.repeat([0, 1], [100, 1]), SplitConfig())
    with pytest.raises(ValueError, match="number of classes"):
        assign_splits(np.arange(40) % 20, SplitConfig())


@pytest.mark.parametrize(
    "counts, draws, seed, expected",  # scikit-learn's own examples of its _approximate_mode
    [
        ([4, 2], 3, 0, [2, 1]),
        ([5, 2], 4, 0, [3, 1]),
        ([2, 2, 2, 1], 2, 0, [0, 1, 1, 0]),
        ([2, 2, 2, 1], 2, 42, [1, 1, 0, 0]),
    ],
)
def test_approximate_mode_breaks_ties_as_scikit_learn_does(counts, draws, seed, expected):
    drawn = approximate_mode(np.array(counts), draws, np.random.RandomState(seed))
    assert drawn.tolist() == expected


def test_the_split_of_a_million_rows_takes_a_few_bytes_a_row():
    rows = 1_000_000
    codes = (np.random.default_rng(0).random(rows) < 0.3).astype(np.int64)
    tracemalloc.start()
    try:
        assign_splits(codes, SplitConfig())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # About 13 bytes a row; scikit-learn's train_test_split took about 79.
    assert peak / rows < 30


def test_a_negative_stratum_code_is_refused():
    with pytest.raises(ValueError, match="0 or more"):
        assign_splits(np.array([0, 1, -1] * 10), SplitConfig())


@pytest.mark.parametrize("strata_count", [1, 2, 8, 9, 40])
def test_positions_grouped_by_stratum_are_a_stable_argsort(monkeypatch, strata_count):
    """A pass a stratum (few strata) or a chunked sort (many): both as `np.argsort(kind="stable")`."""
    monkeypatch.setattr(assignment_module, "ROWS_PER_CHUNK", 7)
    strata = np.random.default_rng(strata_count).integers(0, strata_count, 500).astype(np.uint8)
    strata[strata == strata_count - 1] = 0 if strata_count > 2 else strata[0]  # a stratum with no row
    counts = np.bincount(strata, minlength=strata_count)
    grouped = grouped_positions(strata, counts)
    assert grouped.dtype == np.int32
    np.testing.assert_array_equal(grouped, np.argsort(strata, kind="stable"))
