"""Preprocessing in pieces gives what one pod gives: the same rows in each split, in the same order,
with the same labels, and features within float32 rounding, however many pieces did the work."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from tasks.core.data.assignment import SPLITS, SplitConfig
from tasks.core.data.files import DatasetError, detect_format
from tasks.core.data.moments import merged
from tasks.core.data.pieces import (
    assign_pieces,
    encoded,
    merged_encoding,
    piece_moments,
    piece_stats,
    plan_pieces,
    prepare_in_pieces,
)
from tasks.core.data.prepare import RAW_SPLIT, PreparedSplits, prepare_dataset
from tasks.core.data.scaling import batch_features
from tests.conftest import blobs_frame

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
    layout = encoded(
        layout, merged_encoding(layout, [piece_stats(layout, piece, assignment) for piece in pieces])
    )
    assert layout.table.feature_names == layout.table.columns  # numbers, none missing: as they are
    total = merged([piece_moments(layout, piece, assignment) for piece in pieces])
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


# --- a folder's format comes from its files -------------------------------------------------------


def test_a_folder_of_parts_is_read_whatever_its_name(tmp_path):
    for suffix in (".parquet", ".csv.gz"):
        folder = tmp_path / f"exported{suffix.replace('.', '-')}"
        uneven_parts(folder, suffix)
        (folder / "_SUCCESS").write_bytes(b"")
        (folder / ".part-00000.crc").write_bytes(b"checksum")
        prepared = prepare_dataset(str(folder), "species", str(tmp_path / folder.name / "out"), SplitConfig())
        assert sum(prepared.table.rows.values()) == sum(PART_ROWS)


def test_a_folder_mixing_formats_is_refused_naming_a_file_of_each(tmp_path):
    folder = tmp_path / "parts.parquet"
    uneven_parts(folder, ".parquet")
    blobs_frame(n_rows=20).to_csv(folder / "extra.csv", index=False)
    with pytest.raises(DatasetError) as error:
        prepare_dataset(str(folder), "species", str(tmp_path / "out"), SplitConfig())
    message = str(error.value)
    assert "mixes file formats" in message and "csv (" in message and "parquet (" in message
    assert "extra.csv" in message and "part-00004.parquet" in message


def test_a_folder_of_unnamed_parts_takes_the_folder_name_or_is_refused(tmp_path):
    for name, refused in (("parts.parquet", False), ("parts", True)):
        folder = tmp_path / name
        folder.mkdir()
        blobs_frame().to_parquet(folder / "part-00000", index=False)
        if refused:
            with pytest.raises(DatasetError, match="cannot tell the format of its part files"):
                detect_format(str(folder))
        else:
            assert detect_format(str(folder)) == "parquet"


# --- the map tasks, as a run launches them -------------------------------------------------------


def test_prepare_data_maps_the_pieces_of_an_input_past_the_threshold(tmp_path, monkeypatch):
    from tasks.core.planning import planner
    from tasks.core.training.config import TrainConfig
    from tasks.plumbing.storage import dataset_uri
    from tasks.right_sizing import prepare_data

    folder = tmp_path / "parts"
    uneven_parts(folder, ".parquet")
    monkeypatch.setattr(planner, "PIECE_ROWS", 60)
    prepared, plan = prepare_data(
        dataset=str(folder), label_column="species", val_fraction=0.15, test_fraction=0.15, target="gpu",
        hyperparameters=TrainConfig(seed=2), plan_resources=True,
    )  # fmt: skip
    assert plan.pieces > 1 and plan.piece_mem
    one_pod = prepare_dataset(str(folder), "species", str(tmp_path / "one"), SplitConfig(seed=2))
    folders = {name: dataset_uri(getattr(prepared, name)) for name in SPLITS}
    assert all(len(list(Path(path).glob("part-*.parquet"))) == plan.pieces for path in folders.values())
    assert_same_splits(PreparedSplits(folders, prepared.table), one_pod)


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
