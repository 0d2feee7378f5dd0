"""Reading any input table in pyarrow record batches, with errors that name the file, line and column.

Inputs are streamed: only one batch of features is in memory at a time, so memory does not grow
with the width or length of the file."""

from __future__ import annotations

import csv
import re
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import PurePosixPath

import fsspec
import fsspec.implementations.local
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.dataset as ds
import pyarrow.fs as pa_fs

from tasks.core.data.background import read_ahead
from tasks.core.data.csv_text import comma_numbers, retyped
from tasks.core.data.files import (
    DatasetError,
    detect_format,
    filesystem_for,
    is_local,
    parquet_format,
    part_files,
    remote_errors,
)
from tasks.core.data.kind_values import csv_reads_as_text
from tasks.core.data.part_types import (
    check_same_columns,
    column_kind,
    is_number,
    is_number_or_null,
    unified_type,
)
from tasks.core.messages import LINE_CHARS, one_line, shorten

BATCH_ROWS = 65_536
# Batches decoded ahead of the one in use: bounds memory (pyarrow reads 16 ahead by default).
READAHEAD_BATCHES = 2
CSV_DELIMITERS = ",;\t|"
# In a CSV input's schema, where its numbers are written with a decimal comma.
DECIMAL_POINT_KEY = b"mixedml.csv_decimal_point"
HEADER_BYTES = 1 << 20
# The CSV text parsed at once: pyarrow cannot read a line longer than this. Column types are
# guessed from a first block of pyarrow's default size.
CSV_BLOCK_BYTES, GUESS_BLOCK_BYTES = 16 << 20, 1 << 20
# pyarrow's CSV errors number columns from 0 and rows as lines of the file, header included.
CSV_COLUMN_ERROR = re.compile(r"In CSV column #(\d+): (?:Row #(\d+): )?(.*)", re.DOTALL)
LONG_LINE_ERROR = "straddling object straddles two block boundaries"
CSV_NOT_CONVERTED = re.compile(r"CSV conversion error to ([^:]+): invalid value '(.*)'", re.DOTALL)
# What a value of another kind in a CSV column calls for, as preprocessing reads it; scoring, where the
# column's kind is the model's, gives its own advice in its place.
VALUE_ADVICE = (
    "correct it, or leave the field empty where the value is missing, "
    "or mark the column categorical in column_kinds to read it as text"
)


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


def first_block(
    filesystem: fsspec.AbstractFileSystem,
    source: str | list[str],
    parse: pa_csv.ParseOptions,
    convert: pa_csv.ConvertOptions,
) -> tuple[pa.Schema, pa.RecordBatch | None]:
    """The column types pyarrow guesses from the first block, and that block's rows: a block of
    pyarrow's default size, so a value that breaks the guess further down is named with its line when
    converted; a larger one when the first rows are longer than that."""

    first = source[0] if isinstance(source, list) else source
    handler = pa_fs.PyFileSystem(pa_fs.FSSpecHandler(filesystem))

    def guess(block: int) -> tuple[pa.Schema, pa.RecordBatch | None]:
        read = pa_csv.ReadOptions(block_size=block, use_threads=False)  # no block read ahead
        with (
            handler.open_input_stream(first, compression="detect") as stream,
            pa_csv.open_csv(stream, read, parse, convert) as reader,
        ):
            try:
                return reader.schema, reader.read_next_batch()
            except StopIteration:
                return reader.schema, None

    try:
        return guess(GUESS_BLOCK_BYTES)
    except pa.ArrowInvalid as err:
        if LONG_LINE_ERROR not in str(err):
            raise
    return guess(CSV_BLOCK_BYTES)


@dataclass(frozen=True)
class CsvGuess:
    """What the first block says of a CSV input: the types pyarrow guesses, the block's rows as so
    read, and the decimal point its numbers are written with."""

    schema: pa.Schema
    sample: pa.RecordBatch | None
    decimal_point: str = "."

    def column(self, name: str) -> pa.Array | None:
        return self.sample.column(name) if self.sample is not None else None


def csv_guess(
    filesystem: fsspec.AbstractFileSystem,
    source: str | list[str],
    parse: pa_csv.ParseOptions,
    text: dict[str, pa.DataType],
    place: str,
) -> CsvGuess:
    """The first block's guess, with a decimal comma where a column read as text holds numbers
    written so ('0,123'), the delimiter is not a comma, and no column is numbers written with a point;
    a file that writes numbers both ways is refused, naming a column of each (`place`: the file)."""
    guess = CsvGuess(*first_block(filesystem, source, parse, pa_csv.ConvertOptions(column_types=text)))
    if parse.delimiter == ",":
        return guess
    commas = {
        f.name: found
        for f in guess.schema
        if f.name not in text and column_kind(f.type) == "text"
        if (found := comma_numbers(guess.column(f.name))) is not None
    }
    if not commas:
        return guess
    convert = pa_csv.ConvertOptions(column_types=text, decimal_point=",")
    comma = CsvGuess(*first_block(filesystem, source, parse, convert), decimal_point=",")
    pointed = [
        f.name for f in guess.schema if is_number(f.type) and not is_number(comma.schema.field(f.name).type)
    ]
    if pointed:
        name, row = next(iter(commas.items()))
        value = guess.column(name)[row].as_py()
        raise DatasetError(
            f"{place}: column {name!r} holds {shorten(repr(value))} at line {row + 2:,}, a number written "
            f"with a decimal comma, while column {pointed[0]!r} writes numbers with a decimal point; write "
            f"every number alike, or mark {name!r} categorical in column_kinds to read it as text"
        )
    return comma


def csv_format_and_schema(
    filesystem: fsspec.AbstractFileSystem,
    source: str | list[str],
    label_column: str | None,
    uri: str,
    declared: Mapping[str, str] | None = None,
) -> tuple[ds.CsvFileFormat, pa.Schema]:
    """CSV options for this file: its delimiter and decimal point, the label and the columns `declared`
    (column -> the kind the user gave) of any kind but numeric read as text (`csv_reads_as_text`), numeric
    columns as floats; and the schema they give, so that opening the dataset reads no block of the large
    size.

    pyarrow guesses column types from the first block only, so a column of integers holding 0.5
    further down would fail to convert; reading every numeric column as float64 avoids that. A text
    label keeps 'NA' or 'NULL' as classes: only an empty cell is missing. A column the user did not
    declare, read as text but mostly numbers or ISO dates, is read as those (csv_text.py).
    """
    declared = dict(declared or {})
    first = source[0] if isinstance(source, list) else source
    header = header_line(pa_fs.PyFileSystem(pa_fs.FSSpecHandler(filesystem)), first)
    parse = pa_csv.ParseOptions(delimiter=sniff_delimiter(header))
    read_as_text = [label_column] if label_column else []
    read_as_text += [name for name, kind in declared.items() if csv_reads_as_text(kind)]
    text = dict.fromkeys(read_as_text, pa.string())
    guess = csv_guess(filesystem, source, parse, text, part_name(uri, first))
    types = {f.name: read_type(f, guess, retype=f.name not in declared) for f in guess.schema}
    types.update(text)
    comma = {DECIMAL_POINT_KEY: b","} if guess.decimal_point == "," else None
    schema = pa.schema([(f.name, types.get(f.name, f.type)) for f in guess.schema], metadata=comma)
    return csv_format_of(parse, schema), schema


def read_type(field: pa.Field, guess: CsvGuess, retype: bool) -> pa.DataType:
    """A column's type as read: numbers as float64; text that is mostly numbers or dates as those,
    where `retype` (the user did not declare the column's kind)."""
    if is_number_or_null(field.type):
        return pa.float64()
    column = guess.column(field.name)
    if retype and column_kind(field.type) == "text" and column is not None:
        return retyped(column, guess.decimal_point) or field.type
    return field.type


def open_dataset(
    uri: str,
    label_column: str | None = None,
    typed_columns: Collection[str] | None = None,
    column_kinds: Mapping[str, str] | None = None,
) -> ds.Dataset:
    """Open a local path or fsspec URI (s3://, gs://, ...) as a lazily-read pyarrow dataset.

    For CSV only: `label_column` is read as text, and so are the columns `column_kinds` (the user's,
    column -> kind) declares of any kind but numeric (see `csv_format_and_schema`); where `typed_columns` is
    given, every column but those is read as text (scoring passes columns the model does not read
    through as written).
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
                pa_format, schema = csv_format_and_schema(filesystem, source, label_column, uri, column_kinds)
                if typed_columns is not None:
                    schema = pa.schema(
                        [(f.name, f.type if f.name in typed_columns else pa.string()) for f in schema],
                        metadata=schema.metadata,
                    )
                    pa_format = csv_format_of(pa_format.parse_options, schema)
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


def csv_format_of(parse: pa_csv.ParseOptions, schema: pa.Schema) -> ds.CsvFileFormat:
    """CSV options that read every column as `schema` types it: no guessing from a first block; with
    the decimal point its metadata names (`csv_format_and_schema`), as a scoring piece reads it."""
    types = {f.name: f.type for f in schema}
    decimal_point = (schema.metadata or {}).get(DECIMAL_POINT_KEY, b".").decode()
    return ds.CsvFileFormat(
        parse_options=parse,
        read_options=pa_csv.ReadOptions(block_size=CSV_BLOCK_BYTES),
        convert_options=pa_csv.ConvertOptions(column_types=types, decimal_point=decimal_point),
    )


def has_rows(dataset: ds.Dataset, uri: str) -> bool:
    """Parquet knows its row count from the footers; CSV must parse its first batch to tell."""
    if not isinstance(dataset.format, ds.CsvFileFormat):
        return dataset.count_rows() > 0
    return first_batch(dataset, uri) is not None


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
    value = CSV_NOT_CONVERTED.match(detail)
    if not value:
        return f"{source}: column {column}{where}: {shorten(detail, LINE_CHARS)}"
    instant = value[1].startswith(("date", "timestamp"))
    what = "an ISO date or time" if instant else "a number"
    hint = " (numbers must use '.' as the decimal point)" if "," in value[2] and not instant else ""
    return (
        f"{source}: column {column} holds {shorten(repr(value[2]))}{where}, not {what}{hint} like the "
        f"column's first values; {VALUE_ADVICE}"
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


def iter_batches(
    dataset: ds.Dataset, uri: str, columns: list[str] | None = None, as_dictionary: Collection[str] = ()
) -> Iterator[pa.RecordBatch]:
    """Record batches in file order (the split assignment relies on a stable row order), the next ones
    read in a thread while the caller works on one (`read_ahead`). The text columns named in
    `as_dictionary` come as dictionary arrays from a parquet input (`dictionary_reading`)."""
    yield from read_ahead(file_batches(dataset, uri, columns, as_dictionary))


def first_batch(dataset: ds.Dataset, uri: str, columns: list[str] | None = None) -> pa.RecordBatch | None:
    """The first batch that holds rows (None where none does), read in this thread: a caller that wants
    only the first rows reads nothing ahead."""
    return next((batch for batch in file_batches(dataset, uri, columns, ()) if batch.num_rows), None)


def with_offsets(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Each batch with the number of rows before it."""
    offset = 0
    for batch in batches:
        yield offset, batch
        offset += batch.num_rows


def file_batches(
    dataset: ds.Dataset, uri: str, columns: list[str] | None, as_dictionary: Collection[str]
) -> Iterator[pa.RecordBatch]:
    schema, dictionary_format = dictionary_reading(dataset, as_dictionary)
    for fragment in dataset.get_fragments():
        with remote_errors(uri), data_errors(dataset, fragment.path, uri):
            for part in read_parts(fragment):
                if dictionary_format is not None:
                    groups = [group.id for group in part.row_groups] or None
                    part = dictionary_format.make_fragment(part.path, part.filesystem, row_groups=groups)
                yield from part.to_batches(
                    schema=schema,
                    columns=columns,
                    batch_size=BATCH_ROWS,
                    batch_readahead=READAHEAD_BATCHES,
                )


def dictionary_reading(
    dataset: ds.Dataset, names: Collection[str]
) -> tuple[pa.Schema, ds.ParquetFileFormat | None]:
    """The schema, and the parquet format, that read the text columns among `names` as dictionary
    arrays: each row group's distinct texts are decoded once, and counting, looking up or hashing them
    is done once per distinct text (kind_values.distinct_categories). Other inputs read as they are."""
    text = [name for name in names if column_kind(dataset.schema.field(name).type) == "text"]
    if not text or not isinstance(dataset.format, ds.ParquetFileFormat):
        return dataset.schema, None
    read_options = ds.ParquetReadOptions(dictionary_columns=text)
    scan_options = dataset.format.default_fragment_scan_options
    parquet = ds.ParquetFileFormat(read_options=read_options, default_fragment_scan_options=scan_options)
    fields = [f.with_type(pa.dictionary(pa.int32(), f.type)) if f.name in text else f for f in dataset.schema]
    return pa.schema(fields, metadata=dataset.schema.metadata), parquet


def read_parts(fragment: ds.Fragment) -> list[ds.Fragment]:
    """A parquet file's row groups, read one at a time: a scan of the whole file decodes row groups
    ahead of a slow reader until pyarrow's backpressure stops it, hundreds of MB later, so memory
    grew with the file (`READAHEAD_BATCHES` does not bound it)."""
    if isinstance(fragment, ds.ParquetFileFragment):
        return fragment.split_by_row_group() or [fragment]
    return [fragment]
