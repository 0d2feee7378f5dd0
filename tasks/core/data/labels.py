"""The label column: read once, checked, and encoded as class codes; rows without a label are left out."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from tasks.core.data.column_kinds import is_text
from tasks.core.data.files import DatasetError
from tasks.core.data.reading import iter_batches
from tasks.core.data.target import MAX_AUTO_CLASSES
from tasks.core.messages import preview, shorten

CASE_WARNINGS = 5
LABEL_CHUNK_ROWS = 1 << 20  # the labels hashed at once by `sorted_classes`
# A label column's kind, by its numpy dtype's kind (any other is "string"), and how the text of its
# class labels turns back into its values.
LABEL_KINDS = {"i": "integer", "u": "integer", "f": "float", "b": "boolean"}
NUMBER_TYPES_BY_KIND = {"integer": (pa.int64(),), "float": (pa.float64(),)}
NUMBER_TYPES = (pa.int64(), pa.float64())  # tried in turn on CSV labels: see `clean_labels`
LABEL_PARSERS = {"string": str, "integer": int, "float": float, "boolean": lambda text: text == "True"}


def scan_labels(dataset: ds.Dataset, uri: str, label_column: str) -> pa.ChunkedArray:
    """The label column of every row, read alone: the feature values are checked as they are encoded.
    Text comes as a dictionary array a batch at a time: a few distinct labels and 4 bytes a row, where
    the text of every row took some 10 bytes a row or more."""
    kind = dataset.schema.field(label_column).type
    batches = iter_batches(dataset, uri, columns=[label_column], as_dictionary=[label_column])
    if is_text(kind):
        kind = pa.dictionary(pa.int32(), kind)
        chunks = [as_dictionary(batch.column(label_column)) for batch in batches]
    else:
        chunks = [batch.column(label_column) for batch in batches]
    if not sum(len(chunk) for chunk in chunks):
        raise DatasetError(f"{uri}: the dataset has no rows")
    return pa.chunked_array(chunks, type=kind)


def as_dictionary(text: pa.Array) -> pa.DictionaryArray:
    """Text as a dictionary array: a parquet input's text is read as one (`iter_batches`), a CSV's not."""
    return text if pa.types.is_dictionary(text.type) else text.dictionary_encode()


def as_numbers(labels: pa.ChunkedArray, kinds: tuple[pa.DataType, ...] = NUMBER_TYPES) -> pa.ChunkedArray:
    """Text labels as int64 (else float64) when every one is written as that number is written (`7`,
    `2.5`), else unchanged: a code such as `001`, or `7` beside `07`, stays text."""
    for kind in kinds:
        try:
            numbers = pc.cast(labels, kind)
        except pa.ArrowInvalid:
            continue
        if written_as_numbers(labels, kind):
            return numbers
    return labels


def integer_text(text: str) -> str:
    return str(int(text))


def float_text(text: str) -> str:
    value = float(text)
    return text if value != value else repr(value)  # a NaN label is missing, however it is written


NUMBER_TEXTS = {pa.int64(): integer_text, pa.float64(): float_text}


def written_as_numbers(labels: pa.ChunkedArray, kind: pa.DataType) -> bool:
    """Whether each distinct label reads back as its own text once read as a number of `kind`: then
    reading the labels as numbers neither merges two classes nor changes how one is written."""
    text_of = NUMBER_TEXTS[kind]
    return all(text_of(text) == text for text in pc.unique(labels).drop_null().to_pylist())


def missing_labels(labels: pa.ChunkedArray) -> np.ndarray:
    """Where a label is null, NaN or empty text, one bool a row: such a row is no class to train on."""
    missing = pc.is_null(labels, nan_is_null=True)
    if is_text(labels.type):
        missing = pc.or_(missing, pc.fill_null(pc.equal(labels, ""), True))
    return missing.to_numpy(zero_copy_only=False).astype(bool)


@dataclass
class Labels:
    """The classes of the rows that have a label, in row order, and where the label is missing. Text
    labels are held as their distinct values and each labelled row's place among them (`at`)."""

    distinct: np.ndarray  # each labelled row's label; or where `at` is given, the distinct labels
    missing: np.ndarray  # one bool a row of the input (or of some of its rows)
    at: np.ndarray | None = None  # each labelled row's place in `distinct`

    @cached_property
    def values(self) -> np.ndarray:
        """Each labelled row's label, in row order."""
        return self.distinct if self.at is None else self.distinct[self.at]

    def note(self, label_column: str) -> list[str]:
        """What the rows without a label became, for the prepared table's notes."""
        rows = np.flatnonzero(self.missing)
        if not len(rows):
            return []
        if len(rows) == 1:
            return [
                f"label column '{label_column}' has a missing value (empty, null or NaN) at row "
                f"{rows[0]}; that row is left out of every split"
            ]
        return [
            f"label column '{label_column}' has {len(rows):,} missing values (empty, null or NaN) at "
            f"rows {preview(rows)}; those rows are left out of every split"
        ]


def clean_labels(
    labels: pa.ChunkedArray, uri: str, label_column: str, from_csv: bool, kind: str | None = None
) -> Labels:
    """Labels as classes: text stripped of surrounding whitespace, and the rows without one noted.

    CSV labels are read as text; a column of numbers among them is read back as numbers (`as_numbers`),
    so digits 0-9 sort as numbers and a float label 'nan' counts as missing, while codes such as `001`
    stay text. Labels that are some rows of an input pass its `kind` (`label_kind`), decided on the
    whole column: their text is read as the whole column's values are.
    """
    if pa.types.is_dictionary(labels.type) and not is_text(labels.type.value_type):
        labels = pc.cast(labels, labels.type.value_type)
    if not (is_text(labels.type) or pa.types.is_dictionary(labels.type)):
        missing = missing_labels(labels)
        return Labels(labels.filter(pa.array(~missing)).to_numpy(), missing)
    # Text is cleaned once per distinct label, not per row: each row's text copied (stripped, then the
    # labelled rows) took some 30 bytes a row.
    if not pa.types.is_dictionary(labels.type):
        labels = pc.dictionary_encode(labels)
    encoded = labels.combine_chunks()  # one dictionary for every chunk
    distinct = cleaned_text(encoded.dictionary, from_csv, kind)
    distinct_missing = np.append(missing_labels(distinct), True)  # the last stands for a null label
    indices = pc.cast(encoded.indices, pa.int32())
    rows = indices.fill_null(len(distinct)).to_numpy(zero_copy_only=False)
    del encoded, indices
    missing = distinct_missing[rows]
    return Labels(distinct_values(distinct), missing, rows[~missing])


def cleaned_text(distinct: pa.Array, from_csv: bool, kind: str | None) -> pa.Array:
    """The distinct labels stripped of surrounding whitespace; from CSV, an empty one as null, and all
    as numbers where each is written as a number (`as_numbers`)."""
    distinct = pc.utf8_trim_whitespace(distinct)
    if from_csv:
        distinct = pc.if_else(
            pc.equal(distinct, ""), pa.scalar(None, distinct.type), distinct
        )  # an empty cell
        distinct = as_numbers(distinct, NUMBER_TYPES if kind is None else NUMBER_TYPES_BY_KIND.get(kind, ()))
    return distinct


def distinct_values(distinct: pa.Array) -> np.ndarray:
    """The cleaned distinct labels as numpy values, and one more for a null label (never taken: a
    missing label is no value). Text becomes an object array of one Python string per label, so that
    the rows taking from it share them: 8 bytes a row, where a string each row took ~60."""
    if is_text(distinct.type):
        return np.array(distinct.to_pylist() + [None], dtype=object)
    values = pc.fill_null(distinct, 0).to_numpy(zero_copy_only=False)
    return np.concatenate([values, np.zeros(1, dtype=values.dtype)])


def label_kind(labels: np.ndarray) -> str:
    """What the labels are, before they become text: integer, float, boolean, or string for the rest."""
    return LABEL_KINDS.get(labels.dtype.kind, "string")


def typed_labels(class_labels: list[str], kind: str) -> list:
    """The class labels as the values the label column held: "3" is 3 for integer labels."""
    if kind not in LABEL_PARSERS:
        raise ValueError(f"unknown label kind {kind!r}, not one of {', '.join(LABEL_PARSERS)}")
    return [LABEL_PARSERS[kind](label) for label in class_labels]


def encode_labels(labels: Labels, uri: str, label_column: str) -> tuple[np.ndarray, list[str]]:
    """Each labelled row's class code (int32), and the classes, sorted. Labels held as distinct values
    are coded once per distinct value."""
    if labels.at is None:
        return encode_values(labels.values, uri, label_column)
    used = np.bincount(labels.at, minlength=len(labels.distinct)) > 0
    codes, classes = encode_values(labels.distinct[used], uri, label_column)
    code_of = np.zeros(len(labels.distinct), dtype=np.int32)
    code_of[used] = codes
    return code_of[labels.at], classes


def encode_values(labels: np.ndarray, uri: str, label_column: str) -> tuple[np.ndarray, list[str]]:
    if not len(labels):
        raise DatasetError(f"{uri}: label column '{label_column}' has no value (each is empty, null or NaN)")
    classes, codes = sorted_classes(labels)
    if len(classes) < 2:
        raise DatasetError(
            f"{uri}: label column '{label_column}' has a single class ({shorten(repr(classes[0]))}); "
            "classification needs at least 2"
        )
    return codes, [str(c) for c in classes]


def sorted_classes(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(labels, return_inverse=True)`, from hash tables rather than a sort of every row: the
    distinct labels, sorted, and each row's place among them (int32). Hashed a chunk of rows at a
    time, as `pd.factorize` of every row made an int64 array of them."""
    chunks = [slice(start, start + LABEL_CHUNK_ROWS) for start in range(0, len(labels), LABEL_CHUNK_ROWS)]
    codes = np.empty(len(labels), dtype=np.int32)
    chunk_classes = []
    for rows in chunks:
        chunk_codes, distinct = pd.factorize(labels[rows])
        codes[rows] = chunk_codes
        chunk_classes.append(np.asarray(distinct))
    # The chunks' distinct labels, in turn, appear in the order the rows first show them, as one
    # factorize of every row would number them; then each chunk's codes become ranks among them.
    numbers, classes = pd.factorize(np.concatenate(chunk_classes))
    order = np.argsort(classes, kind="stable")
    rank = np.empty(len(order), dtype=np.int32)
    rank[order] = np.arange(len(order))
    first = 0
    for rows, distinct in zip(chunks, chunk_classes, strict=True):
        codes[rows] = rank[numbers[first : first + len(distinct)]][codes[rows]]
        first += len(distinct)
    return np.asarray(classes)[order], codes


def label_case_warnings(class_labels: list[str]) -> list[str]:
    """Warnings for classes that differ only by case ('yes' and 'YES'): they stay separate classes."""
    by_folded: dict[str, list[str]] = {}
    for label in class_labels:
        by_folded.setdefault(label.casefold(), []).append(repr(label))
    clashes = [labels for labels in by_folded.values() if len(labels) > 1]
    warnings = [
        f"classes {' and '.join(labels) if len(labels) == 2 else preview(labels)} differ only by case; "
        "they are kept as separate classes"
        for labels in clashes[:CASE_WARNINGS]
    ]
    if len(clashes) > CASE_WARNINGS:
        warnings.append(
            f"... and {len(clashes) - CASE_WARNINGS:,} more groups of classes differ only by case"
        )
    return warnings


def looks_continuous(class_labels: list[str]) -> bool:
    """Classes that are all numbers, some of them fractional or more than a few distinct: a
    regression target, likely, not classes."""
    try:
        values = [float(label) for label in class_labels]
    except ValueError:
        return False
    return len(values) > MAX_AUTO_CLASSES or any(not value.is_integer() for value in values)
