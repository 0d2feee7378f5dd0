"""The standardised splits store each categorical feature as one column of codes (split_codes.py); every
reader expands them into the features the model reads, bit for bit what `transform_scaled` gives of the
same rows: the one-pod and the pieces' splits, a rank's part and the Keras loop's whole split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from benchmarks.tables import Churn
from tasks.core.data import writing as writing_module
from tasks.core.data.assignment import SPLITS, SplitConfig
from tasks.core.data.column_kinds import CATEGORICAL
from tasks.core.data.labels import clean_labels, scan_labels
from tasks.core.data.prepare import PreparedSplits, RowSplit, prepare_dataset
from tasks.core.data.reading import open_dataset
from tasks.core.data.split_codes import CODES_KEY, code_type, split_coded, stored_columns
from tasks.core.data.splits import read_split
from tasks.core.data.writing import RAW_SPLIT
from tasks.core.training.rank_part import rank_part
from tests.conftest import blobs_frame
from tests.unit.data.tables import prepare_in_pieces

LABEL = "label"
PART_ROWS = (700, 1100, 1200)
SPLIT = SplitConfig(seed=4)
# A categorical column named as another column's missing indicator: its code column is renamed.
CLASHING = "tenure_months<missing>"
ROW_GROUP_ROWS = 97  # several row groups a split, so that ranks' parts straddle them


def write_mixed(folder: Path) -> str:
    """The churn table (text with gaps and a long tail, numbers with gaps, a boolean, a timestamp) in
    uneven parts, with a category named as a missing indicator."""
    folder.mkdir()
    churn, rng = Churn(seed=2), np.random.default_rng(2)
    for index, rows in enumerate(PART_ROWS):
        part = churn.chunk(rng, rows)
        part = part.append_column(CLASHING, pa.array(rng.choice(["low", "mid", "high"], rows)))
        pq.write_table(part, folder / f"part-{index:05d}.parquet")
    return str(folder)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> str:
    return write_mixed(tmp_path_factory.mktemp("mixed") / "parts")


def prepared_splits(data: str, out: Path, pieces: int) -> PreparedSplits:
    if pieces:
        return prepare_in_pieces(data, LABEL, str(out), SPLIT, pieces)
    return prepare_dataset(data, LABEL, str(out), SPLIT)


def expected_features(data: str, prepared: PreparedSplits, split: str) -> np.ndarray:
    """The split's rows of the input, encoded and standardised by `transform_scaled` (rows x features)."""
    dataset = open_dataset(data, LABEL)
    labels = clean_labels(scan_labels(dataset, data, LABEL), data, LABEL, False)
    rows = RowSplit.of(labels, data, LABEL, SPLIT)
    table = prepared.table
    raw = dataset.to_table(columns=table.columns).filter(pa.array(rows.assignment == SPLITS.index(split)))
    mean, scale = (np.asarray(values, np.float64) for values in (table.scaler.mean, table.scaler.scale))
    batch = raw.combine_chunks().to_batches()[0]
    return table.fitted_encoding().transform_scaled(batch, mean, scale).T


def assert_bit_for_bit(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("pieces", [0, 3], ids=["one pod", "3 pieces"])
def test_the_features_read_back_are_transform_scaled_bit_for_bit(mixed, tmp_path, pieces):
    prepared = prepared_splits(mixed, tmp_path / "out", pieces)
    splits = prepared.split_paths()
    for split, path in (("train", splits.train), ("val", splits.val)):
        want = expected_features(mixed, prepared, split)
        features, labels = read_split(path, splits.feature_names, splits.label_column)
        assert_bit_for_bit(features, want)
        assert len(labels) == prepared.table.rows[split]


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_ranks_part_reads_its_rows_expanded(mixed, tmp_path, monkeypatch, world_size):
    monkeypatch.setattr(writing_module, "SPLIT_ROW_GROUP_ROWS", ROW_GROUP_ROWS)
    prepared = prepared_splits(mixed, tmp_path / "out", 3)
    splits = prepared.split_paths()
    whole, labels = read_split(splits.train, splits.feature_names, splits.label_column)
    assert_bit_for_bit(whole, expected_features(mixed, prepared, "train"))
    rows = len(labels)
    seen = []
    for rank in range(world_size):
        part = rank_part(splits.train, rank, world_size)
        features, codes = part.read(part.blocks, splits.feature_names, LABEL)
        ids = part.row_ids()
        assert len(part.blocks) > 1
        assert len(ids) == -(-rows // world_size)  # padded to the longest part
        assert_bit_for_bit(features, whole[ids])
        np.testing.assert_array_equal(codes, labels[ids])
        seen.append(np.unique(ids))
    np.testing.assert_array_equal(np.concatenate(seen), np.arange(rows))  # contiguous, disjoint, whole


def test_a_split_stores_a_code_column_for_each_category(mixed, tmp_path):
    prepared = prepared_splits(mixed, tmp_path / "out", 0)
    table = prepared.table
    schema = pq.read_schema(prepared.paths["train"])
    categories = [c.name for c in table.fitted_encoding().columns if c.kind == CATEGORICAL]
    coded = split_coded(schema)
    assert sorted(categories) == ["contract", "plan", "region", CLASHING]
    assert list(coded) == ["plan", "contract", "region", f"{CLASHING}#code"]
    assert len(schema.names) < len(table.feature_names)
    assert schema.names == [*stored_columns(schema, table.feature_names), LABEL]
    for name, feature in coded.items():
        assert schema.field(name).type == code_type(len(feature.names)) == pa.int8()
        assert feature.off.dtype == feature.on.dtype == np.float32
    assert coded["region"].names[-2:] == ["region=<other>", "region=<missing>"]
    assert len(coded["region"].names) == 102  # the vocabulary cap, <other> and <missing>
    codes = pq.read_table(prepared.paths["val"], columns=["region"]).column("region")
    assert pc.max(codes).as_py() < 102 and pc.min(codes).as_py() >= 0
    raw = pq.read_schema(prepared.paths[RAW_SPLIT])
    assert CODES_KEY not in (raw.metadata or {}) and raw.names == [*table.columns, LABEL]


def test_a_table_of_numbers_stores_its_features_as_they_are(tmp_path):
    path = tmp_path / "blobs.parquet"
    blobs_frame(n_rows=200).to_parquet(path, index=False)
    prepared = prepare_dataset(str(path), "species", str(tmp_path / "out"), SPLIT)
    schema = pq.read_schema(prepared.paths["train"])
    assert not schema.metadata or CODES_KEY not in schema.metadata
    assert schema.names == [*prepared.table.feature_names, "species"]
    assert all(schema.field(name).type == pa.float32() for name in prepared.table.feature_names)


def test_code_types_grow_with_the_vocabulary():
    assert [code_type(width) for width in (2, 128, 129, 32_768, 32_769)] == [
        pa.int8(),
        pa.int8(),
        pa.int16(),
        pa.int16(),
        pa.int32(),
    ]
