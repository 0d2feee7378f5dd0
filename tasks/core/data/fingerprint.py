"""What identifies an input's content, so a cache never serves a rewritten file's old result."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import pyarrow.dataset as ds

from tasks.core.data.files import filesystem_for, remote_errors
from tasks.core.data.reading import open_dataset


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
