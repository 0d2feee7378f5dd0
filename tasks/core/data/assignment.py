"""Which split (train, val, test) each row goes to: stratified, seeded and checked for size."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from tasks.core.data.column_kinds import all_iso_instants
from tasks.core.data.files import DatasetError
from tasks.core.data.kind_values import (
    blank_as_null,
    instant_micros,
    is_instant,
    is_number,
    is_text,
    text_instants,
)
from tasks.core.data.labels import looks_continuous
from tasks.core.data.reading import iter_batches
from tasks.core.data.split_config import SplitConfig
from tasks.core.data.splits import SPLITS
from tasks.core.messages import preview, shorten

UNLABELLED = 255  # in an assignment, a row in no split: its label is missing


def check_split_sizes(
    codes: np.ndarray, class_labels: list[str], split: SplitConfig, uri: str, label_column: str
) -> None:
    counts = np.bincount(codes, minlength=len(class_labels))
    too_rare = [
        f"{shorten(repr(class_labels[i]))} ({counts[i]} rows)" for i in np.flatnonzero(counts < len(SPLITS))
    ]
    hint = ""
    if looks_continuous(class_labels):
        hint = (
            f"; label column '{label_column}' looks continuous ({len(class_labels):,} distinct numbers), "
            "so it may be a quantity: set problem_type='regression' to predict it as a number"
        )
    if too_rare:
        raise DatasetError(
            f"{uri}: too few rows for a stratified train/val/test split: {len(too_rare):,} of "
            f"{len(class_labels):,} classes have fewer than {len(SPLITS)} rows: {preview(too_rare)}{hint}"
        )
    for name, rows in split_rows(len(codes), split).items():
        if rows < len(class_labels):
            fix = "lower val_fraction or test_fraction" if name == "train" else f"raise {name}_fraction"
            raise DatasetError(
                f"{uri}: too few rows for the split: {split_setting(codes, class_labels, split)} leave "
                f"{rows} {name} rows for {len(class_labels):,} classes; each split needs a row of every "
                f"class: add rows or {fix}{hint}"
            )


def split_setting(codes: np.ndarray, class_labels: list[str], split: SplitConfig) -> str:
    counts = np.bincount(codes, minlength=len(class_labels))
    by_class = preview([f"{label!r}: {n}" for label, n in zip(class_labels, counts, strict=True)])
    return (
        f"{len(codes)} rows (per class: {by_class}) with val_fraction={split.val_fraction} "
        f"and test_fraction={split.test_fraction}"
    )


def checked_assignment(
    codes: np.ndarray, class_labels: list[str], split: SplitConfig, uri: str
) -> np.ndarray:
    """`assign_splits`, refused when the train split lacks a class: the draw refuses some such splits
    in scikit-learn's words (a rare class left one row for the second draw) and draws others."""
    setting = split_setting(codes, class_labels, split)
    try:
        assignment = assign_splits(codes, split)
    except ValueError as err:
        raise DatasetError(  # the draw's own message names the class by its code
            f"{uri}: no stratified split of {setting}: the test split leaves a rare class a single row "
            "to share between train and val; add rows of the rare classes or lower test_fraction"
        ) from err
    missing = classes_not_in_train(codes, assignment, len(class_labels))
    if len(missing):
        raise DatasetError(
            f"{uri}: the train split of {setting} has no row of class "
            f"{preview([repr(class_labels[i]) for i in missing])}; add rows of that class or "
            "lower val_fraction and test_fraction"
        )
    return assignment


def classes_not_in_train(codes: np.ndarray, assignment: np.ndarray, n_classes: int) -> np.ndarray:
    """The class codes with no train row: a model never shown a class cannot predict it."""
    in_train = np.bincount(codes[assignment == SPLITS.index("train")], minlength=n_classes)
    return np.flatnonzero(in_train == 0)


def val_share(split: SplitConfig) -> float:
    """The val split's share of the rows left once the test split is taken out."""
    return split.val_fraction / (1.0 - split.test_fraction)


def split_rows(n_rows: int, split: SplitConfig) -> dict[str, int]:
    """Rows each split is sure to get from `assign_splits`: the draw (as train_test_split) rounds
    a held-out split up, so its fraction rounded down is a lower bound, and train gets the rest."""
    test = math.ceil(split.test_fraction * n_rows)
    val = math.ceil(val_share(split) * (n_rows - test))
    return {
        "val": math.floor(split.val_fraction * n_rows),
        "test": math.floor(split.test_fraction * n_rows),
        "train": n_rows - test - val,
    }


def assign_splits(codes: np.ndarray, split: SplitConfig) -> np.ndarray:
    """Deterministic stratified assignment: 0 = train, 1 = val, 2 = test, one byte per row. `codes` are
    each row's stratum (a class code or a quantile bin, 0 or more). The rows are those scikit-learn's
    `train_test_split` would pick, stratified and seeded alike: the test split from all rows, then
    the val split from the rest; drawn here with int32 row numbers rather than its int64 arrays
    and lists of ints, which took some 85 bytes a row."""
    if codes.min(initial=0) < 0:
        raise ValueError("a row's stratum code must be 0 or more")
    strata = codes.astype(np.min_scalar_type(codes.max(initial=0)), copy=False)  # one byte a row, mostly
    assignment = np.zeros(len(codes), dtype=np.uint8)
    rest, test = stratified_draw(strata, split.test_fraction, split.seed, with_train=True)
    assignment[test] = SPLITS.index("test")
    del test
    _, val = stratified_draw(strata[rest], val_share(split), split.seed, with_train=False)
    assignment[rest[val]] = SPLITS.index("val")
    return assignment


# ---- scikit-learn's StratifiedShuffleSplit, drawn with small arrays ---------------------------------
#
# `stratified_draw` consumes a fresh random state of the seed as StratifiedShuffleSplit (scikit-learn
# 1.9, `_iter_indices`) does: the per-class train and test counts (`approximate_mode`), a shuffle of each
# class's rows in row order, then a shuffle of the train rows (their order is the val draw's row order).
# A shuffle's swaps depend only on the length, so shuffling int32 row numbers in place matches its
# `rng.permutation` of int64 ones. Its last shuffle, of the test rows, orders rows whose split is
# already known and comes before no other draw, so it is skipped.

ROWS_PER_CHUNK = 1 << 16  # rows sorted at once by `grouped_positions`: its int64 work arrays stay small
FEW_STRATA = 8  # up to this many, `grouped_positions` finds each stratum's rows in turn rather than sorting


def row_numbers(n_rows: int) -> np.dtype:
    """The smallest integer type that numbers `n_rows` rows."""
    return np.dtype(np.int32 if n_rows < np.iinfo(np.int32).max else np.int64)


def stratified_draw(
    strata: np.ndarray, test_fraction: float, seed: int, with_train: bool
) -> tuple[np.ndarray | None, np.ndarray]:
    """The train and test positions in `strata` that `train_test_split(..., test_size=test_fraction,
    stratify=strata, random_state=seed)` returns: train in its order (None unless `with_train`), test
    in class order. Raises ValueError where scikit-learn would."""
    n_rows = len(strata)
    n_test = math.ceil(test_fraction * n_rows)
    n_train = n_rows - n_test
    check_draw_sizes(n_rows, n_train, test_fraction)
    counts = np.bincount(strata)
    check_class_counts(counts, n_train, n_test)
    class_counts = counts[counts > 0]
    rng = np.random.RandomState(seed)
    train_counts = approximate_mode(class_counts, n_train, rng)
    test_counts = approximate_mode(class_counts - train_counts, n_test, rng)
    grouped = grouped_positions(strata, counts)
    starts = np.concatenate(([0], np.cumsum(class_counts)[:-1]))
    for start, count in zip(starts, class_counts, strict=True):
        shuffle(rng, grouped[start : start + count])
    test_starts = starts + train_counts
    test = np.concatenate([grouped[s : s + n] for s, n in zip(test_starts, test_counts, strict=True)])
    if not with_train:
        return None, test
    train = np.concatenate([grouped[s : s + n] for s, n in zip(starts, train_counts, strict=True)])
    del grouped
    shuffle(rng, train)
    return train, test


def shuffle(rng: np.random.RandomState, rows: np.ndarray) -> None:
    """`rng.shuffle(rows)`, through an int64 copy: numpy shuffles 8-byte items about twice as fast as
    4-byte ones, and the swaps depend only on the length."""
    wide = rows.astype(np.int64)
    rng.shuffle(wide)
    rows[:] = wide


def check_draw_sizes(n_rows: int, n_train: int, test_fraction: float) -> None:
    """scikit-learn's `_validate_shuffle_split` check for a test fraction in (0, 1), in its words."""
    if n_train <= 0:
        raise ValueError(
            f"With n_samples={n_rows}, test_size={test_fraction} and train_size=None, the resulting "
            "train set will be empty. Adjust any of the aforementioned parameters."
        )


def check_class_counts(counts: np.ndarray, n_train: int, n_test: int) -> None:
    """StratifiedShuffleSplit's checks of the rows of each stratum value (`counts`), in its words."""
    if counts[counts > 0].min() < 2:
        raise ValueError(
            "The least populated classes in y have only 1 member, which is too few. The minimum "
            "number of groups for any class cannot be less than 2. Classes with too few members "
            f"are: {np.flatnonzero(counts == 1).tolist()}"
        )
    n_classes = np.count_nonzero(counts)
    for name, size in (("train", n_train), ("test", n_test)):
        if size < n_classes:
            raise ValueError(
                f"The {name}_size = {size} should be greater or equal to the number of classes = {n_classes}"
            )


def grouped_positions(strata: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """`np.argsort(strata, kind="stable")` as int32 (the positions grouped by stratum, in order within
    each), sorted a chunk at a time so that no int64 array of every row is made."""
    grouped = np.empty(len(strata), dtype=row_numbers(len(strata)))
    next_slot = np.concatenate(([0], np.cumsum(counts)[:-1]))
    present = np.flatnonzero(counts)
    for start in range(0, len(strata), ROWS_PER_CHUNK):
        chunk = strata[start : start + ROWS_PER_CHUNK]
        if len(present) <= FEW_STRATA:  # a pass a stratum beats a sort
            for stratum in present:
                rows = np.flatnonzero(chunk == stratum)
                grouped[next_slot[stratum] : next_slot[stratum] + len(rows)] = rows + start
                next_slot[stratum] += len(rows)
            continue
        by_stratum = np.argsort(chunk, kind="stable")
        chunk_strata = chunk[by_stratum]
        chunk_counts = np.bincount(chunk, minlength=len(counts))
        chunk_starts = np.concatenate(([0], np.cumsum(chunk_counts)[:-1]))
        slots = next_slot[chunk_strata] + np.arange(len(chunk)) - chunk_starts[chunk_strata]
        grouped[slots] = by_stratum + start
        next_slot += chunk_counts
    return grouped


def approximate_mode(class_counts: np.ndarray, n_draws: int, rng: np.random.RandomState) -> np.ndarray:
    """The rows of each class among `n_draws` drawn, ties broken at random: scikit-learn's
    `sklearn.utils.extmath._approximate_mode` (BSD-3-Clause), copied line for line so that the draw
    of its random state stays the same."""
    continuous = class_counts / class_counts.sum() * n_draws
    floored = np.floor(continuous)
    need_to_add = int(n_draws - floored.sum())
    if need_to_add > 0:
        remainder = continuous - floored
        values = np.sort(np.unique(remainder))[::-1]
        for value in values:
            (inds,) = np.where(remainder == value)
            add_now = min(len(inds), need_to_add)
            inds = rng.choice(inds, size=add_now, replace=False)
            floored[inds] += 1
            need_to_add -= add_now
            if need_to_add == 0:
                break
    return floored.astype(int)


# ---- a time-ordered split: train on the past, validate and test on the future ----------------------


@dataclass
class SplitTimes:
    """The `split_by` column of every row as values that sort in time order: int64 microseconds of a
    date or time (`instant_micros`), else the numbers (int64 or float64); `missing` marks the nulls."""

    column: str
    values: np.ndarray
    missing: np.ndarray
    instants: bool

    @classmethod
    def of(cls, column: pa.ChunkedArray, name: str, uri: str) -> SplitTimes:
        """The values of `column`, refused naming it unless it holds dates, times or numbers (text
        only where every value is an ISO date or time, as a feature column is read as dates)."""
        column = column.combine_chunks()
        if pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        kind = column.type
        if is_text(kind) and all_iso_instants(column):
            column = text_instants(blank_as_null(column))
            kind = column.type
        if is_instant(kind):
            return cls(name, instant_micros(column), column.is_null().to_numpy(zero_copy_only=False), True)
        if is_number(kind):
            exact = pa.int64() if pa.types.is_integer(kind) else pa.float64()
            values = pc.cast(column, exact, safe=False).to_numpy(zero_copy_only=False)
            missing = column.is_null().to_numpy(zero_copy_only=False)
            if exact == pa.float64():
                missing |= np.isnan(np.where(missing, 0.0, values))
            return cls(name, np.where(missing, 0, values).astype(exact.to_pandas_dtype()), missing, False)
        raise DatasetError(
            f"{uri}: split_by column {name!r} holds {'text' if is_text(kind) else kind}, not dates, times or numbers: a time-ordered "
            "split needs a column that orders the rows in time; pick another column or leave split_by empty"
        )

    def labelled(self, missing_label: np.ndarray) -> SplitTimes:
        keep = ~missing_label
        return SplitTimes(self.column, self.values[keep], self.missing[keep], self.instants)

    def describe(self, value: float) -> str:
        if self.instants:
            return str(np.datetime_as_string(np.datetime64(int(value), "us"), unit="auto"))
        return f"{value:g}" if self.values.dtype.kind == "f" else str(int(value))


def split_times(
    datasets: list[ds.Dataset], uri: str, split: SplitConfig, label_column: str
) -> SplitTimes | None:
    """The `split.split_by` column of every row, read from `datasets` in turn (the whole input, or its
    pieces in order); None for a random split. Refused naming the column where the data lacks it."""
    name = split.split_by
    if not name:
        return None
    schema = datasets[0].schema
    if name == label_column or name not in schema.names:
        why = "is the label column" if name == label_column else "is not a column of the data"
        columns = preview([repr(column) for column in schema.names if column != label_column])
        raise DatasetError(f"{uri}: split_by column {name!r} {why}; the columns to split by: {columns}")
    chunks = [
        batch.column(name) for dataset in datasets for batch in iter_batches(dataset, uri, columns=[name])
    ]
    return SplitTimes.of(pa.chunked_array(chunks, type=schema.field(name).type), name, uri)


def time_assignment(
    codes: np.ndarray, class_labels: list[str], times: SplitTimes, split: SplitConfig, uri: str
) -> tuple[np.ndarray, list[str]]:
    """Every labelled row's split by its time (`times` of the labelled rows), and a note of the cuts.
    In time order, the first (1 - val_fraction - test_fraction) of the rows train, the next
    val_fraction validate and the rest test; rows of equal time stay together, in the earlier split
    (so a cut among equal values moves the shares a little). Refused where a time is missing, a split
    would be empty, or the train split lacks a class."""
    name, n_rows = times.column, len(codes)
    if times.missing.any():
        raise DatasetError(
            f"{uri}: split_by column {name!r} is missing in {int(times.missing.sum()):,} labelled rows; "
            "a time-ordered split needs the time of every row: fill or drop those rows"
        )
    ordered = np.sort(times.values)
    train_end = round((1.0 - split.val_fraction - split.test_fraction) * n_rows)
    val_end = round((1.0 - split.test_fraction) * n_rows)
    cuts = ordered[max(train_end - 1, 0)], ordered[max(val_end - 1, 0)]
    assignment = np.searchsorted(np.array(cuts), times.values, side="left").astype(np.uint8)
    check_time_splits(codes, class_labels, assignment, times, uri)
    first, last = (times.describe(value) for value in (ordered[0], ordered[-1]))
    low, high = (times.describe(value) for value in cuts)
    note = (
        f"split by {name!r} (in time order, not at random): train {first}..{low}, "
        f"val after {low} up to {high}, test after {high} up to {last}"
    )
    return assignment, [note, *classes_held_out_of(codes, class_labels, assignment)]


def check_time_splits(
    codes: np.ndarray, class_labels: list[str], assignment: np.ndarray, times: SplitTimes, uri: str
) -> None:
    counts = np.bincount(assignment, minlength=len(SPLITS))
    for index, name in enumerate(SPLITS):
        if counts[index] == 0:
            distinct = len(np.unique(times.values))
            raise DatasetError(
                f"{uri}: split by {times.column!r} leaves the {name} split empty: the {len(codes):,} rows "
                f"hold {distinct:,} distinct values of it, and rows of equal value stay in one split; "
                f"split by a finer column, or change val_fraction and test_fraction"
            )
    missing = classes_not_in_train(codes, assignment, len(class_labels))
    if len(missing):
        raise DatasetError(
            f"{uri}: split by {times.column!r}, the train split (the earliest rows) has no row of class "
            f"{preview([repr(class_labels[i]) for i in missing])}; add earlier rows of that class, lower "
            "val_fraction and test_fraction, or leave split_by empty for a stratified split"
        )


def classes_held_out_of(codes: np.ndarray, class_labels: list[str], assignment: np.ndarray) -> list[str]:
    """Notes on the held-out splits that lack a class, as a split in time order may."""
    notes = []
    for index, name in enumerate(SPLITS[1:], start=1):
        absent = np.setdiff1d(np.arange(len(class_labels)), codes[assignment == index])
        if len(absent):
            classes = preview([repr(class_labels[i]) for i in absent])
            notes.append(f"the {name} split (split by time) has no row of class {classes}")
    return notes
