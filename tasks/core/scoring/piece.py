"""Scoring one piece: its rows streamed through the bundle into its own part of the output, the labels
tallied where the input holds them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import PurePosixPath

import fsspec.implementations.local
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.dataset as ds
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq

from tasks.core.bundle.loading import Bundle, finite_rows, load_bundle, scored_batches
from tasks.core.data.api import (
    UnseenCategories,
    csv_format_of,
    detect_format,
    filesystem_for,
    header_line,
    is_local,
    iter_batches,
    parquet_format,
    remote_errors,
    row_group_fragments,
    sniff_delimiter,
)
from tasks.core.evaluation.metrics import ConfusionCounts, RegressionSums
from tasks.core.messages import shorten
from tasks.core.publish.versions import join
from tasks.core.scoring.output import OutputLayout
from tasks.core.scoring.plan import decode_schema, file_uri, scoring_advice
from tasks.core.scoring.records import (
    NON_FINITE_EXAMPLES,
    UNMATCHED_EXAMPLES,
    PieceResult,
    ScoringJob,
    ScoringPiece,
)

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
