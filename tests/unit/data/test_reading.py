"""reading.py: any input read in record batches, with errors that name the file, line and column. CSV
types that change late, delimiters other than a comma, 'NA' (missing in a feature, a class in a label),
long lines, empty files and part files, part files that disagree; a CSV and a parquet file of the same
rows prepare alike. Each input file is left as it was."""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from tasks.core.data import reading
from tasks.core.data.assignment import SplitConfig
from tasks.core.data.files import DatasetError
from tasks.core.data.prepare import prepare_dataset
from tasks.core.data.reading import iter_batches, open_dataset, sniff_delimiter
from tasks.core.data.splits import batch_features
from tests.conftest import blobs_frame
from tests.unit.data.tables import (
    FEATURES,
    messy_frame,
    prepare,
    prepare_in_pieces,
    prepare_messy,
    prepare_unchanged,
    prepare_y,
    refusal,
    refusal_y,
    snapshot,
    with_labels,
    write_frame,
)

# --- CSV parsing ----------------------------------------------------------------------------------


def late_column_csv(path: Path, last_value: str, n_rows: int = 200_000) -> str:
    """Integers in f1 for `n_rows` rows (far past pyarrow's first block), then `last_value`."""
    f1 = [str(i % 7) for i in range(n_rows)] + [last_value]
    table = pa.table({"f0": np.arange(n_rows + 1), "f1": f1, "y": np.arange(n_rows + 1) % 2})
    pa_csv.write_csv(table, path, pa_csv.WriteOptions(quoting_style="none"))
    return str(path)


def test_a_late_float_in_an_integer_csv_column_is_read(tmp_path):
    path = late_column_csv(tmp_path / "late.csv", "0.5")
    before = Path(path).read_bytes()
    dataset = open_dataset(path, "y")
    f1 = pa.concat_arrays([batch.column("f1") for batch in iter_batches(dataset, path)])
    assert f1.type == pa.float64()
    assert len(f1) == 200_001 and f1[-1].as_py() == 0.5 and f1[8].as_py() == 1.0
    assert Path(path).read_bytes() == before


def test_a_column_of_a_declared_kind_is_read_as_floats_too(tmp_path):
    path = late_column_csv(tmp_path / "late.csv", "0.5", n_rows=100_000)
    for kind in ("numeric", "drop"):
        assert open_dataset(path, "y", column_kinds={"f1": kind}).schema.field("f1").type == pa.float64()


def test_a_late_non_number_names_the_column_and_line(tmp_path):
    path = late_column_csv(tmp_path / "late.csv", "abc")
    message = refusal_y(path, tmp_path)
    assert message.startswith(f"{path}: column 'f1' holds 'abc' at line 200,002, not a number")


@pytest.mark.parametrize("delimiter", [";", "\t", "|"])
def test_csv_delimiter_is_sniffed_from_the_header(tmp_path, delimiter):
    frame = with_labels(["a", "b"])
    path = write_frame(frame, tmp_path / "data.csv", sep=delimiter)
    before = Path(path).read_bytes()
    prepared = prepare_y(path, tmp_path)
    assert prepared.table.feature_names == ["f0", "f1"]
    assert sum(prepared.table.rows.values()) == len(frame)
    assert Path(path).read_bytes() == before


def test_sniff_delimiter():
    assert sniff_delimiter("f0,f1,species") == ","
    assert sniff_delimiter("f0;f1;species") == ";"
    assert sniff_delimiter('"a,b";"c";"d"') == ";"
    assert sniff_delimiter("species") == ","


def test_na_null_and_n_a_are_ordinary_classes_in_csv(tmp_path):
    path = write_frame(with_labels(["NA", "NULL", "n/a", "N/A", "none"], n_rows=100), tmp_path / "data.csv")
    prepared = prepare_y(path, tmp_path)
    assert prepared.table.class_labels == ["N/A", "NA", "NULL", "n/a", "none"]
    assert set(prepared.table.class_counts.values()) == {20}


def test_na_in_a_csv_feature_is_a_missing_value_imputed_and_flagged(tmp_path):
    path = tmp_path / "data.csv"
    write_frame(with_labels(["a", "b"]), path)
    lines = path.read_text().splitlines()
    lines[4] = "NA," + lines[4].split(",", 1)[1]  # row 3's f0
    path.write_text("\n".join(lines) + "\n")
    prepared = prepare_y(str(path), tmp_path)
    assert prepared.table.feature_names == ["f0", "f0<missing>", "f1"]
    encoding = prepared.table.fitted_encoding()
    assert encoding.transform(pa.table({"f0": [None, 2.0], "f1": [0.0, 0.0]}))[:, 1].tolist() == [1.0, 0.0]


def test_a_messy_single_file_prepares_alike_as_csv_and_parquet(tmp_path):
    """The same rows, from a CSV file or a parquet file, give the same encoded splits."""
    prepared = {}
    for suffix in (".parquet", ".csv"):
        frame, path = messy_frame(csv=suffix == ".csv"), tmp_path / f"data{suffix}"
        frame.to_csv(path, index=False) if suffix == ".csv" else frame.to_parquet(path, index=False)
        prepared[suffix] = prepare_messy(str(path), tmp_path / suffix, 0)
    parquet, csv = prepared[".parquet"], prepared[".csv"]
    assert parquet.table.feature_names == csv.table.feature_names and parquet.table.notes == csv.table.notes
    for name in ("train", "val"):
        a, b = (
            batch_features(ds.dataset(p.paths[name]).to_table(), p.table.feature_names)
            for p in (parquet, csv)
        )
        np.testing.assert_allclose(a, b, atol=1e-6)


# --- one stray value: the same outcome wherever it sits ---------------------------------------------

STRAYS = {
    "number": ([f"{i * 0.37:.2f}" for i in range(400)], "?", "not a number"),
    "date": (
        [str(datetime.date(2020, 1, 1) + datetime.timedelta(days=i)) for i in range(400)],
        "31/12/2021",
        "not an ISO date",
    ),
}


def with_a_stray(path: Path, kind: str, row: int, n_rows: int) -> str:
    """Column f1 of `kind`'s values (repeating), but for the stray value at `row`, labelled 'y'."""
    values, stray, _ = STRAYS[kind]
    f1 = [values[i % len(values)] for i in range(n_rows)]
    f1[row] = stray
    table = pa.table({"f0": np.arange(n_rows) % 5, "f1": f1, "y": np.arange(n_rows) % 2})
    pa_csv.write_csv(table, path, pa_csv.WriteOptions(quoting_style="none"))
    return str(path)


@pytest.mark.parametrize("kind", sorted(STRAYS))
@pytest.mark.parametrize("row", [15, 199_990], ids=["in the first block", "far past it"])
def test_a_stray_value_is_refused_naming_its_line_wherever_it_sits(tmp_path, kind, row):
    """Early, the stray made the column text (a category of hundreds of values, or an identifier left out),
    silently; late, it was refused: now both are refused alike, with the way out."""
    path = with_a_stray(tmp_path / "stray.csv", kind, row, 200_000)
    message = refusal_y(path, tmp_path)
    stray, words = STRAYS[kind][1], STRAYS[kind][2]
    assert message.startswith(f"{path}: column 'f1' holds {stray!r} at line {row + 2:,}, {words}"), message
    assert "column_kinds" in message


@pytest.mark.parametrize("kind", sorted(STRAYS))
def test_a_column_with_a_stray_declared_categorical_is_read_as_text(tmp_path, kind):
    path = with_a_stray(tmp_path / "stray.csv", kind, 15, 800)
    split = SplitConfig()
    prepared = prepare_dataset(path, "y", str(tmp_path / "out"), split, {"f1": "categorical"})
    assert f"f1={STRAYS[kind][1]}" not in prepared.table.feature_names  # rare: <other>
    assert "f1=<other>" in prepared.table.feature_names


def test_a_column_of_text_some_numbers_stays_text(tmp_path):
    sizes = ["1", "2", "3+", "none", "many"]
    frame = with_labels(["a", "b"], n_rows=100).assign(size=[sizes[i % 5] for i in range(100)])
    prepared = prepare_y(write_frame(frame, tmp_path / "data.csv"), tmp_path)
    assert {f"size={size}" for size in sizes} <= set(prepared.table.feature_names)


# --- a category declared so keeps its text ---------------------------------------------------------


@pytest.mark.parametrize("pieces", [0, 3], ids=["one pod", "3 pieces"])
def test_zip_codes_declared_categorical_keep_their_leading_zeros(tmp_path, pieces):
    zips = ["00123", "01234", "10115", "00007"]
    frame = with_labels(["a", "b"], n_rows=120).assign(zip=[zips[i % 4] for i in range(120)])
    path = write_frame(frame, tmp_path / "data.csv")
    kinds = {"zip": "categorical"}
    if pieces:
        prepared = prepare_in_pieces(
            path, "y", str(tmp_path / "out"), SplitConfig(), pieces, column_kinds=kinds
        )
    else:
        prepared = prepare_dataset(path, "y", str(tmp_path / "out"), SplitConfig(), kinds)
    assert {f"zip={code}" for code in zips} <= set(prepared.table.feature_names)
    test_zips = pq.read_table(prepared.paths["test"], columns=["zip"]).column("zip").to_pylist()
    assert set(test_zips) <= set(zips)


def test_a_declared_category_is_read_as_text_when_scoring_a_csv(tmp_path):
    path = write_frame(pd.DataFrame({"zip": ["00123", "01234"], "n": [1, 2]}), tmp_path / "score.csv")
    dataset = open_dataset(path, typed_columns={"zip", "n"}, column_kinds={"zip": "categorical"})
    table = dataset.to_table()
    assert table.column("zip").to_pylist() == ["00123", "01234"] and table.column("n").type == pa.float64()


# --- numbers written with a decimal comma ----------------------------------------------------------


def comma(value: float) -> str:
    return f"{value:.3f}".replace(".", ",")


def test_numbers_written_with_a_decimal_comma_are_read_as_numbers(tmp_path):
    """Read as text, each value distinct, the column was left out as an identifier."""
    frame = with_labels(["a", "b"], n_rows=200)
    frame[["f0", "f1"]] = frame[["f0", "f1"]].map(comma)
    path = write_frame(frame.assign(n=np.arange(200) % 7), tmp_path / "data.csv", sep=";")
    dataset = open_dataset(path, "y")
    assert [dataset.schema.field(name).type for name in ("f0", "f1", "n")] == [pa.float64()] * 3
    f0 = dataset.to_table().column("f0").to_pylist()
    assert f0 == [float(value.replace(",", ".")) for value in frame["f0"]]
    prepared = prepare_y(path, tmp_path)
    assert prepared.table.feature_names == ["f0", "f1", "n"] and not prepared.table.notes
    # A scoring piece reads a part with the input's schema alone: the decimal comma travels with it.
    again = ds.dataset(
        path,
        schema=dataset.schema,
        format=reading.csv_format_of(dataset.format.parse_options, dataset.schema),
    )
    assert again.to_table().column("f0").to_pylist() == f0


def test_a_file_writing_numbers_both_ways_is_refused_naming_both_columns(tmp_path):
    frame = with_labels(["a", "b"], n_rows=200)
    frame["f0"] = frame["f0"].map(comma)
    path = write_frame(frame, tmp_path / "data.csv", sep=";")
    message = refusal_y(path, tmp_path)
    assert message.startswith(
        f"{path}: column 'f0' holds {frame['f0'][0]!r} at line 2, a number written with a decimal comma"
    ), message
    assert "column 'f1' writes numbers with a decimal point" in message


# --- long lines -----------------------------------------------------------------------------------


def with_a_long_label(frame: pd.DataFrame, length: int) -> pd.DataFrame:
    """Three rows of a class whose label is `length` characters: valid data, very long lines."""
    return pd.concat([frame, frame.iloc[:3].assign(species="x" * length)], ignore_index=True)


def test_a_2_mib_line_is_read(tmp_path):
    path = tmp_path / "data.csv"
    with_a_long_label(blobs_frame(), 2 << 20).to_csv(path, index=False)
    prepared = prepare_unchanged(path, tmp_path)
    assert len(prepared.table.class_labels) == 4 and sum(prepared.table.rows.values()) == 303


@pytest.mark.parametrize("first_row", [False, True], ids=["later line", "first line"])
def test_a_line_longer_than_the_block_is_named_with_its_length(tmp_path, monkeypatch, first_row):
    monkeypatch.setattr(reading, "CSV_BLOCK_BYTES", 1 << 12)
    monkeypatch.setattr(reading, "GUESS_BLOCK_BYTES", 1 << 12)
    frame = with_a_long_label(blobs_frame(), 10_000)
    if first_row:
        frame = frame.iloc[::-1]
    path = tmp_path / "data.csv"
    frame.to_csv(path, index=False)
    line = 2 if first_row else 302
    message = refusal(path, tmp_path)
    assert message.startswith(f"{path}: a line is longer than the 4,096 bytes")
    assert f"line {line} has 10,0" in message and "parquet" in message


# --- empty files and part files ----------------------------------------------------------------


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


def no_columns(path: Path) -> None:
    pq.write_table(pa.table({}), path)


EMPTY_PARTS = {
    "no rows": lambda path: blobs_frame().iloc[:0].to_parquet(path, index=False),
    "no rows and no columns": no_columns,
    "0 bytes": lambda path: path.write_bytes(b""),
}


@pytest.mark.parametrize("case", sorted(EMPTY_PARTS))
def test_empty_part_files_are_skipped(tmp_path, case):
    parts = tmp_path / "parts.parquet"
    parts.mkdir()
    EMPTY_PARTS[case](parts / "part-00000.parquet")
    blobs_frame().to_parquet(parts / "part-00001.parquet", index=False)
    EMPTY_PARTS[case](parts / "part-00002.parquet")
    (parts / "_SUCCESS").write_bytes(b"")  # Spark's marker and an unfinished attempt: not data
    (parts / "_temporary" / "0").mkdir(parents=True)
    (parts / "_temporary" / "0" / "part-00003.parquet").write_bytes(b"half written")
    prepared = prepare_unchanged(parts, tmp_path)
    assert sum(prepared.table.rows.values()) == 300 and prepared.table.feature_names == FEATURES


def test_a_folder_of_empty_parts_has_no_rows(tmp_path):
    parts = tmp_path / "parts.parquet"
    parts.mkdir()
    for index, write in enumerate(EMPTY_PARTS.values()):
        write(parts / f"part-{index:05d}.parquet")
    assert "no rows" in refusal(parts, tmp_path)


# --- part files that disagree ---------------------------------------------------------------------


def test_part_files_whose_numeric_types_differ_are_read_as_floats(tmp_path):
    parts = tmp_path / "parts.parquet"
    parts.mkdir()
    frame = pd.DataFrame({"f0": np.arange(30), "y": np.arange(30) % 2})
    write_frame(frame, parts / "a.parquet")
    write_frame(frame.assign(f0=frame["f0"] + 0.5), parts / "b.parquet")
    prepared = prepare_y(str(parts), tmp_path)
    assert sum(prepared.table.rows.values()) == 60
    mean = prepared.table.scaler.mean[0]
    assert mean != pytest.approx(round(mean))  # the .5s were kept


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_part_files_that_disagree_name_the_file_and_column(tmp_path, suffix):
    parts = tmp_path / f"parts{suffix}"
    parts.mkdir()
    frame = with_labels(["a", "b"])
    write_frame(frame, parts / f"a{suffix}")
    bad = write_frame(frame.assign(f1=[f"x{i}" for i in range(len(frame))]), parts / f"b{suffix}")
    before = Path(bad).read_bytes()
    message = refusal_y(str(parts), tmp_path)
    assert message.startswith(f"{parts}: part file {bad}") and "column 'f1'" in message
    assert Path(bad).read_bytes() == before


def test_part_files_with_other_columns_name_them(tmp_path):
    parts = tmp_path / "parts.parquet"
    parts.mkdir()
    frame = with_labels(["a", "b"])
    write_frame(frame, parts / "a.parquet")
    write_frame(frame.rename(columns={"f1": "g1"}), parts / "b.parquet")
    message = refusal_y(str(parts), tmp_path)
    assert "b.parquet has other columns than part file" in message and "lacks 'f1' and adds 'g1'" in message


# --- text read as dictionaries --------------------------------------------------------------------


def text_table(n_rows: int = 100) -> pa.Table:
    """Two text columns with nulls and blanks, a large text column, a number and the label."""
    return pa.table(
        {
            "town": [None if i % 7 == 0 else ("" if i % 5 == 0 else f"t{i % 3}") for i in range(n_rows)],
            "note": [f"n{i}" for i in range(n_rows)],
            "shade": pa.array([f"s{i % 4}" for i in range(n_rows)], pa.large_string()),
            "f0": np.arange(n_rows, dtype=float),
            "y": [("a", "b")[i % 2] for i in range(n_rows)],
        }
    )


def write_text_parquet(path: Path, parts: bool) -> pa.Table:
    """One file of several row groups, or a folder of parts, one of which holds no text but nulls; the
    rows written."""
    table = text_table()
    if not parts:
        pq.write_table(table, path, row_group_size=30)
        return table
    path.mkdir()
    nulls = table.slice(60, 10).set_column(0, "town", pa.nulls(10))  # a part whose 'town' has no type
    pq.write_table(table.slice(0, 60), path / "part-00000.parquet", row_group_size=25)
    pq.write_table(nulls, path / "part-00001.parquet")
    pq.write_table(table.slice(70), path / "part-00002.parquet")
    return pa.concat_tables([table.slice(0, 60), nulls.cast(table.schema), table.slice(70)])


@pytest.mark.parametrize("parts", [False, True], ids=["one file", "parts"])
def test_parquet_text_named_as_dictionary_is_read_as_dictionary_arrays_of_the_same_values(
    tmp_path, monkeypatch, parts
):
    monkeypatch.setattr(reading, "BATCH_ROWS", 16)
    path = tmp_path / "data.parquet"
    written = write_text_parquet(path, parts)
    before = snapshot(path)
    dataset = open_dataset(str(path), "y")
    plain = list(iter_batches(dataset, str(path)))
    as_dictionary = list(iter_batches(dataset, str(path), as_dictionary=["town", "shade", "f0"]))
    assert len(plain) == len(as_dictionary) > 4
    for plain_batch, batch in zip(plain, as_dictionary, strict=True):
        assert batch.schema.names == plain_batch.schema.names
        for name in batch.schema.names:
            column, expected = batch.column(name), plain_batch.column(name)
            if name in ("town", "shade"):  # text named: a dictionary of that text
                assert column.type == pa.dictionary(pa.int32(), expected.type), name
                assert column.cast(expected.type).equals(expected), name
            else:  # not named, or not text: as read plainly
                assert column.equals(expected), name
    assert pa.Table.from_batches(plain).equals(written)  # every row, as written
    assert snapshot(path) == before


def test_csv_text_named_as_dictionary_is_read_as_plain_text(tmp_path, monkeypatch):
    monkeypatch.setattr(reading, "BATCH_ROWS", 16)
    path = tmp_path / "data.csv"
    pa_csv.write_csv(text_table(), path)
    dataset = open_dataset(str(path), "y")
    plain = list(iter_batches(dataset, str(path)))
    as_dictionary = list(iter_batches(dataset, str(path), as_dictionary=["town", "note", "shade"]))
    assert len(plain) == len(as_dictionary) and plain[0].schema.field("town").type == pa.string()
    for plain_batch, batch in zip(plain, as_dictionary, strict=True):
        assert batch.equals(plain_batch)
        assert not any(pa.types.is_dictionary(field.type) for field in batch.schema)
