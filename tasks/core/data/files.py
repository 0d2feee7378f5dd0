"""Where an input's files are and what format they hold: local paths and object stores alike."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import PurePosixPath

import fsspec
import fsspec.implementations.local
import pyarrow.dataset as ds

from tasks.core.messages import one_line

FORMATS_BY_SUFFIX = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
COMPRESSED_SUFFIXES = {".gz", ".bz2", ".zst"}
UNNAMED_FORMAT = "no format in the name"


class DatasetError(ValueError):
    """Input data that cannot be used; the message names the file, the column and the problem."""


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


def parquet_split(path: str) -> ds.FileSystemDataset:
    """A prepared split (a parquet file or a folder of parts) at a local path or an object-store URI.
    A URI is opened through fsspec (`filesystem_for`), whose defaults carry the run's storage settings
    (an S3-compatible endpoint and keys, tasks/plumbing/storage.py); pyarrow's own filesystem, which
    `ds.dataset(uri)` would pick, knows none of them. Every read of run storage goes through here."""
    filesystem, root = filesystem_for(path)
    if is_local(filesystem):
        return ds.dataset(path, format=parquet_format())
    return ds.dataset(root, filesystem=filesystem, format=parquet_format(remote=True))


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
