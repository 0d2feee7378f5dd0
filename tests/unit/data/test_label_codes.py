"""Label codes stay text: a CSV label column is read as numbers only when every label is written as its
number is (`7`, `2.5`), so `001` is not class 1 and `7` and `07` are two classes; in one pod and in
pieces alike, whichever labels a piece holds. Parquet labels keep their type."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tasks.core.data.assignment import SplitConfig
from tasks.core.data.labels import typed_labels
from tasks.core.data.pieces import prepare_in_pieces
from tasks.core.data.prepare import prepare_dataset
from tests.conftest import blobs_frame
from tests.unit.data.test_pieces import assert_same_splits

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


def digests(folder: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.iterdir())}


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
