"""Loading, validating, splitting and standardising a tabular classification dataset.

Inputs are streamed in pyarrow record batches: only the label column, one byte of split
assignment per row and one batch of features are in memory at a time, so memory does not
grow with the width of the file.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
import tempfile
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

import fsspec
import fsspec.implementations.local
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.dataset as ds
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq

from tasks.core.config import SplitPaths
from tasks.core.messages import LINE_CHARS, one_line, preview, shorten
from tasks.core.moments import FeatureMoments

FORMATS_BY_SUFFIX = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
COMPRESSED_SUFFIXES = {".gz", ".bz2", ".zst"}
UNNAMED_FORMAT = "no format in the name"
SPLITS = ("train", "val", "test")
# The split kept as raw feature values: evaluation scores it through the model bundle's loader, as a
# user scores the original rows; the others are standardised for the training loops.
RAW_SPLIT = "test"
BATCH_ROWS = 65_536
# The prepared splits' row groups, at most: a training rank reads its part a row group at a time and
# the streamed epoch shuffles row groups, so small ones bound what two neighbouring ranks both decode
# (the one straddling their ranges) and mix the stream finely.
SPLIT_ROW_GROUP_ROWS = 16_384
# Batches decoded ahead of the one in use: bounds memory (pyarrow reads 16 ahead by default).
READAHEAD_BATCHES = 2
EMBEDDED_DIGITS_LABEL = "label"
CSV_DELIMITERS = ",;\t|"
HEADER_BYTES = 1 << 20
# The CSV text parsed at once: pyarrow cannot read a line longer than this. Column types are
# guessed from a first block of pyarrow's default size.
CSV_BLOCK_BYTES, GUESS_BLOCK_BYTES = 16 << 20, 1 << 20
CASE_WARNINGS = 5
FIRST_ROWS = 5  # of a feature's bad values, the rows an error lists
# A label column's kind, by its numpy dtype's kind (any other is "string"), and how the text of its
# class labels turns back into its values.
LABEL_KINDS = {"i": "integer", "u": "integer", "f": "float", "b": "boolean"}
NUMBER_TYPES_BY_KIND = {"integer": (pa.int64(),), "float": (pa.float64(),)}
NUMBER_TYPES = (pa.int64(), pa.float64())  # tried in turn on CSV labels: see `clean_labels`
LABEL_PARSERS = {"string": str, "integer": int, "float": float, "boolean": lambda text: text == "True"}
# pyarrow's CSV errors number columns from 0 and rows as lines of the file, header included.
CSV_COLUMN_ERROR = re.compile(r"In CSV column #(\d+): (?:Row #(\d+): )?(.*)", re.DOTALL)
LONG_LINE_ERROR = "straddling object straddles two block boundaries"
CSV_NOT_A_NUMBER = re.compile(r"CSV conversion error to \w+: invalid value '(.*)'", re.DOTALL)
# A header cell left empty: read as '' by pyarrow, or as 'Unnamed: 0' when pandas wrote it back.
UNNAMED_COLUMN = re.compile(r"|Unnamed: \d+")


class DatasetError(ValueError):
    """Input data that cannot be used; the message names the file, the column and the problem."""


# Each held-out split needs rows, and training keeps the most of them.
FRACTION_RULE = "must be between 0 and 0.5 (exclusive)"


def bad_fractions(val_fraction: float, test_fraction: float) -> dict[str, float]:
    """The held-out fractions that break `FRACTION_RULE`, by name."""
    fractions = {"val_fraction": val_fraction, "test_fraction": test_fraction}
    return {name: value for name, value in fractions.items() if not 0.0 < value < 0.5}


@dataclass
class SplitConfig:
    val_fraction: float = 0.15
    test_fraction: float = 0.15
    seed: int = 0

    def __post_init__(self) -> None:
        for name, value in bad_fractions(self.val_fraction, self.test_fraction).items():
            raise DatasetError(f"{name}={value} {FRACTION_RULE}")


@dataclass
class ScalerStats:
    """Per-feature standardisation fitted on the training split: x' = (x - mean) / scale."""

    mean: list[float]
    scale: list[float]


def standardise(raw: np.ndarray, scaler: ScalerStats) -> np.ndarray:
    """Raw float64 features as the model's float32 input: computed in float64, cast once, so the
    prepared splits and the bundle's loader give the model bit-identical rows."""
    scaled = raw - np.asarray(scaler.mean, dtype=np.float64)
    scaled /= np.asarray(scaler.scale, dtype=np.float64)
    with np.errstate(over="ignore"):  # a value beyond float32 becomes inf: check_standardised names it
        return scaled.astype(np.float32)


@dataclass
class PreparedTable:
    """What the prepared splits hold. The splits written here (`PreparedSplits`) and the task
    boundary's `PreparedData` both carry it as it is."""

    feature_names: list[str]  # in the order the model reads them
    label_column: str  # holds class codes into `class_labels`
    class_labels: list[str]
    class_counts: dict[str, int]
    rows: dict[str, int]  # by split
    scaler: ScalerStats  # fitted on the train split
    source: str = ""  # the input, as reports name it
    label_kind: str = "string"  # what the class labels were before they became text: see LABEL_KINDS
    notes: list[str] = field(default_factory=list)  # e.g. case-only class differences, columns left out

    def split_paths(self, train: str, val: str) -> SplitPaths:
        """The train and val splits at these paths, as the training loops read them."""
        return SplitPaths(train, val, self.feature_names, self.label_column, len(self.class_labels))


@dataclass
class PreparedSplits:
    """Where the prepared splits were written, and what they hold."""

    paths: dict[str, str]  # by split
    table: PreparedTable

    def split_paths(self) -> SplitPaths:
        return self.table.split_paths(self.paths["train"], self.paths["val"])


def detect_format(uri: str) -> str:
    """A file's format from its name; a folder's from the names of its part files, whatever its own."""
    filesystem, path = filesystem_for(uri)
    with remote_errors(uri):
        if filesystem.isdir(path):
            return folder_format(uri, part_files(filesystem, path))
    if found := format_by_name(uri):
        return found
    raise DatasetError(
        f"{uri}: cannot tell the file format from its name; use one of {', '.join(sorted(FORMATS_BY_SUFFIX))}"
    )


def format_by_name(name: str) -> str | None:
    """'parquet' or 'csv' from a name's suffixes, compressed ones included (data.csv.gz); else None."""
    suffixes = [s.lower() for s in PurePosixPath(name.rstrip("/")).suffixes]
    for suffix in reversed(suffixes):
        if suffix in FORMATS_BY_SUFFIX:
            return FORMATS_BY_SUFFIX[suffix]
    if len(suffixes) > 1 and suffixes[-1] in COMPRESSED_SUFFIXES:
        return format_by_name(name.rstrip("/").rsplit(".", 1)[0])
    return None


def folder_format(uri: str, files: list[str]) -> str:
    """The one format of a folder's part files; files named without a format take the folder's name's
    (as Hadoop writes part-00000). A folder mixing formats is refused, naming a file of each."""
    if not files:
        raise DatasetError(f"{uri}: the directory holds no data files with rows")
    by_format = {format_by_name(file) or format_by_name(uri) or UNNAMED_FORMAT: file for file in files}
    if len(by_format) > 1:
        named = " and ".join(f"{kind} ({file})" for kind, file in sorted(by_format.items()))
        raise DatasetError(f"{uri}: the folder mixes file formats: {named}; keep one format per folder")
    (kind,) = by_format
    if kind == UNNAMED_FORMAT:
        raise DatasetError(
            f"{uri}: cannot tell the format of its part files (e.g. {files[0]}) from their names; "
            f"name them with one of {', '.join(sorted(FORMATS_BY_SUFFIX))}"
        )
    return kind


@contextmanager
def remote_errors(uri: str) -> Iterator[None]:
    """Any failure to reach the input (no credentials, no network) as one line naming it and the cause."""
    try:
        yield
    except (DatasetError, MemoryError):
        raise
    except FileNotFoundError as err:
        # Some filesystems (HTTP) report an unreachable host as a missing file; the cause says which.
        cause = err.__cause__
        if cause is None or isinstance(cause, FileNotFoundError):
            raise DatasetError(f"{uri}: no such file or directory") from err
        raise DatasetError(f"cannot read {uri}: {one_line(cause)}") from err
    except Exception as err:  # each filesystem raises its own types (botocore, aiohttp, google-auth, ...)
        raise DatasetError(f"cannot read {uri}: {one_line(err)}") from err


def filesystem_for(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    with remote_errors(uri):
        try:
            return fsspec.core.url_to_fs(uri)
        except (ValueError, ImportError) as err:  # unknown protocol, or its filesystem package is missing
            raise DatasetError(f"{uri}: cannot open this URI: {err}") from err


def is_local(filesystem: fsspec.AbstractFileSystem) -> bool:
    return isinstance(filesystem, fsspec.implementations.local.LocalFileSystem)


def row_group_fragments(
    fragment: ds.ParquetFileFragment, groups: list[int] | None = None
) -> list[ds.Fragment]:
    """One fragment per row group (of all, or of `groups`): pyarrow decodes ahead within a fragment as
    far as a slower consumer lets it, so a fragment as large as a file would hold most of it in memory."""
    groups = groups or [group.id for group in fragment.row_groups]
    return [fragment.subset(row_group_ids=[group]) for group in groups]


def parquet_format(remote: bool = False) -> ds.ParquetFileFormat:
    """Pre-buffering reads whole row groups at once: fewer requests to an object store, but on a
    local disk it holds most of a file in memory, so it is used for remote files only."""
    options = ds.ParquetFragmentScanOptions(pre_buffer=remote)
    return ds.ParquetFileFormat(default_fragment_scan_options=options)


def part_files(filesystem: fsspec.AbstractFileSystem, directory: str) -> list[str]:
    """A directory's data files in the order they are read: as pyarrow does, names starting with '.'
    or '_' are not data (Spark's _SUCCESS and _temporary/); a 0-byte file holds no rows (an empty
    partition)."""
    found = filesystem.find(directory, detail=True)
    return sorted(
        name for name, info in found.items() if not is_hidden(name, directory) and info.get("size") != 0
    )


def is_hidden(file: str, directory: str) -> bool:
    """Whether a file lies under a name, within `directory`, that starts with '.' or '_'."""
    inside = (
        file.removeprefix(directory.rstrip("/")) if file.startswith(directory) else PurePosixPath(file).name
    )
    return any(part.startswith((".", "_")) for part in PurePosixPath(inside).parts if part != "/")


def header_line(filesystem: pa_fs.FileSystem, file: str) -> str:
    with filesystem.open_input_stream(file, compression="detect") as stream:
        head = stream.read(HEADER_BYTES)
    lines = head.decode("utf-8", errors="replace").splitlines()
    return lines[0] if lines else ""


def sniff_delimiter(header: str) -> str:
    """The header's delimiter among comma, semicolon, tab and pipe; a comma when it cannot tell."""
    try:
        return csv.Sniffer().sniff(header, delimiters=CSV_DELIMITERS).delimiter
    except csv.Error:  # a single column, or no header at all
        return ","


def is_number_or_null(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_null(kind)


def is_number(kind: pa.DataType) -> bool:
    """A type a feature may have: decimals are read as float64 (see `batch_features`)."""
    return (
        pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_decimal(kind)
    )


def guessed_schema(
    filesystem: fsspec.AbstractFileSystem, source: str | list[str], parse: pa_csv.ParseOptions, text: dict
) -> pa.Schema:
    """The column types pyarrow guesses from the first block: a block of pyarrow's default size, so
    a value that breaks the guess further down is named with its line when converted; a larger one
    when the first rows are longer than that."""
    convert = pa_csv.ConvertOptions(column_types=text)

    def guess(block: int) -> pa.Schema:
        read = pa_csv.ReadOptions(block_size=block)
        options = ds.CsvFileFormat(parse_options=parse, read_options=read, convert_options=convert)
        return ds.dataset(source, filesystem=filesystem, format=options).schema

    try:
        return guess(GUESS_BLOCK_BYTES)
    except pa.ArrowInvalid as err:
        if LONG_LINE_ERROR not in str(err):
            raise
    return guess(CSV_BLOCK_BYTES)


def csv_format(
    filesystem: fsspec.AbstractFileSystem, path: str, is_dir: bool, label_column: str | None
) -> ds.CsvFileFormat:
    source = part_files(filesystem, path) if is_dir else path
    return csv_format_and_schema(filesystem, source, label_column)[0]


def csv_format_and_schema(
    filesystem: fsspec.AbstractFileSystem, source: str | list[str], label_column: str | None
) -> tuple[ds.CsvFileFormat, pa.Schema]:
    """CSV options for this file: its delimiter, the label read as text and numeric columns as floats;
    and the schema they give, so that opening the dataset reads no block of the large size.

    pyarrow guesses column types from the first block only, so a column of integers holding 0.5
    further down would fail to convert; reading every numeric column as float64 avoids that. A text
    label keeps 'NA' or 'NULL' as classes: only an empty cell is missing.
    """
    first = source[0] if isinstance(source, list) else source
    header = header_line(pa_fs.PyFileSystem(pa_fs.FSSpecHandler(filesystem)), first)
    parse = pa_csv.ParseOptions(delimiter=sniff_delimiter(header))
    read = pa_csv.ReadOptions(block_size=CSV_BLOCK_BYTES)
    text = {label_column: pa.string()} if label_column else {}
    guessed = guessed_schema(filesystem, source, parse, text)
    numbers = {f.name: pa.float64() for f in guessed if f.name not in text and is_number_or_null(f.type)}
    types = {**numbers, **text}
    convert = pa_csv.ConvertOptions(column_types=types)
    schema = pa.schema([(f.name, types.get(f.name, f.type)) for f in guessed])
    return ds.CsvFileFormat(parse_options=parse, read_options=read, convert_options=convert), schema


def open_dataset(uri: str, label_column: str | None = None) -> ds.Dataset:
    """Open a local path or fsspec URI (s3://, gs://, ...) as a lazily-read pyarrow dataset.

    `label_column` matters for CSV only: it is read as text (see `csv_format`).
    """
    file_format = detect_format(uri)
    filesystem, path = filesystem_for(uri)
    with remote_errors(uri):
        info = filesystem.info(path)
    is_dir = info.get("type") == "directory"
    if not is_dir and info.get("size") == 0:
        raise DatasetError(f"{uri}: the file is empty (0 bytes)")
    remote = not is_local(filesystem)
    with remote_errors(uri):
        source = part_files(filesystem, path) if is_dir else path  # a folder has some: `detect_format`
        try:
            if file_format == "csv":
                pa_format, schema = csv_format_and_schema(filesystem, source, label_column)
            else:
                pa_format, schema = parquet_format(remote=remote), None
            whole = ds.dataset(source, filesystem=filesystem, format=pa_format, schema=schema)
            dataset = consistent_parts(whole, uri)
            if not has_rows(dataset, uri):
                raise DatasetError(f"{uri}: the dataset has no rows")
        except pa.ArrowException as err:
            if LONG_LINE_ERROR in str(err):  # in the first block, read to guess the column types
                first = source[0] if isinstance(source, list) else source
                handler = pa_fs.PyFileSystem(pa_fs.FSSpecHandler(filesystem))
                raise DatasetError(long_line_message(handler, first, part_name(uri, first))) from err
            raise DatasetError(f"{uri}: cannot be read as {file_format}: {one_line(err)}") from err
    return dataset


def has_rows(dataset: ds.Dataset, uri: str) -> bool:
    """Parquet knows its row count from the footers; CSV must parse its first batch to tell."""
    if not isinstance(dataset.format, ds.CsvFileFormat):
        return dataset.count_rows() > 0
    return any(batch.num_rows for batch in iter_batches(dataset, uri))


def part_name(uri: str, file: str) -> str:
    """`uri` itself, or `uri` and the part file when `uri` is a directory."""
    same = PurePosixPath(file).name == PurePosixPath(uri.rstrip("/")).name
    return uri if same else f"{uri}: part file {file}"


def csv_header(dataset: ds.Dataset, file: str) -> list[str]:
    line = header_line(dataset.filesystem, file)
    return next(csv.reader([line], delimiter=dataset.format.parse_options.delimiter), [])


def csv_error_message(err: pa.ArrowException, dataset: ds.Dataset, file: str, uri: str) -> str:
    """pyarrow's 'In CSV column #3: Row #9: ...' with the file and the column's name instead."""
    source = part_name(uri, file)
    if LONG_LINE_ERROR in str(err):
        return long_line_message(dataset.filesystem, file, source)
    match = CSV_COLUMN_ERROR.search(str(err))
    if not match:
        return f"{source}: unreadable data: {one_line(err)}"
    index, line, detail = int(match[1]), match[2], match[3]
    names = csv_header(dataset, file)
    column = repr(names[index]) if index < len(names) else f"number {index + 1}"
    where = f" at line {int(line):,}" if line else ""
    value = CSV_NOT_A_NUMBER.match(detail)
    if not value:
        return f"{source}: column {column}{where}: {shorten(detail, LINE_CHARS)}"
    hint = " (numbers must use '.' as the decimal point)" if "," in value[1] else ""
    return (
        f"{source}: column {column} holds {shorten(repr(value[1]))}{where}, not a number{hint}; "
        "encode it numerically or drop it before training"
    )


def long_line_message(filesystem: pa_fs.FileSystem, file: str, source: str) -> str:
    limit = CSV_BLOCK_BYTES
    where = ""
    if found := first_long_line(filesystem, file, limit):
        where = f" (line {found[0]:,} has {found[1]:,} bytes)"
    return (
        f"{source}: a line is longer than the {limit:,} bytes a CSV row may have{where}; "
        "store data with rows this long as parquet"
    )


def first_long_line(filesystem: pa_fs.FileSystem, file: str, limit: int) -> tuple[int, int] | None:
    """The number (from 1) and length in bytes of the file's first line longer than `limit`."""
    number, length = 1, 0
    with filesystem.open_input_stream(file, compression="detect") as stream:
        while chunk := stream.read(HEADER_BYTES):
            *ended, rest = chunk.split(b"\n")
            for piece in ended:
                if length + len(piece) > limit:
                    return number, length + len(piece)
                number, length = number + 1, 0
            length += len(rest)
    return (number, length) if length > limit else None


@contextmanager
def data_errors(dataset: ds.Dataset, file: str, uri: str) -> Iterator[None]:
    """A value that cannot be read, named by its file and column."""
    try:
        yield
    except pa.ArrowException as err:
        if isinstance(dataset.format, ds.CsvFileFormat):
            raise DatasetError(csv_error_message(err, dataset, file, uri)) from err
        raise DatasetError(f"{part_name(uri, file)}: unreadable data: {one_line(err)}") from err


def column_kind(kind: pa.DataType) -> str:
    if is_number(kind):
        return "number"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "text"
    return str(kind)


def unified_type(name: str, types: list[tuple[str, pa.DataType]], uri: str) -> pa.DataType:
    """One type for a column across (file, type) pairs: numbers that differ are read as float64."""
    typed = [(file, kind) for file, kind in types if not pa.types.is_null(kind)]
    if not typed:
        return pa.null()
    base_file, base_type = typed[0]
    for file, kind in typed[1:]:
        if column_kind(kind) != column_kind(base_type):
            raise DatasetError(
                f"{uri}: part file {file}: column '{name}' has type {kind}, but it is {base_type} "
                f"in part file {base_file}"
            )
    if all(kind == base_type for _, kind in typed) or column_kind(base_type) != "number":
        return base_type
    return pa.float64()


def check_same_columns(uri: str, first: tuple[str, list[str]], part: tuple[str, list[str]]) -> None:
    (first_path, expected), (path, names) = first, part
    missing = [repr(n) for n in expected if n not in names]
    extra = [repr(n) for n in names if n not in expected]
    if missing or extra:
        differences = [
            f"{label} {preview(columns)}"
            for label, columns in (("lacks", missing), ("adds", extra))
            if columns
        ]
        raise DatasetError(
            f"{uri}: part file {path} has other columns than part file {first_path}: it "
            + " and ".join(differences)
        )


def consistent_parts(dataset: ds.Dataset, uri: str) -> ds.Dataset:
    """The parts of a directory must have the same columns; numeric types may differ between them.
    A parquet part with no rows is left out: Spark and Dask write one per empty partition, some
    without the columns."""
    fragments = list(dataset.get_fragments())
    if isinstance(dataset.format, ds.ParquetFileFormat) and len(fragments) > 1:
        fragments = [f for f in fragments if part_rows(dataset, f, uri)] or fragments[:1]
        if len(fragments) == 1:
            return ds.dataset(fragments[0].path, filesystem=dataset.filesystem, format=dataset.format)
    if len(fragments) < 2:
        return dataset
    schemas = []
    for fragment in fragments:
        with data_errors(dataset, fragment.path, uri):
            schemas.append((fragment.path, fragment.physical_schema))
    first_path, first = schemas[0]
    for path, schema in schemas[1:]:
        check_same_columns(uri, (first_path, first.names), (path, schema.names))
    unified = pa.schema(
        [
            (name, unified_type(name, [(p, s.field(name).type) for p, s in schemas], uri))
            for name in first.names
        ]
    )
    files = [f.path for f in fragments]
    return ds.dataset(files, filesystem=dataset.filesystem, format=dataset.format, schema=unified)


def part_rows(dataset: ds.Dataset, fragment: ds.ParquetFileFragment, uri: str) -> int:
    with data_errors(dataset, fragment.path, uri):
        return fragment.metadata.num_rows


def iter_batches(dataset: ds.Dataset, uri: str, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Record batches in file order (the split assignment relies on a stable row order)."""
    for fragment in dataset.get_fragments():
        with remote_errors(uri), data_errors(dataset, fragment.path, uri):
            yield from fragment.to_batches(
                schema=dataset.schema,
                columns=columns,
                batch_size=BATCH_ROWS,
                batch_readahead=READAHEAD_BATCHES,
            )


def pandas_index_columns(dataset: ds.Dataset) -> list[str]:
    """The columns a parquet file's pandas metadata names as the saved index (a RangeIndex is
    stored as metadata only, so it names no column)."""
    if not isinstance(dataset.format, ds.ParquetFileFormat):
        return []
    fragment = next(dataset.get_fragments(), None)
    metadata = (fragment.physical_schema.pandas_metadata if fragment else None) or {}
    return [name for name in metadata.get("index_columns", []) if isinstance(name, str)]


def unnamed_column_notes(dataset: ds.Dataset, uri: str, names: list[str]) -> dict[str, str]:
    """Unnamed columns that are not features: all empty (lines that end with a delimiter), or the
    first column with a distinct value in every row (the row index `to_csv` writes by default)."""
    chunks: dict[str, list[pa.Array]] = {name: [] for name in names}
    for batch in iter_batches(dataset, uri, columns=names):
        for name in names:
            chunks[name].append(batch.column(name))
    notes = {}
    for name in names:
        column = pa.chunked_array(chunks[name], type=dataset.schema.field(name).type)
        if column.null_count == len(column):
            notes[name] = (
                f"column {name!r} has no name and no values (the lines end with a delimiter); "
                "it is left out of the features"
            )
        elif name == dataset.schema.names[0] and is_row_label(column):
            notes[name] = (
                f"column {name!r} looks like a row index saved with the data (an unnamed first column "
                "with a distinct value in every row); it is left out of the features. Write the file "
                "with index=False, or name the column if it is a feature"
            )
    return notes


def is_row_label(column: pa.ChunkedArray) -> bool:
    return column.null_count == 0 and pc.count_distinct(column).as_py() == len(column)


def non_feature_columns(dataset: ds.Dataset, uri: str, label_column: str) -> dict[str, str]:
    """Columns that are not features, each with the note that says why: a pandas index saved with
    the data would predict the class wherever rows are stored in label order."""
    notes = {
        name: (
            f"column {name!r} is the pandas index saved with the data (the file's pandas metadata says "
            "so); it is left out of the features"
        )
        for name in pandas_index_columns(dataset)
    }
    unnamed = [n for n in dataset.schema.names if UNNAMED_COLUMN.fullmatch(n) and n not in notes]
    if unnamed:
        notes.update(unnamed_column_notes(dataset, uri, unnamed))
    notes.pop(label_column, None)
    return notes


def feature_columns(
    schema: pa.Schema, label_column: str, uri: str, left_out: Collection[str] = ()
) -> list[str]:
    """All columns except the label and those `left_out`; each must be numeric."""
    if label_column not in schema.names:
        raise DatasetError(
            f"{uri}: label column '{label_column}' not found in the {len(schema.names):,} columns: "
            f"{preview(schema.names)}"
        )
    features = [name for name in schema.names if name != label_column and name not in left_out]
    if not features:
        raise DatasetError(f"{uri}: no feature columns besides the label column '{label_column}'")
    check_numeric(schema, features, uri, "encode it numerically or drop it before training")
    return features


def check_numeric(schema: pa.Schema, features: list[str], uri: str, fix: str) -> None:
    """Features are integers, floats, decimals or booleans; `fix` says what to do about any other type."""
    for name in features:
        kind = schema.field(name).type
        if not is_number(kind):
            raise DatasetError(f"{uri}: feature column '{name}' has type {kind}, not a number; {fix}")


def check_finite(batch: pa.RecordBatch | pa.Table, features: list[str], first_row: int, uri: str) -> None:
    """No missing or non-finite feature value; an error names the column and its first bad rows."""
    for name in features:
        column = batch.column(name)
        if column.null_count:
            rows = first_row + bad_rows(pc.is_null(column))
            what = "a missing value" if len(rows) == 1 else "missing values"
            raise DatasetError(f"{uri}: feature column '{name}' has {what} (NaN/null) {at_rows(rows)}")
        if pa.types.is_floating(column.type):
            bad = pc.invert(pc.is_finite(column))
            if pc.any(bad).as_py():
                rows = first_row + bad_rows(bad)
                value = column[int(rows[0]) - first_row].as_py()
                what = (
                    f"a non-finite value {value}" if len(rows) == 1 else f"non-finite values (first {value})"
                )
                raise DatasetError(f"{uri}: feature column '{name}' has {what} {at_rows(rows)}")


def bad_rows(mask: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return pc.indices_nonzero(mask).to_numpy().astype(np.int64)


def at_rows(rows: np.ndarray) -> str:
    if len(rows) == 1:
        return f"at row {rows[0]}"
    more = ", ..." if len(rows) > FIRST_ROWS else ""
    return f"at rows {', '.join(map(str, rows[:FIRST_ROWS]))}{more}"


def scan_labels(dataset: ds.Dataset, uri: str, label_column: str, features: list[str]) -> pa.ChunkedArray:
    """Validate every feature batch and return the label column (the only column kept in memory)."""
    label_chunks = []
    rows = 0
    for batch in iter_batches(dataset, uri):
        check_finite(batch, features, rows, uri)
        label_chunks.append(batch.column(label_column))
        rows += batch.num_rows
    if rows == 0:
        raise DatasetError(f"{uri}: the dataset has no rows")
    return pa.chunked_array(label_chunks, type=dataset.schema.field(label_column).type)


def as_numbers(labels: pa.ChunkedArray, kinds: tuple[pa.DataType, ...] = NUMBER_TYPES) -> pa.ChunkedArray:
    """Text labels that are all integers (or all numbers) as int64 (float64), else unchanged."""
    for kind in kinds:
        try:
            return pc.cast(labels, kind)
        except pa.ArrowInvalid:
            continue
    return labels


def refuse_missing_labels(labels: pa.ChunkedArray, uri: str, label_column: str) -> None:
    """A label that is null, NaN or empty text is missing: refuse it rather than train it as a class."""
    missing = pc.is_null(labels, nan_is_null=True)
    if pa.types.is_string(labels.type) or pa.types.is_large_string(labels.type):
        missing = pc.or_(missing, pc.fill_null(pc.equal(labels, ""), True))
    rows = np.flatnonzero(missing.to_numpy(zero_copy_only=False))
    what = f"{uri}: label column '{label_column}'"
    if len(rows) == 1:
        raise DatasetError(f"{what} has a missing value (empty, null or NaN) at row {rows[0]}")
    if len(rows):
        raise DatasetError(
            f"{what} has {len(rows):,} missing values (empty, null or NaN) at rows {preview(rows)}"
        )


def clean_labels(
    labels: pa.ChunkedArray, uri: str, label_column: str, from_csv: bool, kind: str | None = None
) -> np.ndarray:
    """Labels as classes: text stripped of surrounding whitespace, and missing labels refused.

    CSV labels are read as text; a column of numbers among them is read back as numbers, so
    digits 0-9 sort as numbers and a float label 'nan' counts as missing. Labels that are some rows
    of an input pass its `kind` (`label_kind`): their text is read as the whole column's values are.
    """
    if pa.types.is_dictionary(labels.type):
        labels = pc.cast(labels, labels.type.value_type)
    if pa.types.is_string(labels.type) or pa.types.is_large_string(labels.type):
        labels = pc.utf8_trim_whitespace(labels)
        if from_csv:
            labels = as_numbers(labels, NUMBER_TYPES if kind is None else NUMBER_TYPES_BY_KIND.get(kind, ()))
    refuse_missing_labels(labels, uri, label_column)
    return labels.to_numpy()


def label_kind(labels: np.ndarray) -> str:
    """What the labels are, before they become text: integer, float, boolean, or string for the rest."""
    return LABEL_KINDS.get(labels.dtype.kind, "string")


def typed_labels(class_labels: list[str], kind: str) -> list:
    """The class labels as the values the label column held: "3" is 3 for integer labels."""
    if kind not in LABEL_PARSERS:
        raise ValueError(f"unknown label kind {kind!r}, not one of {', '.join(LABEL_PARSERS)}")
    return [LABEL_PARSERS[kind](label) for label in class_labels]


def encode_labels(labels: np.ndarray, uri: str, label_column: str) -> tuple[np.ndarray, list[str]]:
    classes, codes = np.unique(labels, return_inverse=True)
    if len(classes) < 2:
        raise DatasetError(
            f"{uri}: label column '{label_column}' has a single class ({shorten(repr(classes[0]))}); "
            "classification needs at least 2"
        )
    return codes.astype(np.int64), [str(c) for c in classes]


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
    """Classes that are all numbers, some of them fractional: a regression target, not classes."""
    try:
        values = [float(label) for label in class_labels]
    except ValueError:
        return False
    return any(not value.is_integer() for value in values)


def check_split_sizes(
    codes: np.ndarray, class_labels: list[str], split: SplitConfig, uri: str, label_column: str
) -> None:
    counts = np.bincount(codes, minlength=len(class_labels))
    too_rare = [
        f"{shorten(repr(class_labels[i]))} ({counts[i]} rows)" for i in np.flatnonzero(counts < len(SPLITS))
    ]
    hint = ""
    if looks_continuous(class_labels):
        hint = (
            f"; label column '{label_column}' looks continuous ({len(class_labels):,} distinct numbers), "
            "but mixedml trains classifiers: the label must be a column of classes"
        )
    if too_rare:
        raise DatasetError(
            f"{uri}: too few rows for a stratified train/val/test split: {len(too_rare):,} of "
            f"{len(class_labels):,} classes have fewer than {len(SPLITS)} rows: {preview(too_rare)}{hint}"
        )
    for name, rows in split_rows(len(codes), split).items():
        if rows < len(class_labels):
            fix = "lower val_fraction or test_fraction" if name == "train" else f"raise {name}_fraction"
            raise DatasetError(
                f"{uri}: too few rows for the split: {split_setting(codes, class_labels, split)} leave "
                f"{rows} {name} rows for {len(class_labels):,} classes; each split needs a row of every "
                f"class: add rows or {fix}{hint}"
            )


def split_setting(codes: np.ndarray, class_labels: list[str], split: SplitConfig) -> str:
    counts = np.bincount(codes, minlength=len(class_labels))
    by_class = preview([f"{label!r}: {n}" for label, n in zip(class_labels, counts, strict=True)])
    return (
        f"{len(codes)} rows (per class: {by_class}) with val_fraction={split.val_fraction} "
        f"and test_fraction={split.test_fraction}"
    )


def checked_assignment(
    codes: np.ndarray, class_labels: list[str], split: SplitConfig, uri: str
) -> np.ndarray:
    """`assign_splits`, refused when the train split lacks a class: scikit-learn refuses some such
    splits in its own words (a rare class left one row for the second draw) and draws others."""
    setting = split_setting(codes, class_labels, split)
    try:
        assignment = assign_splits(codes, split)
    except ValueError as err:
        raise DatasetError(  # scikit-learn's own message names the class by its code
            f"{uri}: no stratified split of {setting}: the test split leaves a rare class a single row "
            "to share between train and val; add rows of the rare classes or lower test_fraction"
        ) from err
    missing = np.setdiff1d(np.arange(len(class_labels)), codes[assignment == SPLITS.index("train")])
    if len(missing):  # a model never shown a class cannot predict it
        raise DatasetError(
            f"{uri}: the train split of {setting} has no row of class "
            f"{preview([repr(class_labels[i]) for i in missing])}; add rows of that class or "
            "lower val_fraction and test_fraction"
        )
    return assignment


def val_share(split: SplitConfig) -> float:
    """The val split's share of the rows left once the test split is taken out."""
    return split.val_fraction / (1.0 - split.test_fraction)


def split_rows(n_rows: int, split: SplitConfig) -> dict[str, int]:
    """Rows each split is sure to get from `assign_splits`: scikit-learn's train_test_split rounds
    a held-out split up, so its fraction rounded down is a lower bound, and train gets the rest."""
    test = math.ceil(split.test_fraction * n_rows)
    val = math.ceil(val_share(split) * (n_rows - test))
    return {
        "val": math.floor(split.val_fraction * n_rows),
        "test": math.floor(split.test_fraction * n_rows),
        "train": n_rows - test - val,
    }


def assign_splits(codes: np.ndarray, split: SplitConfig) -> np.ndarray:
    """Deterministic stratified assignment: 0 = train, 1 = val, 2 = test, one byte per row."""
    from sklearn.model_selection import train_test_split

    rows = np.arange(len(codes))
    rest, test = train_test_split(
        rows, test_size=split.test_fraction, stratify=codes, random_state=split.seed
    )
    _, val = train_test_split(rest, test_size=val_share(split), stratify=codes[rest], random_state=split.seed)
    assignment = np.zeros(len(codes), dtype=np.uint8)
    assignment[val] = 1
    assignment[test] = 2
    return assignment


def batch_features(
    batch: pa.RecordBatch | pa.Table, features: list[str], dtype: type = np.float32
) -> np.ndarray:
    return np.column_stack([column_values(batch.column(name)).astype(dtype, copy=False) for name in features])


def column_values(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A numeric column as numpy: decimals as float64 (numpy would hold them as Python objects)."""
    if pa.types.is_decimal(column.type):
        column = pc.cast(column, pa.float64())
    return column.to_numpy(zero_copy_only=False)


def train_moments(
    dataset: ds.Dataset,
    uri: str,
    features: list[str],
    assignment: np.ndarray,
    first_row: int = 0,
    check_values: bool = False,
) -> FeatureMoments:
    """The feature moments of the train rows, merged batch by batch. `assignment` holds the splits of
    the dataset's rows, the first of which is row `first_row` of the input; `check_values` checks every
    feature value first (`check_finite`), where `scan_labels` has not."""
    moments = FeatureMoments.empty(len(features))
    offset = 0
    with np.errstate(over="ignore", invalid="ignore"):  # an overflowing statistic is refused by name later
        for batch in iter_batches(dataset, uri, columns=features):
            if check_values:
                check_finite(batch, features, first_row + offset, uri)
            in_train = assignment[offset : offset + batch.num_rows] == SPLITS.index("train")
            offset += batch.num_rows
            if in_train.any():
                train = batch_features(batch, features, np.float64)[in_train]
                moments = moments.merge(FeatureMoments.of(train))
    return moments


def fitted_scaler(moments: FeatureMoments, features: list[str], uri: str) -> ScalerStats:
    """The standardisation the train rows' moments give, refused by column where float64 cannot hold it."""
    constant = moments.constant
    check_scaler(moments.mean, moments.variance, constant, features, uri)
    # A column constant in training standardises to exactly 0: its value as the mean (a running mean
    # of 1e39s is off by rounding) and scale 1, as scikit-learn's StandardScaler scales a column whose
    # variance is within rounding of 0.
    with np.errstate(over="ignore", invalid="ignore"):
        scale = np.where(constant | near_constant(moments), 1.0, np.sqrt(moments.variance))
    return ScalerStats(mean=np.where(constant, moments.low, moments.mean).tolist(), scale=scale.tolist())


def near_constant(moments: FeatureMoments) -> np.ndarray:
    """scikit-learn's bound on the rounding error of a computed variance (Chan, Golub and LeVeque)."""
    eps, count = np.finfo(np.float64).eps, moments.count
    with np.errstate(over="ignore"):
        return moments.variance <= count * eps * moments.variance + (count * moments.mean * eps) ** 2


def check_scaler(
    mean: np.ndarray, var: np.ndarray, constant: np.ndarray, features: list[str], uri: str
) -> None:
    """Statistics float64 cannot hold: values so large that their mean or variance overflows, or
    differences so small that the variance underflows (a scale of 0 would make the column constant)."""
    for index, name in enumerate(features):
        if constant[index]:  # standardises to 0 whatever its value
            continue
        if not (np.isfinite(mean[index]) and np.isfinite(var[index])):
            raise DatasetError(
                f"{uri}: feature column '{name}' holds values too large to standardise (their mean or "
                "variance overflows float64); rescale the column, e.g. divide it by a power of ten"
            )
        if var[index] < np.finfo(np.float64).tiny:
            raise DatasetError(
                f"{uri}: feature column '{name}' holds values that differ by too little to standardise "
                f"(their variance {var[index]:.3g} underflows float64); rescale the column, e.g. "
                "multiply it by a power of ten"
            )


def split_schema(features: list[str], label_column: str, split: str) -> pa.Schema:
    """Standardised float32 features, or the raw values as float64 in the raw split; class codes."""
    kind = pa.float64() if split == RAW_SPLIT else pa.float32()
    return pa.schema([(name, kind) for name in features] + [(label_column, pa.int64())])


def write_splits(
    dataset: ds.Dataset,
    uri: str,
    prepared: PreparedSplits,
    codes: np.ndarray,
    assignment: np.ndarray,
    first_row: int = 0,
) -> None:
    """Append each batch's rows to the split they belong to: standardised, or raw in the raw split.
    `codes` and `assignment` hold the dataset's rows, the first of which is row `first_row` of the input;
    `prepared.paths` may be fsspec URIs."""
    features, label = prepared.table.feature_names, prepared.table.label_column
    schemas = {name: split_schema(features, label, name) for name in SPLITS}
    writers = {name: split_writer(prepared.paths[name], schemas[name]) for name in SPLITS}
    try:
        offset = 0
        for batch in iter_batches(dataset, uri, columns=features):
            rows = slice(offset, offset + batch.num_rows)
            offset += batch.num_rows
            raw = batch_features(batch, features, np.float64)
            with np.errstate(over="ignore"):  # refused by name below
                scaled = standardise(raw, prepared.table.scaler)
            check_standardised(scaled, raw, features, first_row + rows.start, uri)
            for index, name in enumerate(SPLITS):
                keep = assignment[rows] == index
                if keep.any():
                    values = raw if name == RAW_SPLIT else scaled
                    by_column = np.ascontiguousarray(values[keep].T)  # one copy; each row is a column
                    columns = [pa.array(column) for column in by_column]
                    columns.append(pa.array(codes[rows][keep]))
                    table = pa.Table.from_arrays(columns, schema=schemas[name])
                    writers[name].write_table(table, row_group_size=SPLIT_ROW_GROUP_ROWS)
    finally:
        for writer in writers.values():
            writer.close()


def split_writer(path: str, schema: pa.Schema) -> pq.ParquetWriter:
    """A writer for a local file, or through fsspec for a remote one (a piece writes to the bucket)."""
    filesystem, file = filesystem_for(path)
    if is_local(filesystem):
        filesystem = None  # pyarrow's own, which writes faster than through fsspec
    # Dictionary encoding never pays off for float features; skipping it halves write time.
    return pq.ParquetWriter(file, schema, filesystem=filesystem, use_dictionary=False)


def check_standardised(
    scaled: np.ndarray, raw: np.ndarray, features: list[str], first_row: int, uri: str
) -> None:
    """Every standardised value within float32's range, which is what the model reads."""
    if np.isfinite(scaled).all():
        return
    row, column = np.argwhere(~np.isfinite(scaled))[0]
    raise DatasetError(
        f"{uri}: feature column '{features[column]}' at row {first_row + row} holds {raw[row, column]:.6g}, "
        "which standardised by the training rows' mean and scale is beyond float32's range; "
        "rescale the column or drop the row"
    )


@dataclass
class RowSplit:
    """Every row's class code and split, decided from the label column of the whole input: the same
    rows land in each split however many pieces then read the features."""

    codes: np.ndarray
    class_labels: list[str]
    label_kind: str
    assignment: np.ndarray  # one byte per row: its index in SPLITS

    @classmethod
    def of(cls, labels: np.ndarray, uri: str, label_column: str, split: SplitConfig) -> RowSplit:
        """From the cleaned labels of every row (`clean_labels`), refusing a split the rows cannot fill."""
        codes, class_labels = encode_labels(labels, uri, label_column)
        check_split_sizes(codes, class_labels, split, uri, label_column)
        assignment = checked_assignment(codes, class_labels, split, uri)
        return cls(codes, class_labels, label_kind(labels), assignment)

    def table(
        self, features: list[str], label_column: str, uri: str, left_out: dict[str, str]
    ) -> PreparedTable:
        """What the splits hold, but the scaler: fitted afterwards on the train rows (`fitted_scaler`)."""
        counts = np.bincount(self.codes, minlength=len(self.class_labels))
        return PreparedTable(
            feature_names=features,
            label_column=label_column,
            class_labels=self.class_labels,
            class_counts={c: int(n) for c, n in zip(self.class_labels, counts, strict=True)},
            rows={name: int((self.assignment == i).sum()) for i, name in enumerate(SPLITS)},
            scaler=ScalerStats(mean=[], scale=[]),
            source=uri,
            label_kind=self.label_kind,
            notes=[*left_out.values(), *label_case_warnings(self.class_labels)],
        )


def split_files(out_dir: str, part: int = 0) -> dict[str, str]:
    """Each split's part file number `part` under `out_dir` (a local folder or an fsspec URI): a split
    is a folder of parts, one per piece of the input that wrote it."""
    filesystem, root = filesystem_for(out_dir)
    paths = {name: f"{out_dir.rstrip('/')}/{name}/part-{part:05d}.parquet" for name in SPLITS}
    for name in SPLITS:
        filesystem.makedirs(f"{root.rstrip('/')}/{name}", exist_ok=True)
    return paths


def prepare_dataset(uri: str, label_column: str, out_dir: str, split: SplitConfig) -> PreparedSplits:
    """Validate `uri` and write train/val/test parquet files under `out_dir`: standardised train and
    val splits, and the test split's raw features (`RAW_SPLIT`)."""
    dataset = open_dataset(uri, label_column)
    left_out = non_feature_columns(dataset, uri, label_column)
    features = feature_columns(dataset.schema, label_column, uri, left_out)
    from_csv = isinstance(dataset.format, ds.CsvFileFormat)
    labels = clean_labels(scan_labels(dataset, uri, label_column, features), uri, label_column, from_csv)
    rows = RowSplit.of(labels, uri, label_column, split)
    scaler = fitted_scaler(train_moments(dataset, uri, features, rows.assignment), features, uri)
    table = replace(rows.table(features, label_column, uri, left_out), scaler=scaler)
    prepared = PreparedSplits(paths=split_files(out_dir), table=table)
    write_splits(dataset, uri, prepared, rows.codes, rows.assignment)
    return prepared


def write_embedded_digits(directory: str | None = None) -> str:
    """scikit-learn's bundled handwritten digits (1797 x 64, 10 classes) as parquet; no network."""
    from sklearn.datasets import load_digits

    digits = load_digits(as_frame=True)
    frame = digits.frame.rename(columns={"target": EMBEDDED_DIGITS_LABEL})
    directory = directory or tempfile.mkdtemp(prefix="mixedml-digits-")
    path = str(Path(directory) / "digits.parquet")
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return path


def read_split(path: str, feature_names: list[str], label_column: str) -> tuple[np.ndarray, np.ndarray]:
    """A whole prepared split (a parquet file or directory) as (features float32, label codes int64):
    the standardised train and val splits the training loops read."""
    table = ds.dataset(path, format=parquet_format()).to_table(columns=[*feature_names, label_column])
    features = np.column_stack([table.column(n).to_numpy() for n in feature_names]).astype(np.float32)
    return features, table.column(label_column).to_numpy().astype(np.int64)


def read_shard(
    path: str, feature_names: list[str], label_column: str, rank: int, world_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """This rank's part of a split (`rank_part`), read from its own row groups alone.

    Returns (features, labels, row ids), padded as `rank_part` says so that every rank holds
    ceil(n / world_size) rows and DDP ranks run the same number of steps.
    """
    part = rank_part(path, rank, world_size)
    features, labels = part.read(part.blocks, feature_names, label_column)
    return features, labels, part.row_ids()


@dataclass
class InputStats:
    bytes: int
    rows: int
    columns: int


def describe_input(uri: str) -> InputStats:
    """Size of the input from metadata (parquet footers, file sizes), without reading the rows.

    Also fails early, naming the file, when it is missing, empty or not parquet/CSV.
    """
    dataset = open_dataset(uri)
    filesystem, path = filesystem_for(uri)
    with remote_errors(uri):
        size = filesystem.du(path) if filesystem.isdir(path) else filesystem.size(path)
    columns = len(dataset.schema.names)
    if isinstance(dataset.format, ds.ParquetFileFormat):
        rows = dataset.count_rows()
    else:  # CSV: a row is at least a few bytes per value; an overestimate sizes memory safely
        rows = max(1, size // (columns * 4))
    return InputStats(bytes=int(size), rows=int(rows), columns=columns)


def dataset_fingerprint(uri: str) -> str:
    """Identity of the data behind `uri`: size and version/modification metadata of every file.

    Cheap (metadata only) and changes whenever a file is rewritten, so it can key a cache.
    """
    filesystem, path = filesystem_for(uri)
    with remote_errors(uri):
        files = sorted(filesystem.find(path)) if filesystem.isdir(path) else [path]
        infos = [(name, filesystem.info(name)) for name in files]
    identity = []
    for name, info in infos:
        version = {key: str(info[key]) for key in VERSION_KEYS if key in info}
        identity.append((name, info.get("size"), version))
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


# What fsspec filesystems report about a file's version: local mtime, S3 ETag, GCS generation/md5.
VERSION_KEYS = ("mtime", "created", "ETag", "LastModified", "generation", "md5Hash", "etag", "last_modified")


@dataclass(frozen=True)
class Block:
    """Rows [start, stop) of row group `row_group` of a split's file; `first_id` is the split's row id
    of its first row (rows count through the split's files in order)."""

    file: str
    row_group: int
    start: int
    stop: int
    first_id: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass
class RankPart:
    """A rank's part of a prepared split: a contiguous range of its rows, cut into blocks at the
    files' row groups, so that the rank reads its own row groups alone (a row group that straddles
    two ranks' ranges is decoded by both, each keeping its own rows). The ranges of n rows over
    `world_size` ranks differ by one row at most; a shorter one ends with a copy of its first row,
    so that every rank takes the same number of steps."""

    path: str
    filesystem: pa_fs.FileSystem
    blocks: list[Block]
    opened: dict[str, pq.ParquetFile] = field(default_factory=dict, repr=False)  # footer read once a file

    @property
    def rows(self) -> int:
        return sum(block.rows for block in self.blocks)

    def row_ids(self) -> np.ndarray:
        return np.concatenate([np.arange(b.first_id, b.first_id + b.rows) for b in self.blocks])

    def read_block(
        self, block: Block, feature_names: list[str], label_column: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """One block's (features float32, label codes int64), read from its row group alone."""
        if block.file not in self.opened:
            self.opened[block.file] = pq.ParquetFile(self.filesystem.open_input_file(block.file))
        group = self.opened[block.file].read_row_group(
            block.row_group, columns=[*feature_names, label_column]
        )
        rows = group.slice(block.start, block.rows)
        return batch_features(rows, feature_names), rows.column(label_column).to_numpy().astype(np.int64)

    def read(
        self, blocks: list[Block], feature_names: list[str], label_column: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """`blocks` laid end to end."""
        features, labels = zip(
            *(self.read_block(b, feature_names, label_column) for b in blocks), strict=True
        )
        return np.concatenate(features), np.concatenate(labels)


def row_groups(path: str) -> tuple[pa_fs.FileSystem, list[tuple[str, int, int]]]:
    """A split's filesystem and its row groups as (file, index, rows), in the order the rows count.
    `path` may be an object-store URI: the rows are then read from there, a row group at a time."""
    filesystem, root = filesystem_for(path)
    if is_local(filesystem):
        split = ds.dataset(path, format=parquet_format())
    else:
        split = ds.dataset(root, filesystem=filesystem, format=parquet_format(remote=True))
    groups = []
    for file in split.files:
        metadata = pq.read_metadata(file, filesystem=split.filesystem)
        groups += [
            (file, index, metadata.row_group(index).num_rows) for index in range(metadata.num_row_groups)
        ]
    return split.filesystem, groups


def rank_part(path: str, rank: int, world_size: int) -> RankPart:
    """Rank `rank`'s part of the split at `path` (a parquet file or a folder of parts): see `RankPart`."""
    filesystem, groups = row_groups(path)
    total = sum(rows for _, _, rows in groups)
    first, stop = rank * total // world_size, (rank + 1) * total // world_size
    if first == stop:
        raise DatasetError(
            f"{path}: rank {rank} of {world_size} got no rows; the split has only {total} rows"
        )
    blocks, group_start = [], 0
    for file, index, rows in groups:
        low, high = max(first, group_start), min(stop, group_start + rows)
        if low < high:
            blocks.append(Block(file, index, low - group_start, high - group_start, low))
        group_start += rows
    if stop - first < math.ceil(total / world_size):
        head = blocks[0]
        blocks.append(Block(head.file, head.row_group, head.start, head.start + 1, head.first_id))
    return RankPart(path, filesystem, blocks)
