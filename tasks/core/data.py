"""Loading, validating, splitting and standardising a tabular classification dataset.

Inputs are streamed in pyarrow record batches: only the label column, one byte of split
assignment per row and one batch of features are in memory at a time, so memory does not
grow with the width of the file.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import fsspec
import fsspec.implementations.local
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.dataset as ds
import pyarrow.parquet as pq

if TYPE_CHECKING:  # scikit-learn (about a second to import) is loaded only where it splits or scales
    from sklearn.preprocessing import StandardScaler

FORMATS_BY_SUFFIX = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
SPLITS = ("train", "val", "test")
BATCH_ROWS = 65_536
# Batches decoded ahead of the one in use: bounds memory (pyarrow reads 16 ahead by default).
READAHEAD_BATCHES = 2
EMBEDDED_DIGITS_LABEL = "label"


class DatasetError(ValueError):
    """Input data that cannot be used; the message names the file, the column and the problem."""


@dataclass
class SplitConfig:
    val_fraction: float = 0.15
    test_fraction: float = 0.15
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("val_fraction", "test_fraction"):
            value = getattr(self, name)
            if not 0.0 < value < 0.5:
                raise DatasetError(f"{name}={value} must be between 0 and 0.5 (exclusive)")


@dataclass
class ScalerStats:
    """Per-feature standardisation fitted on the training split: x' = (x - mean) / scale."""

    mean: list[float]
    scale: list[float]


@dataclass
class PreparedSplits:
    """Where the prepared splits were written and what is in them."""

    paths: dict[str, str]
    rows: dict[str, int]
    feature_names: list[str]
    label_column: str
    class_labels: list[str]
    class_counts: dict[str, int]
    scaler: ScalerStats
    source: str = ""
    notes: list[str] = field(default_factory=list)


def detect_format(uri: str) -> str:
    suffixes = [s.lower() for s in Path(uri.rstrip("/")).suffixes]
    for suffix in reversed(suffixes):
        if suffix in FORMATS_BY_SUFFIX:
            return FORMATS_BY_SUFFIX[suffix]
    if suffixes and suffixes[-1] in {".gz", ".bz2", ".zst"} and len(suffixes) > 1:
        return detect_format(uri.rsplit(".", 1)[0])
    raise DatasetError(
        f"{uri}: cannot tell the file format from its name; use one of "
        f"{', '.join(sorted(FORMATS_BY_SUFFIX))} (a directory of parquet files must end in .parquet)"
    )


def parquet_format(remote: bool = False) -> ds.ParquetFileFormat:
    """Pre-buffering reads whole row groups at once: fewer requests to an object store, but on a
    local disk it holds most of a file in memory, so it is used for remote files only."""
    options = ds.ParquetFragmentScanOptions(pre_buffer=remote)
    return ds.ParquetFileFormat(default_fragment_scan_options=options)


def open_dataset(uri: str) -> ds.Dataset:
    """Open a local path or fsspec URI (s3://, gs://, ...) as a lazily-read pyarrow dataset."""
    file_format = detect_format(uri)
    try:
        filesystem, path = fsspec.core.url_to_fs(uri)
    except (ValueError, ImportError) as err:  # unknown protocol, or its filesystem package is missing
        raise DatasetError(f"{uri}: cannot open this URI: {err}") from err
    if not filesystem.exists(path):
        raise DatasetError(f"{uri}: no such file or directory")
    if filesystem.isfile(path) and filesystem.size(path) == 0:
        raise DatasetError(f"{uri}: the file is empty (0 bytes)")
    if file_format == "csv":
        # An empty CSV field is a missing value, not an empty-string label.
        file_format = ds.CsvFileFormat(convert_options=pa_csv.ConvertOptions(strings_can_be_null=True))
    else:
        file_format = parquet_format(
            remote=not isinstance(filesystem, fsspec.implementations.local.LocalFileSystem)
        )
    try:
        dataset = ds.dataset(path, filesystem=filesystem, format=file_format)
        # Parquet knows its row count from the footers; CSV must parse its first block to tell.
        is_csv = isinstance(file_format, ds.CsvFileFormat)
        has_rows = (dataset.head(1).num_rows if is_csv else dataset.count_rows()) > 0
    except (pa.ArrowInvalid, OSError) as err:
        raise DatasetError(f"{uri}: cannot be read as {detect_format(uri)}: {err}") from err
    if not has_rows:
        raise DatasetError(f"{uri}: the dataset has no rows")
    return dataset


def iter_batches(dataset: ds.Dataset, uri: str, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Record batches in file order (the split assignment relies on a stable row order)."""
    try:
        yield from dataset.to_batches(
            columns=columns, batch_size=BATCH_ROWS, batch_readahead=READAHEAD_BATCHES, fragment_readahead=1
        )
    except pa.ArrowInvalid as err:
        raise DatasetError(f"{uri}: unreadable data: {err}") from err


def feature_columns(schema: pa.Schema, label_column: str, uri: str) -> list[str]:
    """All columns except the label; each must be numeric."""
    if label_column not in schema.names:
        raise DatasetError(
            f"{uri}: label column '{label_column}' not found; columns are: {', '.join(schema.names)}"
        )
    features = [name for name in schema.names if name != label_column]
    if not features:
        raise DatasetError(f"{uri}: no feature columns besides the label column '{label_column}'")
    for name in features:
        kind = schema.field(name).type
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)):
            raise DatasetError(
                f"{uri}: feature column '{name}' has type {kind}, not a number; "
                "encode it numerically or drop it before training"
            )
    return features


def check_finite(batch: pa.RecordBatch, features: list[str], first_row: int, uri: str) -> None:
    for name in features:
        column = batch.column(name)
        if column.null_count:
            row = first_row + pc.index(pc.is_null(column), True).as_py()
            raise DatasetError(f"{uri}: feature column '{name}' has a missing value (NaN/null) at row {row}")
        if pa.types.is_floating(column.type):
            bad = pc.invert(pc.is_finite(column))
            if pc.any(bad).as_py():
                row = first_row + pc.index(bad, True).as_py()
                value = column[row - first_row].as_py()
                raise DatasetError(
                    f"{uri}: feature column '{name}' has a non-finite value {value} at row {row}"
                )


def scan_labels(dataset: ds.Dataset, uri: str, label_column: str, features: list[str]) -> np.ndarray:
    """Validate every feature batch and return the label column (the only column kept in memory)."""
    label_chunks = []
    rows = 0
    for batch in iter_batches(dataset, uri):
        check_finite(batch, features, rows, uri)
        labels = batch.column(label_column)
        if labels.null_count:
            row = rows + pc.index(pc.is_null(labels), True).as_py()
            raise DatasetError(f"{uri}: label column '{label_column}' has a missing value at row {row}")
        label_chunks.append(labels)
        rows += batch.num_rows
    if rows == 0:
        raise DatasetError(f"{uri}: the dataset has no rows")
    return pa.chunked_array(label_chunks, type=dataset.schema.field(label_column).type).to_numpy()


def encode_labels(labels: np.ndarray, uri: str, label_column: str) -> tuple[np.ndarray, list[str]]:
    classes, codes = np.unique(labels, return_inverse=True)
    if len(classes) < 2:
        raise DatasetError(
            f"{uri}: label column '{label_column}' has a single class ({classes[0]!r}); "
            "classification needs at least 2"
        )
    return codes.astype(np.int64), [str(c) for c in classes]


def check_split_sizes(codes: np.ndarray, class_labels: list[str], split: SplitConfig, uri: str) -> None:
    counts = np.bincount(codes, minlength=len(class_labels))
    too_rare = [f"{class_labels[i]!r} ({counts[i]} rows)" for i in np.flatnonzero(counts < len(SPLITS))]
    if too_rare:
        raise DatasetError(
            f"{uri}: too few rows for a stratified train/val/test split: classes "
            f"{', '.join(too_rare)} need at least {len(SPLITS)} rows each"
        )
    n_rows = len(codes)
    for name, fraction in (("val", split.val_fraction), ("test", split.test_fraction)):
        if math.floor(n_rows * fraction) < len(class_labels):
            raise DatasetError(
                f"{uri}: too few rows for the split: {n_rows} rows x {name}_fraction={fraction} gives "
                f"fewer {name} rows than the {len(class_labels)} classes; add rows or raise {name}_fraction"
            )


def assign_splits(codes: np.ndarray, split: SplitConfig) -> np.ndarray:
    """Deterministic stratified assignment: 0 = train, 1 = val, 2 = test, one byte per row."""
    from sklearn.model_selection import train_test_split

    rows = np.arange(len(codes))
    rest, test = train_test_split(
        rows, test_size=split.test_fraction, stratify=codes, random_state=split.seed
    )
    val_share = split.val_fraction / (1.0 - split.test_fraction)
    _, val = train_test_split(rest, test_size=val_share, stratify=codes[rest], random_state=split.seed)
    assignment = np.zeros(len(codes), dtype=np.uint8)
    assignment[val] = 1
    assignment[test] = 2
    return assignment


def batch_features(batch: pa.RecordBatch, features: list[str]) -> np.ndarray:
    return np.column_stack(
        [batch.column(name).to_numpy(zero_copy_only=False).astype(np.float32) for name in features]
    )


def fit_scaler(dataset: ds.Dataset, uri: str, features: list[str], assignment: np.ndarray) -> StandardScaler:
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler()
    offset = 0
    for batch in iter_batches(dataset, uri, columns=features):
        in_train = assignment[offset : offset + batch.num_rows] == 0
        offset += batch.num_rows
        if in_train.any():
            scaler.partial_fit(batch_features(batch, features)[in_train])
    return scaler


def split_schema(features: list[str], label_column: str) -> pa.Schema:
    return pa.schema([(name, pa.float32()) for name in features] + [(label_column, pa.int64())])


def write_splits(
    dataset: ds.Dataset,
    uri: str,
    prepared: PreparedSplits,
    codes: np.ndarray,
    assignment: np.ndarray,
    scaler: StandardScaler,
) -> None:
    """Standardise each batch and append its rows to the split they belong to."""
    features, label = prepared.feature_names, prepared.label_column
    schema = split_schema(features, label)
    # Dictionary encoding never pays off for standardised floats; skipping it halves write time.
    writers = {name: pq.ParquetWriter(prepared.paths[name], schema, use_dictionary=False) for name in SPLITS}
    try:
        offset = 0
        for batch in iter_batches(dataset, uri, columns=features):
            rows = slice(offset, offset + batch.num_rows)
            offset += batch.num_rows
            scaled = scaler.transform(batch_features(batch, features)).astype(np.float32)
            for index, name in enumerate(SPLITS):
                keep = assignment[rows] == index
                if keep.any():
                    by_column = np.ascontiguousarray(scaled[keep].T)  # one copy; each row is a column
                    columns = [pa.array(values) for values in by_column]
                    columns.append(pa.array(codes[rows][keep]))
                    writers[name].write_table(pa.Table.from_arrays(columns, schema=schema))
    finally:
        for writer in writers.values():
            writer.close()


def prepare_dataset(uri: str, label_column: str, out_dir: str, split: SplitConfig) -> PreparedSplits:
    """Validate `uri` and write standardised train/val/test parquet files under `out_dir`."""
    dataset = open_dataset(uri)
    features = feature_columns(dataset.schema, label_column, uri)
    codes, class_labels = encode_labels(scan_labels(dataset, uri, label_column, features), uri, label_column)
    check_split_sizes(codes, class_labels, split, uri)
    assignment = assign_splits(codes, split)
    scaler = fit_scaler(dataset, uri, features, assignment)

    paths = {}
    for name in SPLITS:
        split_dir = Path(out_dir) / name
        split_dir.mkdir(parents=True, exist_ok=True)
        paths[name] = str(split_dir / "part-00000.parquet")
    prepared = PreparedSplits(
        paths=paths,
        rows={name: int((assignment == i).sum()) for i, name in enumerate(SPLITS)},
        feature_names=features,
        label_column=label_column,
        class_labels=class_labels,
        class_counts={c: int(n) for c, n in zip(class_labels, np.bincount(codes), strict=True)},
        scaler=ScalerStats(mean=scaler.mean_.tolist(), scale=scaler.scale_.tolist()),
        source=uri,
    )
    write_splits(dataset, uri, prepared, codes, assignment, scaler)
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
    """A whole prepared split (a parquet file or directory) as (features float32, label codes int64)."""
    table = ds.dataset(path, format=parquet_format()).to_table(columns=[*feature_names, label_column])
    features = np.column_stack([table.column(n).to_numpy() for n in feature_names]).astype(np.float32)
    return features, table.column(label_column).to_numpy().astype(np.int64)


def read_shard(
    path: str, feature_names: list[str], label_column: str, rank: int, world_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows `rank, rank + world_size, ...` of a split, streamed so other ranks' rows are never kept.

    Returns (features, labels, row ids). Shards are padded by repeating their first rows so every
    rank holds ceil(n / world_size) rows and DDP ranks run the same number of steps.
    """
    split = ds.dataset(path, format=parquet_format())
    feature_parts, label_parts, id_parts = [], [], []
    offset = 0
    for batch in split.to_batches(batch_size=BATCH_ROWS, columns=[*feature_names, label_column]):
        ids = np.arange(offset, offset + batch.num_rows)
        offset += batch.num_rows
        mine = ids % world_size == rank
        if mine.any():
            feature_parts.append(batch_features(batch, feature_names)[mine])
            label_parts.append(batch.column(label_column).to_numpy()[mine].astype(np.int64))
            id_parts.append(ids[mine])
    if not id_parts:
        raise DatasetError(
            f"{path}: rank {rank} of {world_size} got no rows; the split has only {offset} rows"
        )
    features, labels, ids = (np.concatenate(p) for p in (feature_parts, label_parts, id_parts))
    missing = math.ceil(offset / world_size) - len(ids)
    if missing:
        features, labels, ids = (np.concatenate([a, a[:missing]]) for a in (features, labels, ids))
    return features, labels, ids


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
    filesystem, path = fsspec.core.url_to_fs(uri)
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
    filesystem, path = fsspec.core.url_to_fs(uri)
    files = sorted(filesystem.find(path)) if filesystem.isdir(path) else [path]
    identity = []
    for name in files:
        info = filesystem.info(name)
        version = {key: str(info[key]) for key in VERSION_KEYS if key in info}
        identity.append((name, info.get("size"), version))
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


# What fsspec filesystems report about a file's version: local mtime, S3 ETag, GCS generation/md5.
VERSION_KEYS = ("mtime", "created", "ETag", "LastModified", "generation", "md5Hash", "etag", "last_modified")
