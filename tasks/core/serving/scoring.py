"""Batch scoring without Flyte: a table streamed through a model bundle into parquet parts.

`plan_scoring` checks every input before anything is scored (the bundle and its format version, the
dataset's URI, every column the model reads, the first rows' values; `open_dataset` refuses parts whose
columns or kinds of types differ) and cuts the input into pieces: the files of a folder, and large
parquet files by row groups. `score_piece` streams one piece in record batches into its own part of the
output folder; `summarise` adds the pieces' label counts into a report. `score_dataset` runs the three
in one process; the scoring workflow maps `score_piece` over pods.
`split_metrics` streams a prepared split through the bundle the same way, for the evaluation's report.

The model reads the raw columns its bundle's encoding reads (text, booleans, dates, missing values), or
a bundle's numeric features where it has no encoding, by the rules `Bundle.predict` applies to any table;
they alone are read by training's rules. The other columns pass through as they were read: a CSV's as
text, a parquet column as its parts hold it (integer widths that differ between parts widened).

Memory stays bounded by a record batch: a part holds the input's columns the model does not read as they
are (ids, the label), the predicted class label in `prediction`, and one probability column per class;
a row whose model outputs are not finite gets nulls there, and the metrics leave it out.

The plan marks the output folder as unfinished (`UNFINISHED`) and the report clears the mark: a rerun
into a folder that holds only an unfinished scoring's parts replaces them, and `score_dataset` removes
what it wrote when it fails.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import TypeVar

import fsspec.implementations.local
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.dataset as ds
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq

from tasks.core.data.api import (
    CATEGORICAL,
    VALUE_ADVICE,
    DatasetError,
    FittedEncoding,
    UnseenCategories,
    csv_format_of,
    detect_format,
    filesystem_for,
    first_batch,
    header_line,
    is_local,
    iter_batches,
    merged_unseen,
    open_dataset,
    parquet_format,
    parquet_split,
    remote_errors,
    row_group_fragments,
    sniff_delimiter,
)
from tasks.core.messages import LINE_CHARS, preview, shorten
from tasks.core.planning.planner import CatalogEntry
from tasks.core.report.metrics import (
    ClassificationMetrics,
    ConfusionCounts,
    RegressionMetrics,
    RegressionSums,
    metrics_from_confusion,
    regression_metrics,
)
from tasks.core.serving.bundle import Bundle, load_bundle
from tasks.core.serving.publish import join, resolve_bundle

T = TypeVar("T")
PREDICTION = "prediction"
PROBABILITY_PREFIX = "probability_"
# Rows a mapped piece scores at most when a large parquet file is cut by row groups.
PIECE_ROWS = 2_000_000
# Rows of the first batch timed on the planning pod (the model's measured cost per row), after a
# first call on a few rows that pays for lazy set-up.
SAMPLE_ROWS, WARM_UP_ROWS = 4096, 64
UNMATCHED_EXAMPLES = 5
NON_FINITE_EXAMPLES = 5
# Marks an output folder whose scoring has not finished; pyarrow and Spark skip names starting with '_'.
UNFINISHED = "_SCORING_UNFINISHED"
PART_NAME = re.compile(r"part-\d{5}\.parquet")
# In place of the reading's advice (VALUE_ADVICE), which speaks of preprocessing.
SCORING_ADVICE = (
    "the model reads this column as it was trained: correct the value, or leave its row out of scoring"
)
HARDWARE = ("auto", "cpu", "gpu")
# The hardware choice's assumptions: how many times faster than one CPU core a whole GPU runs the
# model's forward pass (the rest of a row's work, reading, checking and writing, stays on the host's
# core either way; docs/scoring.md says where the figure comes from), and the seconds each mapped pod
# is billed before it scores (scheduling, node scale-up, image pull, model load).
GPU_MODEL_SPEEDUP = 100.0
POD_START_SECONDS = {"cpu": 30.0, "gpu": 300.0}


@dataclass
class ScoringPiece:
    """What one mapped task scores: a file of the input, or some row groups of a parquet file."""

    index: int
    file: str  # the file's URI
    row_groups: list[int] = field(default_factory=list)  # empty: the whole file
    rows: int = -1  # from the parquet footers; -1 for CSV, counted while scoring
    first_row: int = 0  # the piece's first row in its file, for error messages


@dataclass
class ScoringJob:
    """What every piece shares, checked once by `plan_scoring`."""

    model: str  # the bundle's URI; a publish prefix is resolved to the version its LATEST names
    dataset: str
    label_column: str  # "" when the input has no label column: no metrics
    schema: str  # the input's columns and types (Arrow IPC, base64): every part gets the same columns
    output: str  # the folder receiving one part-NNNNN.parquet per piece
    trusted_builders: list[str] = field(default_factory=list)  # a user's builders the bundle may name

    def bundle(self) -> Bundle:
        return load_bundle(self.model, trusted_builders=self.trusted_builders)


@dataclass
class RowCost:
    """Seconds one row costs on one CPU core, timed on the planning pod's first rows."""

    total: float  # reading, checking, preprocessing, the model, writing
    model: float  # of which the model's forward pass: the only part a GPU runs faster

    def on_gpu(self) -> float:
        """The row on a GPU pod: the host's work stays, the model's shrinks by GPU_MODEL_SPEEDUP."""
        return self.total - self.model + self.model / GPU_MODEL_SPEEDUP

    def gpu_speedup(self) -> float:
        return self.total / self.on_gpu()


@dataclass
class ScoringPlan:
    job: ScoringJob
    pieces: list[ScoringPiece]
    rows: int  # exact for parquet, an overestimate for CSV
    framework: str  # the bundle's: which GPU image can score it
    row_cost: RowCost  # measured on the planning machine's CPU


@dataclass
class HardwareChoice:
    """CPU or a GPU for the scoring pods, by estimated cost; decided before any accelerator is asked for."""

    device: str  # "cpu" or the chosen GPU option's name
    cpu_cost: float  # USD for all pieces on CPU pods
    gpu_cost: float  # USD for all pieces on `gpu`; 0 without one
    gpu: CatalogEntry | None  # the catalog's cheapest whole GPU, chosen or not
    reason: str


@dataclass
class PieceResult:
    index: int
    part: str
    rows: int
    confusion: list[list[int]] = field(default_factory=list)  # true x predicted class; empty without labels
    unmatched: int = 0  # labelled rows whose label is missing or not a class the model knows
    unmatched_examples: list[str] = field(default_factory=list)
    non_finite: int = 0  # rows whose model outputs are not finite: null prediction, out of the metrics
    non_finite_examples: list[str] = field(default_factory=list)  # "<file> row <n>", from 0
    regression: RegressionSums | None = None  # a regression's labelled rows, where there are labels
    unseen: UnseenCategories | None = None  # category values the model's vocabulary lacks


@dataclass(repr=False)
class ScoringReport:
    model: str
    dataset: str
    output: str
    rows: int
    pieces: int
    probability_columns: dict[str, str]  # class label -> its column
    hardware: HardwareChoice | None = None  # None: scored in this process
    metrics: ClassificationMetrics | None = None  # when the input holds the label column
    non_finite_rows: int = 0  # rows with a null prediction: the model's outputs were not finite
    notes: list[str] = field(default_factory=list)
    regression: RegressionMetrics | None = None  # a regression's, when the input holds the label column

    def summary(self) -> str:
        lines = [
            f"model: {self.model}",
            f"scored {self.rows:,} rows of {self.dataset} in {self.pieces} piece{'s' * (self.pieces != 1)} "
            f"into {self.output}",
        ]
        if self.hardware:
            lines.append(f"hardware: {self.hardware.device} ({self.hardware.reason})")
        if self.metrics:
            lines.append(
                f"labelled rows: {self.metrics.n_test:,}  accuracy: {self.metrics.accuracy:.4f}  "
                f"balanced accuracy: {self.metrics.balanced_accuracy:.4f}  macro-F1: {self.metrics.macro_f1:.4f}"
            )
        if self.regression:
            figures = self.regression
            lines.append(
                f"labelled rows: {figures.n_test:,}  RMSE: {figures.rmse:.4g}  MAE: {figures.mae:.4g}  "
                f"R²: {figures.r2:.4f} (the train mean: RMSE {figures.baseline_rmse:.4g}, R² {figures.baseline_r2:.4f})"
            )
        return "\n".join(lines + [f"note: {note}" for note in self.notes])

    def __repr__(self) -> str:
        """What `pyflyte run` prints of the workflow's outputs."""
        return f"\n{self.summary()}\n"


# ---- the output's columns -------------------------------------------------------------------------------


def probability_columns(class_labels: list, taken: set[str]) -> list[str]:
    """`probability_<label>` per class, reduced to letters, digits, '_', '-' and '.', and made unique
    against each other and the columns passed through."""
    names: list[str] = []
    used = set(taken)
    for label in class_labels:
        base = PROBABILITY_PREFIX + (re.sub(r"[^0-9A-Za-z_.-]+", "_", str(label)).strip("_") or "class")
        name, suffix = base, 2
        while name in used:
            name, suffix = f"{base}_{suffix}", suffix + 1
        used.add(name)
        names.append(name)
    return names


@dataclass(frozen=True)
class OutputLayout:
    """The columns of every part: the input's columns the model does not read, `prediction`, the
    probabilities."""

    passthrough: list[str]
    labels: pa.Array  # the class labels as trained, indexed by class code
    probabilities: list[str]
    schema: pa.Schema
    suffixed: dict[str, str] = field(default_factory=dict)  # a probability column the input held -> ours

    @classmethod
    def of(cls, bundle: Bundle, input_schema: pa.Schema) -> OutputLayout:
        read = set(bundle.input_columns)
        passthrough = [f for f in input_schema if f.name not in read]
        if bundle.target.regression:  # the predicted number alone, in the label's type
            number = pa.int64() if bundle.manifest.record.label_kind == "integer" else pa.float64()
            schema = pa.schema([*passthrough, pa.field(PREDICTION, number)])
            return cls([f.name for f in passthrough], pa.array([]), [], schema)
        labels = pa.array(bundle.class_labels)
        names = probability_columns(bundle.class_labels, {f.name for f in passthrough} | {PREDICTION})
        plain = probability_columns(bundle.class_labels, {PREDICTION})
        fields = [
            *passthrough,
            pa.field(PREDICTION, labels.type),
            *(pa.field(n, pa.float32()) for n in names),
        ]
        suffixed = {old: new for old, new in zip(plain, names, strict=True) if old != new}
        return cls([f.name for f in passthrough], labels, names, pa.schema(fields), suffixed)

    @property
    def dictionary(self) -> list[str]:
        """The columns parquet dictionary-encodes: never the probabilities, where it cuts write time 6x."""
        return [*self.passthrough, PREDICTION]

    def number_batch(self, batch: pa.RecordBatch, numbers: np.ndarray) -> pa.RecordBatch:
        """A regression's output rows (`numbers`: `predict_numbers`, whole for an integer label); a row
        without a finite prediction gets a null."""
        void = ~np.isfinite(numbers)
        kind = self.schema.field(PREDICTION).type
        values = np.where(void, 0.0, numbers).astype(np.int64) if kind == pa.int64() else numbers
        columns = [batch.column(name) for name in self.passthrough]
        columns.append(pa.array(values, kind, mask=void if void.any() else None))
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def batch(self, batch: pa.RecordBatch, codes: np.ndarray, probabilities: np.ndarray) -> pa.RecordBatch:
        """The output rows; a row whose probabilities are not all finite gets nulls, not an answer."""
        by_class = np.ascontiguousarray(probabilities.T)  # one copy; each class becomes a column
        void = ~finite_rows(probabilities)
        mask = void if void.any() else None
        columns = [batch.column(name) for name in self.passthrough]
        columns += [
            pc.take(self.labels, pa.array(codes, mask=mask)),
            *(pa.array(values, mask=mask) for values in by_class),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


def finite_rows(probabilities: np.ndarray) -> np.ndarray:
    """Whether each row's model outputs are all finite: a row with a NaN (overflowed logits) has no answer."""
    return np.isfinite(probabilities).all(axis=1)


# ---- checks and pieces ----------------------------------------------------------------------------------


def check_columns(bundle: Bundle, schema: pa.Schema, uri: str, label_column: str) -> str:
    """Every column the model reads present and of a type it reads, no clash with `prediction`; returns
    the label column to score against ("" for none): the one asked for, else the model's when the input
    has it."""
    bundle.check_columns(schema, uri)
    if PREDICTION in schema.names and PREDICTION not in bundle.input_columns:
        raise DatasetError(
            f"{uri}: the input has a column '{PREDICTION}', which the predictions would replace; rename it"
        )
    if label_column and label_column not in schema.names:
        raise DatasetError(
            f"{uri}: label column '{label_column}' not found in the {len(schema.names):,} columns: "
            f"{preview(schema.names)}"
        )
    chosen = label_column or bundle.label_column
    return chosen if chosen in schema.names and chosen not in bundle.input_columns else ""


def check_label_column(bundle: Bundle, label_column: str, uri: str) -> None:
    """A label column the model reads as a feature cannot be the truth to score it against."""
    if label_column and label_column in bundle.input_columns:
        raise DatasetError(
            f"{uri}: label column '{label_column}' is a feature the model reads, not a column of true "
            "labels; name the column that holds the true classes, or none"
        )


def output_entries(output: str) -> list[str]:
    """The names in the output folder; none where it does not exist."""
    filesystem, path = filesystem_for(output)
    with remote_errors(output):
        if not filesystem.isdir(path):
            return []
        return [PurePosixPath(name.rstrip("/")).name for name in filesystem.ls(path, detail=False)]


def unfinished_leftovers(names: list[str]) -> bool:
    """Whether a folder holds only what an unfinished scoring writes: its mark and its parts."""
    return UNFINISHED in names and all(name == UNFINISHED or PART_NAME.fullmatch(name) for name in names)


def unfinished_mark(dataset: str) -> bytes:
    return f"an unfinished scoring of {dataset}\n".encode()


def check_output(output: str, dataset: str) -> None:
    """A new or empty folder, or one holding only the parts of an unfinished scoring of the same dataset."""
    names = output_entries(output)
    if not names:
        return
    if not unfinished_leftovers(names):
        raise DatasetError(
            f"{output}: the output folder already holds files ({preview(names)}); name a new or empty folder"
        )
    filesystem, folder = filesystem_for(output)
    with remote_errors(output):
        mark = filesystem.cat_file(join(folder, UNFINISHED))
    if mark != unfinished_mark(dataset):
        raise DatasetError(
            f"{output}: the output folder already holds files: the parts of "
            f"{shorten(mark.decode(errors='replace').strip(), LINE_CHARS)}, not of {dataset}; "
            "name a new or empty folder"
        )


def claim_output(output: str, dataset: str) -> None:
    """Mark the folder unfinished, replacing the parts an unfinished scoring of `dataset` left there."""
    check_output(output, dataset)
    filesystem, folder = filesystem_for(output)
    with remote_errors(output):
        filesystem.makedirs(folder, exist_ok=True)
        for name in output_entries(output):
            if name != UNFINISHED:
                filesystem.rm_file(join(folder, name))
        filesystem.pipe_file(join(folder, UNFINISHED), unfinished_mark(dataset))


def release_output(output: str, keep_parts: bool) -> None:
    """Clear the unfinished mark once the scoring has finished; without `keep_parts` (it failed) remove
    its parts as well."""
    filesystem, folder = filesystem_for(output)
    names = output_entries(output)
    with remote_errors(output):
        for name in names:
            if name == UNFINISHED or (not keep_parts and PART_NAME.fullmatch(name)):
                filesystem.rm_file(join(folder, name))


def file_uri(filesystem: fsspec.AbstractFileSystem, path: str) -> str:
    return path if is_local(filesystem) else filesystem.unstrip_protocol(path)


def row_group_pieces(
    fragment: ds.ParquetFileFragment, uri: str, rows_per_piece: int
) -> Iterator[ScoringPiece]:
    """The file whole, or runs of its row groups of about `rows_per_piece` rows each."""
    groups = fragment.row_groups
    total = sum(group.num_rows for group in groups)
    if total <= rows_per_piece:
        yield ScoringPiece(0, uri, [], total)
        return
    chosen: list[int] = []
    rows = first = 0
    for group in groups:
        chosen.append(group.id)
        rows += group.num_rows
        if rows >= rows_per_piece:
            yield ScoringPiece(0, uri, chosen, rows, first)
            chosen, first, rows = [], first + rows, 0
    if chosen:
        yield ScoringPiece(0, uri, chosen, rows, first)


def list_pieces(dataset: ds.Dataset, uri: str, rows_per_piece: int) -> list[ScoringPiece]:
    filesystem, _ = filesystem_for(uri)
    pieces = []
    for fragment in dataset.get_fragments():
        file = file_uri(filesystem, fragment.path)
        if isinstance(fragment, ds.ParquetFileFragment):
            with remote_errors(file):
                found = [piece for piece in row_group_pieces(fragment, file, rows_per_piece) if piece.rows]
        else:
            found = [ScoringPiece(0, file)]
        pieces += found
    for index, piece in enumerate(pieces):
        piece.index = index
    return pieces


def encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def decode_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def measure_row_cost(bundle: Bundle, dataset: ds.Dataset, uri: str) -> RowCost:
    """What a row costs on this machine's CPU core: the first rows read, checked, scored and written
    (to memory), and the model's forward pass on them alone."""
    source = first_file_name(dataset, uri)
    reading, batch = timed(lambda: first_batch(dataset, uri))
    sample = batch.slice(0, SAMPLE_ROWS)
    answers = bundle.predict_numbers if bundle.target.regression else bundle.predict_proba
    answers(sample.slice(0, WARM_UP_ROWS), source)  # the first call pays for lazy set-up
    scoring, answered = timed(lambda: answers(sample, source))  # also checks the rows
    inputs = bundle.model_inputs(sample, source, 0)
    forward, _ = timed(lambda: bundle.logits(inputs))
    writing, _ = timed(lambda: write_to_memory(OutputLayout.of(bundle, dataset.schema), sample, answered))
    rows = sample.num_rows
    return RowCost(
        total=reading / batch.num_rows + (scoring + writing) / rows, model=min(forward, scoring) / rows
    )


def timed(work: Callable[[], T]) -> tuple[float, T]:
    start = time.perf_counter()
    result = work()
    return time.perf_counter() - start, result


def write_to_memory(layout: OutputLayout, batch: pa.RecordBatch, answered: np.ndarray) -> None:
    """`answered`: class probabilities, or a regression's numbers."""
    if answered.ndim == 1:
        rows = layout.number_batch(batch, answered)
    else:
        rows = layout.batch(batch, answered.argmax(axis=1), answered)
    with pq.ParquetWriter(pa.BufferOutputStream(), layout.schema, use_dictionary=layout.dictionary) as writer:
        writer.write_batch(rows)


def first_file_name(dataset: ds.Dataset, uri: str) -> str:
    files = dataset.files
    return uri if len(files) == 1 else f"{uri}: part file {files[0]}"


@contextmanager
def scoring_advice() -> Iterator[None]:
    """A reading error's advice as it applies to scoring: the data is scored, not trained on."""
    try:
        yield
    except DatasetError as error:
        if VALUE_ADVICE not in str(error):
            raise
        raise DatasetError(str(error).replace(VALUE_ADVICE, SCORING_ADVICE)) from error


@scoring_advice()
def plan_scoring(
    model: str,
    dataset: str,
    output: str,
    label_column: str = "",
    rows_per_piece: int = PIECE_ROWS,
    bundle: Bundle | None = None,
    trusted_builders: Sequence[str] = (),
) -> ScoringPlan:
    """Check every input, naming what is wrong, and cut the input into pieces; scores nothing, and
    writes only the output folder's unfinished mark, last. `bundle`: the model, where the caller has
    loaded it already. `trusted_builders`: a user's model builders ("package.module:function") that
    the bundle may name and the scoring may import; the built-ins are always trusted."""
    if not dataset:
        raise DatasetError("no dataset given: name a parquet or CSV file, a folder of part files, or a URI")
    if rows_per_piece < 1:
        raise ValueError(f"rows_per_piece={rows_per_piece} must be at least 1")
    model_uri = resolve_bundle(model)
    bundle = bundle or load_bundle(model_uri, trusted_builders=trusted_builders)
    check_label_column(bundle, label_column, dataset)
    source = open_scoring_dataset(dataset, bundle.input_columns, bundle.encoding)
    label = check_columns(bundle, source.schema, dataset, label_column)
    check_output(output, dataset)
    pieces = list_pieces(source, dataset, rows_per_piece)
    rows = sum(p.rows for p in pieces) if all(p.rows >= 0 for p in pieces) else csv_rows(dataset, source)
    job = ScoringJob(model_uri, dataset, label, encode_schema(source.schema), output, list(trusted_builders))
    row_cost = measure_row_cost(bundle, source, dataset)
    claim_output(output, dataset)
    return ScoringPlan(job, pieces, rows, bundle.manifest.record.framework, row_cost)


def csv_rows(uri: str, dataset: ds.Dataset) -> int:
    """An overestimate of a CSV input's rows, as `describe_input` makes it: a few bytes per value."""
    filesystem, path = filesystem_for(uri)
    with remote_errors(uri):
        size = filesystem.du(path) if filesystem.isdir(path) else filesystem.size(path)
    return max(1, size // (len(dataset.schema.names) * 4))


# ---- reading the input ----------------------------------------------------------------------------------


def open_scoring_dataset(
    uri: str, model_columns: list[str], encoding: FittedEncoding | None = None
) -> ds.Dataset:
    """The table to score: the columns the model reads by training's rules, the others as they are (a
    CSV's as text, so that an id or a zip code keeps every digit, as a CSV's category columns do; a
    parquet column's integer widths widened where parts differ)."""
    read = set(model_columns)
    if detect_format(uri) == "csv":
        categories = [c.name for c in encoding.columns if c.kind == CATEGORICAL] if encoding else []
        return open_dataset(uri, typed_columns=read, column_kinds=dict.fromkeys(categories, CATEGORICAL))
    return widened_passthrough(open_dataset(uri), uri, read)


def widened_passthrough(dataset: ds.Dataset, uri: str, model_columns: set[str]) -> ds.Dataset:
    """Parquet parts whose pass-through column differs in type, read as one type that holds every part's
    values: integer widths widened (int32 and int64: int64), never cast to float for the model's sake."""
    fragments = list(dataset.get_fragments())
    passthrough = [name for name in dataset.schema.names if name not in model_columns]
    if len(fragments) < 2 or not passthrough:
        return dataset
    with remote_errors(uri):
        schemas = [(fragment.path, fragment.physical_schema) for fragment in fragments]
    widened = {
        name: widest_type(name, [(path, schema.field(name).type) for path, schema in schemas], uri)
        for name in passthrough
    }
    schema = pa.schema([(f.name, widened.get(f.name, f.type)) for f in dataset.schema])
    if schema == dataset.schema:
        return dataset
    return ds.dataset(dataset.files, filesystem=dataset.filesystem, format=dataset.format, schema=schema)


def widest_type(name: str, types: list[tuple[str, pa.DataType]], uri: str) -> pa.DataType:
    """One type for a pass-through column across (part, type) pairs, or a refusal naming both parts."""
    try:
        unified = pa.unify_schemas(
            [pa.schema([(name, kind)]) for _, kind in types], promote_options="permissive"
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as error:
        (first_path, first), *rest = types
        path, kind = next(((p, k) for p, k in rest if k != first), (first_path, first))
        raise DatasetError(
            f"{uri}: part file {path}: column '{name}' has type {kind}, but it is {first} in part file "
            f"{first_path}; the two cannot be read as one column"
        ) from error
    return unified.field(name).type


# ---- scoring one piece ----------------------------------------------------------------------------------


def scoring_piece_dataset(job: ScoringJob, piece: ScoringPiece) -> ds.Dataset:
    """The piece's rows, read with the whole input's schema so that every part has the same columns."""
    filesystem, path = filesystem_for(piece.file)
    schema = decode_schema(job.schema)
    with remote_errors(piece.file):
        if detect_format(job.dataset) == "csv":
            header = header_line(pa_fs.PyFileSystem(pa_fs.FSSpecHandler(filesystem)), path)
            file_format = csv_format_of(pa_csv.ParseOptions(delimiter=sniff_delimiter(header)), schema)
        else:
            file_format = parquet_format(remote=not is_local(filesystem))
        whole = ds.dataset([path], schema=schema, format=file_format, filesystem=filesystem)
        (fragment,) = whole.get_fragments()
        if isinstance(fragment, ds.ParquetFileFragment):
            fragments = row_group_fragments(fragment, piece.row_groups)
            return ds.FileSystemDataset(fragments, schema, file_format, whole.filesystem)
    return whole


def scored_batches(
    bundle: Bundle, dataset: ds.Dataset, source: str, first_row: int = 0
) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """Each record batch of `dataset` in file order, with its class probabilities."""
    rows = first_row
    for batch in iter_batches(dataset, source):
        yield batch, bundle.predict_proba(batch, source, rows)
        rows += batch.num_rows


class LabelTally:
    """Counts of (true class, predicted class) over the rows whose label is a class the model knows."""

    def __init__(self, bundle: Bundle, label_column: str):
        self.label_column = label_column
        self.numeric = bundle.manifest.record.label_kind in ("integer", "float")
        self.code_of = {
            label_key(label, self.numeric): code for code, label in enumerate(bundle.class_labels)
        }
        self.confusion = ConfusionCounts(len(bundle.class_labels))
        self.unmatched = 0
        self.examples: list[str] = []

    def add(self, batch: pa.RecordBatch, predicted: np.ndarray, answered: np.ndarray) -> None:
        """`answered`: the rows with a prediction; the others count nowhere."""
        truth = self.codes(batch.column(self.label_column))
        known = truth >= 0
        self.confusion.add(truth[known & answered], predicted[known & answered])
        self.unmatched += int((~known & answered).sum())

    def codes(self, labels: pa.Array) -> np.ndarray:
        """Each row's class code, -1 where the label is missing or not a class of the model. Labels are
        matched as training read them: text trimmed, numbers by value (CSV labels arrive as text)."""
        encoded = pc.dictionary_encode(labels)
        values = encoded.dictionary.to_pylist()
        codes = [self.code_of.get(label_key(value, self.numeric), -1) for value in values]
        for value, code in zip(values, codes, strict=True):
            if code < 0 and len(self.examples) < UNMATCHED_EXAMPLES and repr(value) not in self.examples:
                self.examples.append(shorten(repr(value)))
        lookup = np.array([*codes, -1], dtype=np.int64)  # the last entry: a null label
        return lookup[encoded.indices.fill_null(len(values)).to_numpy(zero_copy_only=False)]

    def result(self) -> tuple[list[list[int]], int, list[str]]:
        return self.confusion.counts.tolist(), self.unmatched, self.examples


def label_key(value: object, numeric: bool) -> str | None:
    """A label as text, the way training named its classes: for a model with numeric classes '3' for
    3, 3.0 and ' 3 '; None when missing."""
    if value is None or value != value:  # null or NaN
        return None
    if isinstance(value, str):
        value = value.strip()
        if not value or not numeric:
            return value or None
        try:
            value = float(value)
        except ValueError:
            return value
    if numeric and isinstance(value, int | float) and not isinstance(value, bool):
        value = float(value)
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def gpu_bundle(uri: str, trusted_builders: Sequence[str] = ()) -> Bundle:
    """The bundle with a torch model moved to the GPU where there is one (its loader feeds the model on
    the model's device); TensorFlow places a Keras model on the GPU itself."""
    bundle = load_bundle(uri, trusted_builders=trusted_builders)
    if bundle.manifest.record.framework == "pytorch":
        import torch

        if torch.cuda.is_available():
            bundle.model.to("cuda")
    return bundle


@contextmanager
def part_writer(
    filesystem: fsspec.AbstractFileSystem, part: str, layout: OutputLayout
) -> Iterator[pq.ParquetWriter]:
    """A parquet writer for one part, which is removed again if scoring it fails."""
    try:
        with (
            filesystem.open(part, "wb") as stream,
            pq.ParquetWriter(stream, layout.schema, use_dictionary=layout.dictionary) as writer,
        ):
            yield writer
    except BaseException:
        if filesystem.exists(part):
            filesystem.rm_file(part)
        raise


class NonFiniteRows:
    """The rows whose model outputs are not finite: how many, and where the first few are."""

    def __init__(self, file: str):
        self.file = PurePosixPath(file).name
        self.count = 0
        self.examples: list[str] = []

    def add(self, answered: np.ndarray, first_row: int) -> None:
        void = np.flatnonzero(~answered)
        self.count += len(void)
        room = NON_FINITE_EXAMPLES - len(self.examples)
        self.examples += [f"{self.file} row {first_row + int(row):,}" for row in void[:room]]


@scoring_advice()
def score_piece(job: ScoringJob, piece: ScoringPiece, bundle: Bundle | None = None) -> PieceResult:
    """Stream one piece through the model into `<output>/part-<index>.parquet`."""
    bundle = bundle or job.bundle()
    if bundle.target.regression:
        return score_numbers(job, piece, bundle)
    dataset = scoring_piece_dataset(job, piece)
    layout = OutputLayout.of(bundle, dataset.schema)
    tally = LabelTally(bundle, job.label_column) if job.label_column else None
    void = NonFiniteRows(piece.file)
    filesystem, part = piece_part(job, piece)
    rows, unseen = 0, UnseenCategories()
    with part_writer(filesystem, part, layout) as writer:
        for batch, probabilities in scored_batches(bundle, dataset, piece.file, piece.first_row):
            unseen = unseen.merge(UnseenCategories.of(bundle.encoding, batch))
            codes, answered = probabilities.argmax(axis=1), finite_rows(probabilities)
            writer.write_batch(layout.batch(batch, codes, probabilities))
            if tally:
                tally.add(batch, codes, answered)
            void.add(answered, piece.first_row + rows)
            rows += batch.num_rows
    confusion, unmatched, examples = tally.result() if tally else ([], 0, [])
    result = PieceResult(piece.index, file_uri(filesystem, part), rows, confusion, unmatched, examples)
    result.non_finite, result.non_finite_examples = void.count, void.examples
    result.unseen = unseen
    return result


def piece_part(job: ScoringJob, piece: ScoringPiece) -> tuple:
    """The output's filesystem and the path of the piece's part file, its folder made."""
    filesystem, folder = filesystem_for(job.output)
    with remote_errors(job.output):
        filesystem.makedirs(folder, exist_ok=True)
    return filesystem, join(folder, f"part-{piece.index:05d}.parquet")


def score_numbers(job: ScoringJob, piece: ScoringPiece, bundle: Bundle) -> PieceResult:
    """`score_piece` for a regression: a `prediction` column, and the sums of its labelled rows' errors."""
    dataset = scoring_piece_dataset(job, piece)
    layout = OutputLayout.of(bundle, dataset.schema)
    void, sums, unmatched = NonFiniteRows(piece.file), RegressionSums(), 0
    filesystem, part = piece_part(job, piece)
    rows, unseen = 0, UnseenCategories()
    with part_writer(filesystem, part, layout) as writer:
        for batch in iter_batches(dataset, piece.file):
            numbers = bundle.predict_numbers(batch, piece.file, piece.first_row + rows)
            unseen = unseen.merge(UnseenCategories.of(bundle.encoding, batch))
            answered = np.isfinite(numbers)
            writer.write_batch(layout.number_batch(batch, numbers))
            if job.label_column:
                actual = label_numbers(batch.column(job.label_column))
                labelled = np.isfinite(actual)
                unmatched += int((~labelled & answered).sum())
                kept = labelled & answered
                sums = sums.merge(RegressionSums.of(actual[kept], numbers[kept], bundle.target.mean))
            void.add(answered, piece.first_row + rows)
            rows += batch.num_rows
    result = PieceResult(piece.index, file_uri(filesystem, part), rows, unmatched=unmatched)
    result.non_finite, result.non_finite_examples = void.count, void.examples
    result.regression = sums if job.label_column else None
    result.unseen = unseen
    return result


def label_numbers(labels: pa.Array) -> np.ndarray:
    """A label column as float64, NaN where it is missing or not a number: text (CSV labels arrive as
    text) is read as numbers one distinct value at a time."""
    if pa.types.is_dictionary(labels.type):
        labels = labels.dictionary_decode()
    if pa.types.is_string(labels.type) or pa.types.is_large_string(labels.type):
        encoded = pc.dictionary_encode(labels)
        values = [text_number(text) for text in encoded.dictionary.to_pylist()]
        lookup = np.array([*values, np.nan])
        return lookup[encoded.indices.fill_null(len(values)).to_numpy(zero_copy_only=False)]
    if not (pa.types.is_integer(labels.type) or pa.types.is_floating(labels.type)):
        return np.full(len(labels), np.nan)
    return pc.fill_null(pc.cast(labels, pa.float64()), np.nan).to_numpy(zero_copy_only=False)


def text_number(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        return np.nan


# ---- a prepared split's metrics ------------------------------------------------------------------------


def split_metrics(
    bundle: Bundle, path: str, label_column: str, class_labels: list[str]
) -> ClassificationMetrics:
    """The metrics of a prepared split (the raw feature columns as the input held them, class codes in
    `label_column`) as the bundle scores it: by `scored_batches`, as scoring the same rows does, streamed
    one row group at a time: memory holds a record batch and the confusion counts. Rows whose outputs are
    not finite are counted and left out, as scoring leaves them out."""
    split = parquet_split(path)
    by_row_group = [part for fragment in split.get_fragments() for part in row_group_fragments(fragment)]
    split = ds.FileSystemDataset(by_row_group, split.schema, split.format, split.filesystem)
    confusion, non_finite = ConfusionCounts(len(class_labels)), 0
    for batch, probabilities in scored_batches(bundle, split, path):
        finite = finite_rows(probabilities)
        non_finite += int((~finite).sum())
        confusion.add(batch.column(label_column).to_numpy()[finite], probabilities[finite].argmax(axis=1))
    return replace(metrics_from_confusion(confusion.counts, class_labels), non_finite_rows=non_finite)


def split_numbers(bundle: Bundle, path: str, label_column: str) -> tuple[np.ndarray, np.ndarray]:
    """A regression's (actual, predicted) on a prepared split (the raw feature columns and the label
    as read), float64, one record batch at a time; a row whose output is not finite predicts NaN."""
    split = parquet_split(path)
    actual, predicted, rows = [], [], 0
    for batch in iter_batches(split, path):
        predicted.append(bundle.predict_numbers(batch, path, rows))
        actual.append(batch.column(label_column).to_numpy(zero_copy_only=False).astype(np.float64))
        rows += batch.num_rows
    return np.concatenate(actual), np.concatenate(predicted)


def regression_split_metrics(bundle: Bundle, actual: np.ndarray, predicted: np.ndarray) -> RegressionMetrics:
    """The figures of `split_numbers`' rows; rows whose output is not finite counted and left out."""
    finite = np.isfinite(predicted)
    return regression_metrics(actual[finite], predicted[finite], bundle.target.mean, int((~finite).sum()))


# ---- the report -----------------------------------------------------------------------------------------


def summarise(
    plan: ScoringPlan,
    results: list[PieceResult],
    hardware: HardwareChoice | None = None,
    bundle: Bundle | None = None,
) -> ScoringReport:
    """The pieces' counts added up; refuses a set of parts that lost or gained rows."""
    results = sorted(results, key=lambda result: result.index)
    if [r.index for r in results] != [p.index for p in plan.pieces]:
        raise RuntimeError(f"{len(results)} parts came back for {len(plan.pieces)} pieces")
    for piece, result in zip(plan.pieces, results, strict=True):
        if piece.rows >= 0 and piece.rows != result.rows:
            raise RuntimeError(
                f"{piece.file}: part {result.part} holds {result.rows:,} rows, not {piece.rows:,}"
            )
    bundle = bundle or plan.job.bundle()
    if bundle.target.regression:
        return summarise_numbers(plan, results, hardware)
    layout = OutputLayout.of(bundle, decode_schema(plan.job.schema))
    labels = [str(label) for label in bundle.class_labels]
    report = ScoringReport(
        model=plan.job.model,
        dataset=plan.job.dataset,
        output=plan.job.output,
        rows=sum(r.rows for r in results),
        pieces=len(results),
        probability_columns=dict(zip(labels, layout.probabilities, strict=True)),
        hardware=hardware,
        non_finite_rows=sum(r.non_finite for r in results),
    )
    if layout.suffixed:
        report.notes.append(
            f"the input already has columns named as this scoring's probabilities; these are in "
            f"{preview([f'{new} (not {old})' for old, new in layout.suffixed.items()])}"
        )
    add_non_finite_note(report, results)
    report.notes += merged_unseen(r.unseen for r in results).notes()
    if plan.job.label_column:
        add_report_metrics(report, results, labels, plan.job.label_column)
    release_output(plan.job.output, keep_parts=True)
    return report


def summarise_numbers(
    plan: ScoringPlan, results: list[PieceResult], hardware: HardwareChoice | None
) -> ScoringReport:
    """A regression's report: its pieces' error sums merged into RMSE, MAE and R², with the train mean's."""
    report = ScoringReport(
        model=plan.job.model,
        dataset=plan.job.dataset,
        output=plan.job.output,
        rows=sum(r.rows for r in results),
        pieces=len(results),
        probability_columns={},
        hardware=hardware,
        non_finite_rows=sum(r.non_finite for r in results),
    )
    add_non_finite_note(report, results)
    report.notes += merged_unseen(r.unseen for r in results).notes()
    label_column = plan.job.label_column
    if label_column:
        if unmatched := sum(r.unmatched for r in results):
            report.notes.append(
                f"{unmatched:,} rows have no number in '{label_column}' (missing or not a number); "
                "the metrics leave them out"
            )
        sums = RegressionSums()
        for result in results:
            sums = sums.merge(result.regression or RegressionSums())
        if sums.rows:
            report.regression = sums.metrics(report.non_finite_rows)
            report.notes += report.regression.notes()
    release_output(plan.job.output, keep_parts=True)
    return report


def add_non_finite_note(report: ScoringReport, results: list[PieceResult]) -> None:
    if report.non_finite_rows:
        examples = [example for result in results for example in result.non_finite_examples]
        report.notes.append(
            f"{report.non_finite_rows:,} rows got model outputs that are not finite numbers (the first: "
            f"{preview(examples[:NON_FINITE_EXAMPLES])}): their prediction and probabilities are null, "
            "and the metrics leave them out"
        )


def add_report_metrics(
    report: ScoringReport, results: list[PieceResult], labels: list[str], label_column: str
) -> None:
    confusion = np.sum([np.array(r.confusion, dtype=np.int64) for r in results], axis=0)
    unmatched = sum(r.unmatched for r in results)
    if unmatched:
        examples = list(dict.fromkeys(e for r in results for e in r.unmatched_examples))
        report.notes.append(
            f"{unmatched:,} rows have a label in '{label_column}' that is missing or not a class of the model "
            f"(e.g. {preview(examples, UNMATCHED_EXAMPLES)}); the metrics leave them out"
        )
    if confusion.sum():
        report.metrics = metrics_from_confusion(confusion, labels)
        report.notes += report.metrics.notes()  # a model no better than the majority class, named


# ---- CPU or GPU -----------------------------------------------------------------------------------------


def check_hardware(hardware: str) -> None:
    if hardware not in HARDWARE:
        raise ValueError(f"hardware={hardware!r} is not one of {', '.join(HARDWARE)}")


def cheapest_whole_gpu(options: list[CatalogEntry]) -> CatalogEntry | None:
    """Scoring considers whole GPUs: a MIG slice scores at its share of the speed for its share of the
    price, so it would only add start-up costs."""
    whole = [entry for entry in options if entry.kind == "gpu"]
    return min(whole, key=lambda entry: entry.price_per_hour) if whole else None


def choose_hardware(
    plan: ScoringPlan, cpu_price_per_hour: float, gpu_options: list[CatalogEntry], hardware: str = "auto"
) -> HardwareChoice:
    """The cheaper of CPU pods and the cheapest whole GPU for the plan's rows at the measured cost per row.

    CPU: the measured core-seconds at the per-core price. GPU: the same with the model's share over
    GPU_MODEL_SPEEDUP, at the GPU's price. Each mapped pod also pays its start. `hardware` "cpu" or
    "gpu" overrides the choice.
    """
    check_hardware(hardware)
    cpu_seconds = plan.rows * plan.row_cost.total
    pieces = len(plan.pieces)
    cpu_cost = (cpu_seconds + pieces * POD_START_SECONDS["cpu"]) * cpu_price_per_hour / 3600
    gpu = cheapest_whole_gpu(gpu_options)
    if gpu is None:
        if hardware == "gpu":
            raise ValueError("hardware='gpu', but the GPU catalog has no whole GPU to score on")
        return HardwareChoice("cpu", cpu_cost, 0.0, None, "no whole GPU in the catalog")
    gpu_seconds = plan.rows * plan.row_cost.on_gpu()
    gpu_cost = (gpu_seconds + pieces * POD_START_SECONDS["gpu"]) * gpu.price_per_hour / 3600
    use_gpu = hardware == "gpu" or (hardware == "auto" and gpu_cost < cpu_cost)
    device = gpu.name if use_gpu else "cpu"
    how = "cheaper" if hardware == "auto" else "asked for"
    reason = (
        f"{how}: {plan.rows:,} rows at {plan.row_cost.total * 1e6:.1f} us/row on a CPU core (the model "
        f"{plan.row_cost.model / plan.row_cost.total:.0%} of it) cost about ${cpu_cost:.4f} on CPU, "
        f"${gpu_cost:.4f} on {gpu.name} ({plan.row_cost.gpu_speedup():.1f}x a core: the model "
        f"{GPU_MODEL_SPEEDUP:g}x faster there, the rest as fast)"
    )
    return HardwareChoice(device, cpu_cost, gpu_cost, gpu, reason)


# ---- all in one process ---------------------------------------------------------------------------------


def score_dataset(
    model: str,
    dataset: str,
    output: str,
    label_column: str = "",
    rows_per_piece: int = PIECE_ROWS,
    trusted_builders: Sequence[str] = (),
) -> ScoringReport:
    """Score `dataset` with the bundle (or latest published bundle) `model` into parquet parts under
    `output`, piece after piece in this process. A failure removes the parts it wrote."""
    model = resolve_bundle(model)
    bundle = load_bundle(model, trusted_builders=trusted_builders)
    plan = plan_scoring(model, dataset, output, label_column, rows_per_piece, bundle, trusted_builders)
    try:
        results = [score_piece(plan.job, piece, bundle) for piece in plan.pieces]
        return summarise(plan, results, bundle=bundle)
    except BaseException:
        release_output(output, keep_parts=False)  # a failed scoring leaves no parts
        raise
