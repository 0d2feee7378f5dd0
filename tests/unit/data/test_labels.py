"""labels.py: the label column read once, checked and encoded as class codes. Rows without a label are
left out with a bounded note; labels differing by surrounding whitespace are one class, by case two (with
a warning); a CSV label is a number only when every label is written as its number is (`001` is not
class 1), in one pod and in pieces alike; parquet labels keep their type; and the label kind turns the
class labels back into the column's values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tasks.core.data import labels as labels_module
from tasks.core.data.assignment import SplitConfig
from tasks.core.data.labels import (
    CASE_WARNINGS,
    Labels,
    clean_labels,
    encode_labels,
    label_case_warnings,
    sorted_classes,
    typed_labels,
)
from tasks.core.data.prepare import prepare_dataset
from tests.conftest import blobs_frame
from tests.unit.data.tables import (
    assert_same_splits,
    digests,
    prepare,
    prepare_in_pieces,
    prepare_y,
    row_ids,
    split_frames,
    with_labels,
    write_frame,
)

# --- missing labels -------------------------------------------------------------------------------


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


@pytest.mark.parametrize("name", ["data.parquet", "data.csv"])
def test_nan_float_labels_leave_their_rows_out_naming_them(tmp_path, name):
    frame = with_labels([0.0, 1.0])
    frame.loc[[4, 9], "y"] = np.nan
    prepared = prepare_y(write_frame(frame, tmp_path / name), tmp_path)
    (note,) = prepared.table.notes
    assert "label column 'y'" in note and "2 missing values" in note and "rows 4, 9" in note
    assert sum(prepared.table.rows.values()) == 58
    assert prepared.table.class_labels == ["0.0", "1.0"] and prepared.table.label_kind == "float"


def test_many_missing_labels_give_a_bounded_note(tmp_path):
    frame = with_labels([0.0, 1.0], n_rows=5_000)
    frame.loc[frame.index >= 10, "y"] = np.nan
    frame = pd.concat([frame, with_labels([0.0, 1.0], n_rows=60)], ignore_index=True)  # rows to split
    (note,) = prepare_y(write_frame(frame, tmp_path / "data.parquet"), tmp_path).table.notes
    assert "4,990 missing values" in note and "rows 10, 11," in note and "and 4,982 more" in note
    assert len(note) < 300


# --- classes that differ by whitespace or case --------------------------------------------------


@pytest.mark.parametrize("name", ["data.parquet", "data.csv"])
def test_labels_differing_by_surrounding_whitespace_are_one_class(tmp_path, name):
    path = write_frame(with_labels(["yes", " yes", "yes  ", "no", "\tno"]), tmp_path / name)
    prepared = prepare_y(path, tmp_path)
    assert prepared.table.class_labels == ["no", "yes"]
    assert prepared.table.class_counts == {"no": 24, "yes": 36}


def test_labels_differing_by_case_are_kept_apart_and_warned(tmp_path):
    path = write_frame(with_labels(["yes", "YES ", "no"]), tmp_path / "data.csv")
    prepared = prepare_y(path, tmp_path)
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


# --- label codes: text unless written as numbers ------------------------------------------------


ROWS_PER_LABEL = 40


# case -> (the labels as the file holds them, the label kind, the class labels in order)
CSV_LABELS = {
    "leading zeros": (["001", "010", "100"], "string", ["001", "010", "100"]),
    "one number in two widths": (["7", "07", "8"], "string", ["07", "7", "8"]),
    "a zero-padded code beside integers": (["1", "2", "0003"], "string", ["0003", "1", "2"]),
    "a plus sign": (["+1", "2", "3"], "string", ["+1", "2", "3"]),
    "an integer beside fractions": (["1", "2.5", "3.5"], "string", ["1", "2.5", "3.5"]),
    "a fraction with a trailing zero": (["0.50", "1.5", "2.5"], "string", ["0.50", "1.5", "2.5"]),
    "letters and digits": (["A01", "B02", "C03"], "string", ["A01", "B02", "C03"]),
    "integers": (["3", "10", "7"], "integer", ["3", "7", "10"]),
    "negative integers": (["-1", "0", "12"], "integer", ["-1", "0", "12"]),
    "floats as written": (["0.5", "1.25", "1e+20"], "float", ["0.5", "1.25", "1e+20"]),
}


PARQUET_LABELS = {
    "integers": ([1, 10, 100], "integer", ["1", "10", "100"]),
    "text codes": (["001", "010", "100"], "string", ["001", "010", "100"]),
    "one number in two widths as text": (["7", "07", "8"], "string", ["07", "7", "8"]),
    "floats": ([0.5, 2.0, 10.0], "float", ["0.5", "2.0", "10.0"]),
}


def labelled_parts(folder: Path, labels: list, suffix: str) -> None:
    """A folder of one part per label, each holding that label alone: a piece of one part sees only it."""
    folder.mkdir()
    features = blobs_frame(n_rows=ROWS_PER_LABEL * len(labels), seed=7).drop(columns="species")
    for index, label in enumerate(labels):
        rows = slice(index * ROWS_PER_LABEL, (index + 1) * ROWS_PER_LABEL)
        part = features.iloc[rows].assign(code=[label] * ROWS_PER_LABEL)
        path = folder / f"part-{index:05d}{suffix}"
        part.to_csv(path, index=False) if suffix == ".csv" else part.to_parquet(path, index=False)


def check_codes(tmp_path: Path, labels: list, suffix: str, kind: str, class_labels: list[str]) -> None:
    folder = tmp_path / "parts"
    labelled_parts(folder, labels, suffix)
    before = digests(folder)
    split = SplitConfig(seed=2, problem_type="classification")  # fractional floats are asked as classes
    one_pod = prepare_dataset(str(folder), "code", str(tmp_path / "one"), split)
    assert (one_pod.table.label_kind, one_pod.table.class_labels) == (kind, class_labels)
    assert one_pod.table.class_counts == dict.fromkeys(class_labels, ROWS_PER_LABEL)  # no class merged
    typed = typed_labels(one_pod.table.class_labels, kind)  # what scoring answers: a code comes back as text
    assert sorted(map(str, typed)) == sorted(map(str, labels)) and len(set(map(type, typed))) == 1
    pieces = prepare_in_pieces(str(folder), "code", str(tmp_path / "pieces"), split, len(labels))
    assert_same_splits(pieces, one_pod)  # a piece per label, yet the whole column's kind
    assert digests(folder) == before


@pytest.mark.parametrize("case", sorted(CSV_LABELS))
def test_csv_labels_are_numbers_only_when_written_as_numbers(tmp_path, case):
    labels, kind, class_labels = CSV_LABELS[case]
    check_codes(tmp_path, labels, ".csv", kind, class_labels)


@pytest.mark.parametrize("case", sorted(PARQUET_LABELS))
def test_parquet_labels_keep_their_type(tmp_path, case):
    labels, kind, class_labels = PARQUET_LABELS[case]
    check_codes(tmp_path, labels, ".parquet", kind, class_labels)


def test_a_csv_label_nan_is_missing_among_float_labels(tmp_path):
    folder = tmp_path / "parts"
    labelled_parts(folder, ["0.5", "1.5", "2.5"], ".csv")
    path = folder / "part-00000.csv"
    frame = pd.read_csv(path, dtype={"code": str})
    frame.loc[np.arange(3), "code"] = "nan"
    frame.to_csv(path, index=False)
    split = SplitConfig(problem_type="classification")
    prepared = prepare_dataset(str(folder), "code", str(tmp_path / "out"), split)
    assert (prepared.table.label_kind, prepared.table.class_labels) == ("float", ["0.5", "1.5", "2.5"])
    assert sum(prepared.table.rows.values()) == 3 * ROWS_PER_LABEL - 3


def test_integer_csv_labels_stay_numbers(tmp_path):
    path = write_frame(with_labels(list(range(12)), n_rows=240), tmp_path / "data.csv")
    prepared = prepare_y(path, tmp_path)
    assert prepared.table.class_labels == [str(digit) for digit in range(12)]  # 10 after 9, not after 1


# --- label kinds: the class labels are text, and the kind turns them back into the column's values


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


# ---- labels read and coded a chunk at a time -------------------------------------------------------


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


@pytest.mark.parametrize("from_csv", [False, True])
@pytest.mark.parametrize("chunks", [[TEXT_LABELS[0], TEXT_LABELS[1]], [TEXT_LABELS[2]], [TEXT_LABELS[3]]])
def test_text_labels_coded_per_distinct_value_code_as_every_row(from_csv, chunks):
    """Text labels are held as distinct values (two of which may clean to one class, or be used by no
    labelled row) and each row's place: coded once per distinct value, as coding every row codes them."""
    text = pa.chunked_array([pa.array(chunk).dictionary_encode() for chunk in chunks])
    cleaned = clean_labels(text, "in.csv", "label", from_csv)
    assert cleaned.at is not None and len(cleaned.at) == int((~cleaned.missing).sum())
    codes, classes = encode_labels(cleaned, "in.csv", "label")
    row_codes, row_classes = encode_labels(Labels(cleaned.values, cleaned.missing), "in.csv", "label")
    assert classes == row_classes and codes.dtype == row_codes.dtype == np.int32
    np.testing.assert_array_equal(codes, row_codes)
