"""The sha256 digests that tie a bundle folder to its manifest.

A file's digest is the sha256 of its bytes; a folder's (a SavedModel, the MLflow model) covers its
files' names relative to it and their contents, so a renamed, added or changed file changes it. The
manifest's own digest (`manifest_sha256`) covers everything else it holds, read as JSON: the class
labels, the encoding, the scaler, the target's scale, the model record, the input columns, the files'
digests, the metrics and the notes alike, so a manifest edited by hand no longer matches it.
`write_manifest` (manifest.py) seals a manifest each time it writes one.

A digest tells a changed or mixed-up file apart; it is no signature: whoever can rewrite a file and
recompute its digest can forge both.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePosixPath
from typing import Any

import fsspec

MANIFEST_DIGEST = "manifest_sha256"


def content_digest(path: Path) -> str:
    """The sha256 of a file; of a folder (a SavedModel), of its files' relative names and contents."""
    if path.is_file():
        with path.open("rb") as stream:
            return hashlib.file_digest(stream, "sha256").hexdigest()
    digest = hashlib.sha256()
    for file in sorted(item for item in path.rglob("*") if item.is_file()):
        digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        with file.open("rb") as stream:
            digest.update(hashlib.file_digest(stream, "sha256").digest())
    return digest.hexdigest()


def stored_digest(filesystem: fsspec.AbstractFileSystem, path: str) -> str | None:
    """`content_digest` of a file or folder on any fsspec filesystem; None where there is nothing."""
    if filesystem.isfile(path):
        with filesystem.open(path, "rb") as stream:
            return hashlib.file_digest(stream, "sha256").hexdigest()
    if not filesystem.isdir(path):
        return None
    root = PurePosixPath(path)
    # Sorted by path parts, as content_digest sorts its Paths ("a/b" before "a-b").
    files = sorted(PurePosixPath(file).relative_to(root) for file in filesystem.find(path))
    digest = hashlib.sha256()
    for relative in files:
        digest.update(relative.as_posix().encode() + b"\0")
        with filesystem.open(str(root / relative), "rb") as stream:
            digest.update(hashlib.file_digest(stream, "sha256").digest())
    return digest.hexdigest()


def manifest_digest(data: dict[str, Any]) -> str:
    """The sha256 of a manifest as parsed JSON, its own digest left out: keys sorted, no spaces, so
    the digest does not depend on how the file was indented."""
    covered = {key: value for key, value in data.items() if key != MANIFEST_DIGEST}
    return hashlib.sha256(json.dumps(covered, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
