"""Preparing a dataset in one pod: read, check, split, encode, standardise and write the splits.

The passes over the input: the label column alone decides every row's class and split; the train
rows' statistics (every feature value read as its kind) give the encoding (encoding.py) and the
standardisation (scaling.py); then each row is written to its split, and its hash beside it
(writing.py), so that rows copied from one split into another are counted (`copy_notes`).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from tasks.core.data.assignment import (
    SPLITS,
    UNLABELLED,
    SplitConfig,
    SplitTimes,
    assign_splits,
    check_split_sizes,
    checked_assignment,
    split_times,
    time_assignment,
)
from tasks.core.data.background import ordered_map
from tasks.core.data.column_kinds import ColumnKind, propose_kinds, read_as_dictionary
from tasks.core.data.columns import feature_columns, non_feature_columns
from tasks.core.data.copies import copy_notes, hash_files
from tasks.core.data.encoding import EncodingStats, FittedEncoding, batch_stats
from tasks.core.data.files import DatasetError
from tasks.core.data.labels import (
    Labels,
    clean_labels,
    encode_labels,
    label_case_warnings,
    label_kind,
    scan_labels,
)
from tasks.core.data.reading import first_batch, iter_batches, open_dataset, with_offsets
from tasks.core.data.scaling import ScalerStats, train_scaler
from tasks.core.data.splits import SplitPaths
from tasks.core.data.table import PreparedTable
from tasks.core.data.target import (
    Target,
    decide_problem_type,
    fitted_target,
    quantile_bins,
    regression_values,
)
from tasks.core.data.writing import SplitFiles, split_files, write_splits

EMBEDDED_DIGITS_LABEL = "label"


def with_encoding(table: PreparedTable, encoding: str) -> PreparedTable:
    """`table` with the encoding fitted on its train rows (the JSON text of `FittedEncoding.to_dict()`):
    the encoded features are what the model reads, and the notes say which columns it left out."""
    fitted = FittedEncoding.from_dict(json.loads(encoding))
    notes = [*table.notes, *fitted.left_out.values()]
    return replace(table, feature_names=fitted.encoded_names(), encoding=encoding, notes=notes)


@dataclass
class PreparedSplits:
    """Where the prepared splits were written, and what they hold."""

    paths: dict[str, str]  # by split
    table: PreparedTable

    def split_paths(self) -> SplitPaths:
        return self.table.split_paths(self.paths["train"], self.paths["val"])


def with_copy_notes(prepared: PreparedSplits, out_dir: str) -> PreparedSplits:
    """`prepared` with notes on the rows copied between its splits (`copy_notes`)."""
    notes = [*prepared.table.notes, *copy_notes(out_dir, prepared.table.rows)]
    return replace(prepared, table=replace(prepared.table, notes=notes))


@dataclass
class RowSplit:
    """Every row's class code and split, decided from the label column of the whole input: the same
    rows land in each split however many pieces then read the features. A row without a label is in
    no split (`UNLABELLED`, code -1). A regression's `codes` are the label's values (float64, NaN
    where missing) and it has no classes."""

    codes: np.ndarray
    class_labels: list[str]
    label_kind: str
    assignment: np.ndarray  # one byte per row: its index in SPLITS, or UNLABELLED
    notes: list[str] = field(default_factory=list)  # the rows left out for want of a label
    target: Target = field(default_factory=Target)

    @classmethod
    def of(
        cls, labels: Labels, uri: str, label_column: str, split: SplitConfig, times: SplitTimes | None = None
    ) -> RowSplit:
        """From the cleaned labels of every row (`clean_labels`), refusing a split the rows cannot fill;
        with the `times` of every row (`split_times`), in time order rather than at random."""
        pa.default_memory_pool().release_unused()  # the label column's Arrow memory, read and cleaned
        text = labels.distinct.dtype == object  # its type decides alone: each row's text is not needed
        values = labels.distinct if text else labels.values
        target = decide_problem_type(values, split.problem_type, uri, label_column)
        if target.regression:
            return cls.of_numbers(labels, uri, label_column, split, times, target)
        codes, class_labels = encode_labels(labels, uri, label_column)
        if times is None:
            check_split_sizes(codes, class_labels, split, uri, label_column)
            assignment, notes = checked_assignment(codes, class_labels, split, uri), []
        else:
            labelled = times.labelled(labels.missing)
            assignment, notes = time_assignment(codes, class_labels, labelled, split, uri)
        return cls(
            every_row(codes, labels.missing, -1),
            class_labels,
            label_kind(labels.distinct),
            every_row(assignment, labels.missing, UNLABELLED),
            [*labels.note(label_column), *notes],
            target,
        )

    @classmethod
    def of_numbers(
        cls,
        labels: Labels,
        uri: str,
        label_column: str,
        split: SplitConfig,
        times: SplitTimes | None,
        target: Target,
    ) -> RowSplit:
        """A regression's rows: split at random stratified by the label's quantile bins (or in time
        order), and the label's train mean and deviation fitted."""
        values = regression_values(labels.values, uri, label_column)
        if times is None:
            assignment = assign_splits(quantile_bins(values), split)
            notes = [
                "split at random, stratified by quantile bins of the label (each split covers its range)"
            ]
        else:
            one_class = np.zeros(len(values), dtype=np.int64)
            assignment, notes = time_assignment(
                one_class, [label_column], times.labelled(labels.missing), split, uri
            )
        target = fitted_target(target, values[assignment == SPLITS.index("train")], uri, label_column)
        return cls(
            every_row(values, labels.missing, np.nan),
            [],
            label_kind(labels.distinct),
            every_row(assignment, labels.missing, UNLABELLED),
            [*labels.note(label_column), *notes],
            target,
        )

    def table(
        self, columns: list[str], label_column: str, uri: str, left_out: dict[str, str], split: SplitConfig
    ) -> PreparedTable:
        """What the splits hold, split by `split`, but the encoding and the scaler: fitted afterwards
        on the train rows (`with_encoding`, `train_scaler`)."""
        classes = self.class_labels
        counts = np.bincount(self.codes + 1, minlength=len(classes) + 1)[1:] if classes else []  # -1: none
        rows = np.bincount(self.assignment, minlength=len(SPLITS))
        return PreparedTable(
            feature_names=[],
            label_column=label_column,
            class_labels=self.class_labels,
            class_counts={c: int(n) for c, n in zip(self.class_labels, counts, strict=True)},
            rows={name: int(rows[i]) for i, name in enumerate(SPLITS)},
            scaler=ScalerStats(mean=[], scale=[]),
            source=uri,
            label_kind=self.label_kind,
            notes=[*left_out.values(), *label_case_warnings(self.class_labels), *self.notes],
            columns=columns,
            target=self.target,
            split=split,
        )


def every_row(values: np.ndarray, missing: np.ndarray, fill: int) -> np.ndarray:
    """`values` of the labelled rows spread over every row, `fill` where the label is missing."""
    spread = np.full(len(missing), fill, dtype=values.dtype)
    spread[~missing] = values
    return spread


def feature_kinds(
    dataset: ds.Dataset, uri: str, columns: list[str], overrides: Mapping[str, str] | None = None
) -> dict[str, ColumnKind]:
    """Each feature column's kind, from its type and the first batch's values, or as the user's
    `overrides` (column -> kind or 'drop') say (`propose_kinds`)."""
    sample = first_batch(dataset, uri, columns)
    try:
        return propose_kinds(dataset.schema, columns, overrides, sample=sample)
    except DatasetError as err:
        raise DatasetError(f"{uri}: {err}") from None


def train_encoding_stats(
    dataset: ds.Dataset, uri: str, kinds: dict[str, ColumnKind], assignment: np.ndarray, first_row: int = 0
) -> EncodingStats:
    """The encoding statistics of the train rows, merged batch by batch; every row's feature values are
    read as their kinds, and a bad one refused by column and row. `assignment` holds the splits of the
    dataset's rows, the first of which is row `first_row` of the input."""
    categories = [name for name, kind in kinds.items() if read_as_dictionary(kind.kind)]

    def train_stats(numbered: tuple[int, pa.RecordBatch]) -> EncodingStats:
        offset, batch = numbered
        in_train = assignment[offset : offset + batch.num_rows] == SPLITS.index("train")
        return batch_stats(kinds, batch, first_row + offset, in_train, uri)

    stats = EncodingStats.empty(kinds)
    # Closed on a bad value too: the reading thread ends before the error is handed on.
    with closing(iter_batches(dataset, uri, columns=list(kinds), as_dictionary=categories)) as batches:
        for part in ordered_map(train_stats, with_offsets(batches)):
            stats = stats.merge(part)
    return stats


def fit_encoding(stats: EncodingStats, uri: str) -> str:
    """The encoding the train rows' statistics give, as the JSON text `PreparedTable.encoding` holds."""
    try:
        return json.dumps(stats.fit().to_dict())
    except DatasetError as err:
        raise DatasetError(f"{uri}: {err}") from None


def prepare_dataset(
    uri: str,
    label_column: str,
    out_dir: str,
    split: SplitConfig,
    column_kinds: Mapping[str, str] | None = None,
) -> PreparedSplits:
    """Validate `uri` and write train/val/test parquet files under `out_dir`: encoded and standardised
    train and val splits, and the test split's raw feature columns (`RAW_SPLIT`)."""
    dataset = open_dataset(uri, label_column, column_kinds=column_kinds)
    left_out = non_feature_columns(dataset, uri, label_column)
    columns = feature_columns(dataset.schema, label_column, uri, left_out)
    kinds = feature_kinds(dataset, uri, columns, column_kinds)
    from_csv = isinstance(dataset.format, ds.CsvFileFormat)
    labels = clean_labels(scan_labels(dataset, uri, label_column), uri, label_column, from_csv)
    rows = RowSplit.of(labels, uri, label_column, split, split_times([dataset], uri, split, label_column))
    del labels  # each row's place among the labels, not kept: the rows' codes stand for them now
    stats = train_encoding_stats(dataset, uri, kinds, rows.assignment)
    table = with_encoding(rows.table(columns, label_column, uri, left_out, split), fit_encoding(stats, uri))
    table = replace(table, scaler=train_scaler(stats, table.fitted_encoding(), uri))
    prepared = PreparedSplits(paths=split_files(out_dir), table=table)
    write_splits(
        dataset, uri, table, SplitFiles(prepared.paths, hash_files(out_dir)), rows.codes, rows.assignment
    )
    return with_copy_notes(prepared, out_dir)


def write_embedded_digits(directory: str | None = None) -> str:
    """scikit-learn's bundled handwritten digits (1797 x 64, 10 classes) as parquet; no network."""
    from sklearn.datasets import load_digits

    digits = load_digits(as_frame=True)
    frame = digits.frame.rename(columns={"target": EMBEDDED_DIGITS_LABEL})
    directory = directory or tempfile.mkdtemp(prefix="mixedml-digits-")
    path = str(Path(directory) / "digits.parquet")
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return path
