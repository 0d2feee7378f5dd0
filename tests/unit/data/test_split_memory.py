"""The stratified split draws the rows scikit-learn's train_test_split drew, with a fraction of its memory;
the labels are coded a chunk of rows at a time, as np.unique codes them."""

import tracemalloc

import numpy as np
import pyarrow as pa
import pytest
from sklearn.model_selection import train_test_split

from tasks.core.data import labels as labels_module
from tasks.core.data.assignment import SPLITS, SplitConfig, approximate_mode, assign_splits, val_share
from tasks.core.data.labels import clean_labels, sorted_classes
from tasks.core.data.target import quantile_bins


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


@pytest.mark.parametrize(
    "values",
    [
        np.array(["b", "a", "zz", "a", "10", "9", "b", "Ä"] * 5, dtype=object),
        np.random.default_rng(0).integers(-3, 40, 500),
        np.array([0.5, -0.0, 2.0, 0.0, 0.5] * 4),
        np.array([True, False, False, True]),
    ],
)
def test_labels_hashed_a_chunk_at_a_time_code_as_np_unique(monkeypatch, values):
    monkeypatch.setattr(labels_module, "LABEL_CHUNK_ROWS", 3)
    classes, codes = sorted_classes(values)
    expected_classes, expected_codes = np.unique(values, return_inverse=True)
    assert classes.tolist() == expected_classes.tolist() and codes.dtype == np.int32
    np.testing.assert_array_equal(codes, expected_codes)


TEXT_LABELS = [
    ["a", " a", "b ", None, "", "  "],
    ["c", "a", None],
    ["7", "07", "2.5"],
    ["1", " 2", "", None],
    ["nan", "3"],
]


@pytest.mark.parametrize("from_csv", [False, True])
def test_text_labels_read_a_batch_at_a_time_clean_as_the_whole_column(from_csv):
    for chunks in (
        [TEXT_LABELS[0], TEXT_LABELS[1]],
        [TEXT_LABELS[2]],
        [TEXT_LABELS[3]],
        [TEXT_LABELS[3], TEXT_LABELS[4]],
    ):
        text = pa.chunked_array(chunks, type=pa.string())
        by_batch = pa.chunked_array([chunk.dictionary_encode() for chunk in text.chunks])
        whole, batched = (clean_labels(labels, "in.csv", "label", from_csv) for labels in (text, by_batch))
        np.testing.assert_array_equal(batched.missing, whole.missing)
        assert batched.values.dtype == whole.values.dtype and batched.values.tolist() == whole.values.tolist()


def test_a_negative_stratum_code_is_refused():
    with pytest.raises(ValueError, match="0 or more"):
        assign_splits(np.array([0, 1, -1] * 10), SplitConfig())
