from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from tasks.core.data import reading
from tasks.core.data.assignment import SPLITS, SplitConfig
from tasks.core.data.files import DatasetError
from tasks.core.data.labels import typed_labels
from tasks.core.data.prepare import (
    EMBEDDED_DIGITS_LABEL,
    RAW_SPLIT,
    PreparedSplits,
    prepare_dataset,
    write_embedded_digits,
)
from tasks.core.data.scaling import standardise
from tasks.core.data.splits import read_split
from tasks.core.training.rank_part import read_shard


def prepare(path: str, tmp_path, label: str = "species", **split) -> PreparedSplits:
    return prepare_dataset(path, label, str(tmp_path / "out"), SplitConfig(**split))


def split_frames(prepared: PreparedSplits) -> dict[str, pd.DataFrame]:
    return {name: pq.read_table(path).to_pandas() for name, path in prepared.paths.items()}


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


def row_ids(prepared: PreparedSplits, frame: pd.DataFrame, split: str) -> np.ndarray:
    """Column f0 back as the row id it was: standardised in the train and val splits, raw in the test split."""
    ids = frame["f0"].to_numpy()
    if split != RAW_SPLIT:
        ids = ids * prepared.table.scaler.scale[0] + prepared.table.scaler.mean[0]
    return np.rint(ids).astype(int)


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


def test_scaler_is_fitted_on_train_only(blobs, write_table, tmp_path):
    blobs.loc[:, "f1"] = blobs["f1"] * 10 + 100
    prepared = prepare(write_table(blobs), tmp_path)
    frames = split_frames(prepared)
    train = frames["train"][prepared.table.feature_names].to_numpy()
    np.testing.assert_allclose(train.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(train.std(axis=0), 1.0, atol=1e-4)
    whole_data_mean = blobs[prepared.table.feature_names].mean().to_numpy()
    assert not np.allclose(prepared.table.scaler.mean, whole_data_mean, rtol=0, atol=1e-6)


def test_streaming_in_small_batches_gives_the_same_result(blobs, write_table, tmp_path, monkeypatch):
    path = write_table(blobs)
    whole = split_frames(prepare(path, tmp_path / "whole"))
    monkeypatch.setattr(reading, "BATCH_ROWS", 17)
    batched = split_frames(prepare(path, tmp_path / "batched"))
    for name in SPLITS:
        pd.testing.assert_frame_equal(whole[name], batched[name])


def test_read_shard_splits_rows_between_ranks(blobs, write_table, tmp_path):
    prepared = prepare(write_table(blobs.iloc[:101]), tmp_path, val_fraction=0.2, test_fraction=0.2)
    n = prepared.table.rows["train"]
    shards = [
        read_shard(prepared.paths["train"], prepared.table.feature_names, "species", r, 2) for r in (0, 1)
    ]
    assert all(len(ids) == -(-n // 2) for _, _, ids in shards)
    assert set(shards[0][2]) | set(shards[1][2]) == set(range(n))
    assert not set(shards[0][2]) & set(shards[1][2])
    features, labels = read_split(prepared.paths["train"], prepared.table.feature_names, "species")
    np.testing.assert_array_equal(shards[1][0], features[shards[1][2]])
    np.testing.assert_array_equal(shards[0][1], labels[shards[0][2]])


def test_embedded_digits(tmp_path):
    path = write_embedded_digits(str(tmp_path))
    table = pq.read_table(path)
    assert table.num_rows == 1797 and table.num_columns == 65
    assert EMBEDDED_DIGITS_LABEL in table.column_names


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


def test_a_value_past_the_first_batch_not_of_its_column_kind_is_refused_by_row(blobs, tmp_path, monkeypatch):
    """The first batch makes text of ISO dates a date column: a later value that is none is refused."""
    monkeypatch.setattr(reading, "BATCH_ROWS", 50)
    days = [f"2024-01-{day % 28 + 1:02d}" for day in range(len(blobs))]
    days[120] = "soon"
    path = tmp_path / "data.parquet"
    blobs.assign(day=days).to_parquet(path, index=False)
    with pytest.raises(DatasetError) as error:
        prepare(str(path), tmp_path)
    message = str(error.value)
    assert message.startswith(f"{path}: feature column 'day' is read as date but holds 'soon' at row 120")


@pytest.mark.parametrize("name", ["data.parquet", "data.csv"])
def test_rows_without_a_label_are_left_out_with_a_note(blobs, write_table, tmp_path, name):
    unlabelled = [3, 40, 41]
    blobs = blobs.assign(f0=np.arange(len(blobs), dtype=float))  # a row id that survives scaling
    blobs.loc[unlabelled, "species"] = None
    prepared = prepare(write_table(blobs, name), tmp_path)
    assert sum(prepared.table.rows.values()) == len(blobs) - 3
    assert sum(prepared.table.class_counts.values()) == len(blobs) - 3
    assert prepared.table.notes == [
        "label column 'species' has 3 missing values (empty, null or NaN) at rows 3, 40, 41; "
        "those rows are left out of every split"
    ]
    written = np.concatenate([row_ids(prepared, f, split) for split, f in split_frames(prepared).items()])
    assert sorted(written) == sorted(set(range(len(blobs))) - set(unlabelled))


@pytest.mark.parametrize("name", ["empty.csv", "empty.parquet"])
def test_empty_file(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"")
    with pytest.raises(DatasetError, match="empty"):
        prepare(str(path), tmp_path)


def test_header_only_csv(tmp_path):
    path = tmp_path / "header.csv"
    path.write_text("f0,f1,species\n")
    with pytest.raises(DatasetError, match="no rows"):
        prepare(str(path), tmp_path)


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        prepare(str(tmp_path / "nope.parquet"), tmp_path)
    with pytest.raises(DatasetError, match="file format"):
        prepare(str(tmp_path / "data.xlsx"), tmp_path)


def test_bad_input_is_left_untouched(blobs, write_table, tmp_path):
    path = write_table(with_inf(blobs.copy()))
    before = Path(path).read_bytes()
    with pytest.raises(DatasetError):
        prepare(path, tmp_path)
    assert Path(path).read_bytes() == before


def test_split_fractions_are_validated():
    with pytest.raises(DatasetError, match="test_fraction"):
        SplitConfig(test_fraction=0.0)


def test_compressed_csv_and_parquet_directory(blobs, tmp_path):
    compressed = tmp_path / "data.csv.gz"
    blobs.to_csv(compressed, index=False)
    directory = tmp_path / "parts.parquet"
    directory.mkdir()
    blobs.iloc[:150].to_parquet(directory / "a.parquet", index=False)
    blobs.iloc[150:].to_parquet(directory / "b.parquet", index=False)
    for path in (compressed, directory):
        prepared = prepare(str(path), tmp_path / "out" / path.name)
        assert sum(prepared.table.rows.values()) == len(blobs)


# --- label kinds: the class labels are text, and the kind turns them back into the column's values ----


LABELS = {
    "integers": ([3, 10, 7], "data.parquet", "integer", ["3", "7", "10"]),
    "integers as csv text": ([3, 10, 7], "data.csv", "integer", ["3", "7", "10"]),
    "floats": ([0.5, 1.25, 1e20], "data.parquet", "float", ["0.5", "1.25", "1e+20"]),
    "booleans": ([True, False, True], "data.parquet", "boolean", ["False", "True"]),
    "strings": (["b", "a", "c"], "data.csv", "string", ["a", "b", "c"]),
}


@pytest.mark.parametrize("case", sorted(LABELS))
def test_label_kind_turns_the_class_labels_back_into_the_column_values(blobs, write_table, tmp_path, case):
    values, name, kind, class_labels = LABELS[case]
    frame = blobs.assign(species=[values[i % len(values)] for i in range(len(blobs))])
    prepared = prepare(write_table(frame, name), tmp_path, problem_type="classification")
    assert (prepared.table.label_kind, prepared.table.class_labels) == (kind, class_labels)
    typed = typed_labels(prepared.table.class_labels, prepared.table.label_kind)
    assert sorted(typed) == sorted(set(values))
    assert all(type(label) is type(values[0]) for label in typed)


def test_unknown_label_kind_is_refused():
    with pytest.raises(ValueError, match="'decimal'"):
        typed_labels(["1"], "decimal")
