"""Batch scoring reads the model's columns by training's rules and passes the others through as read: a
CSV's ids and codes as the text it holds, a parquet column's integers as integers of the widest width its
parts hold. A pass-through column that changes type deep in a file does not stop scoring; a feature that
does is refused with advice about scoring. The input files are never changed."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.core.data.files import DatasetError
from tasks.core.scoring.run import score_dataset
from tests.conftest import blobs_frame
from tests.unit.publish.test_publish import write_test_bundle


@pytest.fixture(scope="module")
def bundle_folder(tmp_path_factory) -> str:
    return write_test_bundle(tmp_path_factory.mktemp("passthrough") / "bundle", seed=3)


def blobs(rows: int, seed: int = 5) -> pd.DataFrame:
    return blobs_frame(n_rows=rows, n_classes=3, seed=seed)


def file_bytes(path: Path) -> dict[str, bytes]:
    """Every file of an input, by its path: compared before and after scoring."""
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    return {str(file): file.read_bytes() for file in files if file.is_file()}


def scored(bundle: str, dataset: Path, output: Path) -> pa.Table:
    """The predictions of `dataset`, checking that scoring left the input as it was."""
    before = file_bytes(dataset)
    score_dataset(bundle, str(dataset), str(output))
    assert file_bytes(dataset) == before
    return pq.read_table(output)


# ---- CSV: columns the model does not read come back as the text they hold ------------------------------

CSV_PASSTHROUGH = {
    "17-digit ids": ["12345678901234567", "12345678901234568", "12345678901234569"],
    "zip codes with leading zeros": ["00123", "01234", "12345"],
    "decimals as written": ["1.10", "2.50", "1e3"],
    "an empty cell": ["7", "", "9"],
}


@pytest.mark.parametrize("case", list(CSV_PASSTHROUGH))
def test_a_csv_column_the_model_does_not_read_comes_back_as_the_text_it_holds(case, bundle_folder, tmp_path):
    values = CSV_PASSTHROUGH[case] * 4
    frame = blobs(len(values)).assign(code=values)
    source = tmp_path / "users.csv"
    frame.to_csv(source, index=False)
    predictions = scored(bundle_folder, source, tmp_path / "predictions")
    assert predictions.schema.field("code").type == pa.string()
    assert predictions.column("code").to_pylist() == values


def test_a_csv_column_that_turns_to_text_at_line_50_002_is_passed_through(bundle_folder, tmp_path):
    """A coupon code: numbers for 50,000 rows, then a word. The model never reads it."""
    frame = blobs(50_001).assign(coupon=[str(row % 97) for row in range(50_001)])
    frame.loc[50_000, "coupon"] = "SAVE10"  # line 50,002 of the file: the header is line 1
    source = tmp_path / "users.csv"
    frame.to_csv(source, index=False)
    coupons = scored(bundle_folder, source, tmp_path / "predictions").column("coupon").to_pylist()
    assert coupons == frame["coupon"].tolist()


def test_a_feature_that_turns_to_text_deep_in_a_csv_is_refused_with_advice_about_scoring(
    bundle_folder, tmp_path
):
    frame = blobs(50_001).astype({"f1": object})
    frame.loc[50_000, "f1"] = "twelve"
    source = tmp_path / "users.csv"
    frame.to_csv(source, index=False)
    before = file_bytes(source)
    with pytest.raises(DatasetError) as refused:
        score_dataset(bundle_folder, str(source), str(tmp_path / "predictions"))
    message = str(refused.value)
    assert "column 'f1' holds 'twelve' at line 50,002, not a number" in message
    assert "scoring" in message and "training" not in message
    assert file_bytes(source) == before
    assert not (tmp_path / "predictions").exists()


# ---- parquet: integer widths widened across parts, never cast to float ----------------------------------

BIG = 12345678901234567  # above 2**53: float64 cannot hold it
PARQUET_PASSTHROUGH = {
    "int32 and int64": ([pa.array([1, 2, 3], pa.int32()), pa.array([BIG, BIG + 1, BIG + 2])], pa.int64()),
    "uint16 and int32": ([pa.array([1, 65535, 3], pa.uint16()), pa.array([-1, 0, 2**31 - 1], pa.int32())],
                         pa.int32()),
    "17-digit int64 in every part": ([pa.array([BIG, BIG + 1, BIG + 2]), pa.array([BIG + 3, BIG + 4, BIG + 5])],
                                     pa.int64()),
    "a part of nulls": ([pa.nulls(3), pa.array([BIG, None, BIG + 2])], pa.int64()),
}  # fmt: skip


def write_id_parts(folder: Path, ids: list[pa.Array]) -> Path:
    """One part file per array of ids, beside blobs features and labels."""
    folder.mkdir(parents=True)
    for index, values in enumerate(ids):
        features = pa.Table.from_pandas(blobs(len(values), seed=index), preserve_index=False)
        pq.write_table(features.append_column("customer_id", values), folder / f"part-{index}.parquet")
    return folder


@pytest.mark.parametrize("case", list(PARQUET_PASSTHROUGH))
def test_parquet_parts_whose_id_widths_differ_come_back_as_integers_of_the_widest(
    case, bundle_folder, tmp_path
):
    ids, expected = PARQUET_PASSTHROUGH[case]
    dataset = write_id_parts(tmp_path / "users.parquet", ids)
    predictions = scored(bundle_folder, dataset, tmp_path / "predictions")
    assert predictions.schema.field("customer_id").type == expected
    assert predictions.column("customer_id").to_pylist() == [v for part in ids for v in part.to_pylist()]


PARQUET_REFUSALS = {
    "integers and text": [pa.array([1, 2, 3]), pa.array(["a", "b", "c"])],
    "integers and booleans": [pa.array([1, 2, 3]), pa.array([True, False, True])],
}


@pytest.mark.parametrize("case", list(PARQUET_REFUSALS))
def test_parquet_parts_whose_id_types_cannot_be_one_column_are_refused_naming_the_part_and_column(
    case, bundle_folder, tmp_path
):
    dataset = write_id_parts(tmp_path / "users.parquet", PARQUET_REFUSALS[case])
    before = file_bytes(dataset)
    with pytest.raises(DatasetError) as refused:
        score_dataset(bundle_folder, str(dataset), str(tmp_path / "predictions"))
    for word in ["part-1.parquet", "column 'customer_id'", "part-0.parquet"]:
        assert word in str(refused.value)
    assert file_bytes(dataset) == before
    assert not (tmp_path / "predictions").exists()


# ---- CSV: the model's columns read by the bundle's kinds, whatever the first rows hold -------------------


def test_a_csv_is_scored_by_the_bundle_s_kinds_whatever_its_first_block_holds(
    raw_row_bundles, tmp_path, monkeypatch
):
    """pyarrow types a CSV column from the file's first block, which scoring sees only a few rows of
    here. The bundle knows each model column's kind: a date under an empty first block, a 'yes' and an
    'NA' under 'true' and 'false', a zoned time under naive ones are read as the bundle reads them, where
    the guess refused them as 'not a number' or a zone 'not expected'."""
    import numpy as np

    from tasks.core.bundle.loading import load_bundle
    from tasks.core.data import reading
    from tests.floats import assert_scored_alike

    monkeypatch.setattr(reading, "GUESS_BLOCK_BYTES", 256)
    rows = 60
    frame = pd.DataFrame({
        "amount": np.linspace(-1e6, 9e6, rows),
        "home city": ["oslo", "rome"] * (rows // 2),
        "member": ["true", "false"] * (rows // 2 - 1) + ["yes", "NA"],
        "joined": [""] * (rows - 2) + ["2001-02-03", "1969-12-31"],
        "last_seen": ["2023-01-01T08:00:00"] * (rows - 2) + ["2023-01-01T10:00:00+02:00", ""],
    })  # fmt: skip
    source = tmp_path / "users.csv"
    frame.to_csv(source, index=False)
    assert source.stat().st_size > 4 * reading.GUESS_BLOCK_BYTES
    predictions = scored(raw_row_bundles["pytorch"], source, tmp_path / "predictions").to_pandas()
    columns = [name for name in predictions.columns if name.startswith("probability_")]
    expected = load_bundle(raw_row_bundles["pytorch"]).predict_proba(frame)
    assert_scored_alike(predictions[columns].to_numpy(), expected)
