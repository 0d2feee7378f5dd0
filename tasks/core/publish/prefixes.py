"""Whether a publish prefix can take bundles, told without writing: checked with a workflow's other inputs,
so it imports neither a framework nor the bundle code (the preprocessing image has neither)."""

from __future__ import annotations

import os
from pathlib import Path

import fsspec


def prefix_problem(prefix: str) -> str:
    """What keeps bundles from being published under `prefix` that can be told without writing ("" if
    nothing): on a filesystem, a file in its place or a folder this process cannot write; elsewhere, a
    scheme no installed filesystem serves. Credentials and buckets are the publish's to find."""
    protocol, path = fsspec.core.split_protocol(prefix)
    if protocol in (None, "file", "local"):
        return local_prefix_problem(Path(path))
    try:
        for link in prefix.split("::"):  # a chained URI, e.g. simplecache::s3://bucket/models
            fsspec.get_filesystem_class(fsspec.core.split_protocol(link)[0] or "file")
    except (ValueError, ImportError) as error:  # an unknown scheme, or its package is not installed
        return f"cannot publish to this URI: {error}"
    return ""


def local_prefix_problem(path: Path) -> str:
    """A file at the prefix or above it, or a folder that cannot be written: the nearest one that exists."""
    existing = path.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file" if existing == path.absolute() else f"lies under {existing}, which is a file"
        return f"{where}, not a folder to publish bundles under"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"this process may not write to the folder {existing}"
    return ""
