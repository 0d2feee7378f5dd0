"""What users really bring: labels with NaN, stray whitespace or 'NA' classes, CSVs whose types
change late or whose delimiter is not a comma, part files that disagree, unreachable URIs."""

from __future__ import annotations

from pathlib import Path

import fsspec.implementations.memory
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv
import pytest

from tasks.core.data.assignment import SplitConfig
from tasks.core.data.files import DatasetError
from tasks.core.data.fingerprint import dataset_fingerprint, describe_input
from tasks.core.data.labels import CASE_WARNINGS, label_case_warnings
from tasks.core.data.prepare import PreparedSplits, prepare_dataset
from tasks.core.data.reading import iter_batches, open_dataset, sniff_delimiter
from tasks.core.messages import one_line, preview


def features(n_rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"f0": rng.normal(size=n_rows), "f1": rng.normal(size=n_rows)})


def with_labels(labels: list, n_rows: int = 60) -> pd.DataFrame:
    """`n_rows` rows whose label cycles through `labels`."""
    return features(n_rows).assign(y=[labels[i % len(labels)] for i in range(n_rows)])


def write(frame: pd.DataFrame, path: Path, **csv_options) -> str:
    if path.suffix == ".csv":
        frame.to_csv(path, index=False, **csv_options)
    else:
        frame.to_parquet(path, index=False)
    return str(path)


def prepare(path: str, tmp_path: Path, problem_type: str = "auto") -> PreparedSplits:
    return prepare_dataset(path, "y", str(tmp_path / "out"), SplitConfig(problem_type=problem_type))


def refusal(path: str, tmp_path: Path, problem_type: str = "auto") -> str:
    with pytest.raises(DatasetError) as error:
        prepare(path, tmp_path, problem_type)
    return str(error.value)


def late_column_csv(path: Path, last_value: str, n_rows: int = 200_000) -> str:
    """Integers in f1 for `n_rows` rows (far past pyarrow's first block), then `last_value`."""
    f1 = [str(i % 7) for i in range(n_rows)] + [last_value]
    table = pa.table({"f0": np.arange(n_rows + 1), "f1": f1, "y": np.arange(n_rows + 1) % 2})
    pa_csv.write_csv(table, path, pa_csv.WriteOptions(quoting_style="none"))
    return str(path)


# --- labels -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["data.parquet", "data.csv"])
def test_nan_float_labels_leave_their_rows_out_naming_them(tmp_path, name):
    frame = with_labels([0.0, 1.0])
    frame.loc[[4, 9], "y"] = np.nan
    prepared = prepare(write(frame, tmp_path / name), tmp_path)
    (note,) = prepared.table.notes
    assert "label column 'y'" in note and "2 missing values" in note and "rows 4, 9" in note
    assert sum(prepared.table.rows.values()) == 58
    assert prepared.table.class_labels == ["0.0", "1.0"] and prepared.table.label_kind == "float"


def test_many_missing_labels_give_a_bounded_note(tmp_path):
    frame = with_labels([0.0, 1.0], n_rows=5_000)
    frame.loc[frame.index >= 10, "y"] = np.nan
    frame = pd.concat([frame, with_labels([0.0, 1.0], n_rows=60)], ignore_index=True)  # rows to split
    (note,) = prepare(write(frame, tmp_path / "data.parquet"), tmp_path).table.notes
    assert "4,990 missing values" in note and "rows 10, 11," in note and "and 4,982 more" in note
    assert len(note) < 300


@pytest.mark.parametrize("name", ["data.parquet", "data.csv"])
def test_labels_differing_by_surrounding_whitespace_are_one_class(tmp_path, name):
    path = write(with_labels(["yes", " yes", "yes  ", "no", "\tno"]), tmp_path / name)
    prepared = prepare(path, tmp_path)
    assert prepared.table.class_labels == ["no", "yes"]
    assert prepared.table.class_counts == {"no": 24, "yes": 36}


def test_labels_differing_by_case_are_kept_apart_and_warned(tmp_path):
    path = write(with_labels(["yes", "YES ", "no"]), tmp_path / "data.csv")
    prepared = prepare(path, tmp_path)
    assert prepared.table.class_labels == ["YES", "no", "yes"]
    expected = ["classes 'YES' and 'yes' differ only by case; they are kept as separate classes"]
    assert label_case_warnings(prepared.table.class_labels) == expected
    assert prepared.table.notes == expected


def test_case_warnings_are_bounded():
    assert label_case_warnings(["cat", "dog", "Bird"]) == []
    assert label_case_warnings(["a", "A"]) == [
        "classes 'a' and 'A' differ only by case; they are kept as separate classes"
    ]
    three = label_case_warnings(["yes", "Yes", "YES"])
    assert three == ["classes 'yes', 'Yes', 'YES' differ only by case; they are kept as separate classes"]
    many = label_case_warnings([f"class{i}" for i in range(100)] + [f"CLASS{i}" for i in range(100)])
    assert len(many) == CASE_WARNINGS + 1
    assert many[-1] == "... and 95 more groups of classes differ only by case"


def test_na_null_and_n_a_are_ordinary_classes_in_csv(tmp_path):
    path = write(with_labels(["NA", "NULL", "n/a", "N/A", "none"], n_rows=100), tmp_path / "data.csv")
    prepared = prepare(path, tmp_path)
    assert prepared.table.class_labels == ["N/A", "NA", "NULL", "n/a", "none"]
    assert set(prepared.table.class_counts.values()) == {20}


def test_integer_csv_labels_stay_numbers(tmp_path):
    path = write(with_labels(list(range(12)), n_rows=240), tmp_path / "data.csv")
    prepared = prepare(path, tmp_path)
    assert prepared.table.class_labels == [str(digit) for digit in range(12)]  # 10 after 9, not after 1


def test_na_in_a_csv_feature_is_a_missing_value_imputed_and_flagged(tmp_path):
    path = tmp_path / "data.csv"
    write(with_labels(["a", "b"]), path)
    lines = path.read_text().splitlines()
    lines[4] = "NA," + lines[4].split(",", 1)[1]  # row 3's f0
    path.write_text("\n".join(lines) + "\n")
    prepared = prepare(str(path), tmp_path)
    assert prepared.table.feature_names == ["f0", "f0<missing>", "f1"]
    encoding = prepared.table.fitted_encoding()
    assert encoding.transform(pa.table({"f0": [None, 2.0], "f1": [0.0, 0.0]}))[:, 1].tolist() == [1.0, 0.0]


def test_a_continuous_label_gives_a_bounded_message(tmp_path):
    frame = features(2_000).assign(y=np.random.default_rng(1).normal(size=2_000))
    message = refusal(write(frame, tmp_path / "data.csv"), tmp_path, "classification")
    assert len(message) < 1_000
    assert "2,000 of 2,000 classes have fewer than 3 rows" in message
    assert "and 1,992 more" in message and "looks continuous" in message
    assert "problem_type='regression'" in message
    assert prepare(write(frame, tmp_path / "data.csv"), tmp_path).table.target.regression  # under auto


# --- CSV parsing ----------------------------------------------------------------------------------


def test_a_late_float_in_an_integer_csv_column_is_read(tmp_path):
    path = late_column_csv(tmp_path / "late.csv", "0.5")
    before = Path(path).read_bytes()
    dataset = open_dataset(path, "y")
    f1 = pa.concat_arrays([batch.column("f1") for batch in iter_batches(dataset, path)])
    assert f1.type == pa.float64()
    assert len(f1) == 200_001 and f1[-1].as_py() == 0.5 and f1[8].as_py() == 1.0
    assert Path(path).read_bytes() == before


def test_a_late_non_number_names_the_column_and_line(tmp_path):
    path = late_column_csv(tmp_path / "late.csv", "abc")
    message = refusal(path, tmp_path)
    assert message.startswith(f"{path}: column 'f1' holds 'abc' at line 200,002, not a number")


@pytest.mark.parametrize("delimiter", [";", "\t", "|"])
def test_csv_delimiter_is_sniffed_from_the_header(tmp_path, delimiter):
    frame = with_labels(["a", "b"])
    path = write(frame, tmp_path / "data.csv", sep=delimiter)
    before = Path(path).read_bytes()
    prepared = prepare(path, tmp_path)
    assert prepared.table.feature_names == ["f0", "f1"]
    assert sum(prepared.table.rows.values()) == len(frame)
    assert Path(path).read_bytes() == before


def test_sniff_delimiter():
    assert sniff_delimiter("f0,f1,species") == ","
    assert sniff_delimiter("f0;f1;species") == ";"
    assert sniff_delimiter('"a,b";"c";"d"') == ";"
    assert sniff_delimiter("species") == ","


# --- part files -----------------------------------------------------------------------------------


def test_part_files_whose_numeric_types_differ_are_read_as_floats(tmp_path):
    parts = tmp_path / "parts.parquet"
    parts.mkdir()
    frame = pd.DataFrame({"f0": np.arange(30), "y": np.arange(30) % 2})
    write(frame, parts / "a.parquet")
    write(frame.assign(f0=frame["f0"] + 0.5), parts / "b.parquet")
    prepared = prepare(str(parts), tmp_path)
    assert sum(prepared.table.rows.values()) == 60
    mean = prepared.table.scaler.mean[0]
    assert mean != pytest.approx(round(mean))  # the .5s were kept


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_part_files_that_disagree_name_the_file_and_column(tmp_path, suffix):
    parts = tmp_path / f"parts{suffix}"
    parts.mkdir()
    frame = with_labels(["a", "b"])
    write(frame, parts / f"a{suffix}")
    bad = write(frame.assign(f1=[f"x{i}" for i in range(len(frame))]), parts / f"b{suffix}")
    before = Path(bad).read_bytes()
    message = refusal(str(parts), tmp_path)
    assert message.startswith(f"{parts}: part file {bad}") and "column 'f1'" in message
    assert Path(bad).read_bytes() == before


def test_part_files_with_other_columns_name_them(tmp_path):
    parts = tmp_path / "parts.parquet"
    parts.mkdir()
    frame = with_labels(["a", "b"])
    write(frame, parts / "a.parquet")
    write(frame.rename(columns={"f1": "g1"}), parts / "b.parquet")
    message = refusal(str(parts), tmp_path)
    assert "b.parquet has other columns than part file" in message and "lacks 'f1' and adds 'g1'" in message


# --- remote inputs --------------------------------------------------------------------------------


class NoCredentialsError(Exception):
    """Stands in for botocore's: no network is touched."""


def fail_with(error: Exception):
    def fail(*args, **kwargs):
        raise error

    return fail


def remote_refusals(uri: str) -> list[str]:
    messages = []
    for read in (open_dataset, describe_input, dataset_fingerprint):
        with pytest.raises(DatasetError) as error:
            read(uri)
        messages.append(str(error.value))
    return messages


def test_remote_failure_is_one_line_naming_the_uri_and_cause(monkeypatch):
    uri = "memory://bucket/data.parquet"
    error = NoCredentialsError("Unable to locate credentials")
    monkeypatch.setattr(fsspec.implementations.memory.MemoryFileSystem, "info", fail_with(error))
    for message in remote_refusals(uri):
        assert message == f"cannot read {uri}: NoCredentialsError: Unable to locate credentials"


def test_unreachable_host_reported_as_missing_file_names_the_cause(monkeypatch):
    uri = "memory://bucket/data.csv"
    unreachable = FileNotFoundError(uri)
    unreachable.__cause__ = ConnectionError("Cannot connect to host\nstorage.example:443 [DNS failure]")
    monkeypatch.setattr(fsspec.implementations.memory.MemoryFileSystem, "info", fail_with(unreachable))
    for message in remote_refusals(uri):
        assert (
            message
            == f"cannot read {uri}: ConnectionError: Cannot connect to host storage.example:443 [DNS failure]"
        )


def refusal_of(uri: str) -> str:
    with pytest.raises(DatasetError) as error:
        open_dataset(uri)
    return str(error.value)


def test_refused_connection_names_the_uri():
    uri = "http://127.0.0.1:9/data.parquet"  # the local discard port: refused at once, no DNS
    message = refusal_of(uri)
    assert message.startswith(f"cannot read {uri}: ") and "\n" not in message


def test_missing_remote_file_is_still_no_such_file():
    assert (
        refusal_of("memory://bucket/absent.parquet")
        == "memory://bucket/absent.parquet: no such file or directory"
    )


# --- bounded messages -----------------------------------------------------------------------------


def test_preview():
    assert preview(["a", "b"]) == "a, b"
    assert preview([]) == ""
    assert (
        preview([i / 10 for i in range(2_000)])
        == "0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, ... and 1,992 more"
    )
    assert preview(["x" * 500], limit=1) == "x" * 57 + "..."


def test_one_line():
    assert one_line(ValueError("first\n  second")) == "ValueError: first second"
    assert one_line(KeyError()) == "KeyError"
    assert len(one_line(ValueError("y" * 10_000))) == 300
