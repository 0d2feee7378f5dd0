"""Planning a scoring: every input checked before anything is scored, the output folder claimed, the
input cut into pieces and opened, the cost of a row measured."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import PurePosixPath

import fsspec.implementations.local
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from tasks.core.bundle.loading import Bundle, load_bundle
from tasks.core.data.api import (
    VALUE_ADVICE,
    DatasetError,
    FittedEncoding,
    detect_format,
    filesystem_for,
    first_batch,
    is_local,
    kind_values,
    open_dataset,
    remote_errors,
)
from tasks.core.messages import LINE_CHARS, preview, shorten
from tasks.core.publish.versions import join, resolve_bundle
from tasks.core.scoring.output import OutputLayout
from tasks.core.scoring.records import (
    PART_NAME,
    PIECE_ROWS,
    PREDICTION,
    SAMPLE_ROWS,
    SCORING_ADVICE,
    UNFINISHED,
    WARM_UP_ROWS,
    RowCost,
    ScoringJob,
    ScoringPiece,
    ScoringPlan,
    T,
)

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
    CSV's as text, so that an id or a zip code keeps every digit, as a CSV's category and text columns do; a
    parquet column's integer widths widened where parts differ)."""
    read = set(model_columns)
    if detect_format(uri) == "csv":
        as_text = (
            {c.name: c.kind for c in encoding.columns if kind_values.csv_reads_as_text(c.kind)}
            if encoding
            else {}
        )
        return open_dataset(uri, typed_columns=read, column_kinds=as_text)
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
