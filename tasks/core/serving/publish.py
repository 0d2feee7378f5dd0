"""Publishing model bundles under a prefix, and finding the latest one again.

A prefix (any fsspec URI: a folder, s3://bucket/models/churn, gs://...) holds one folder per published
version and a small `LATEST` object naming the newest:

    <prefix>/20250301T020412Z-3f9c2a1b/bundle.json, model.pt, model.onnx, ...
    <prefix>/LATEST                      -> "20250301T020412Z-3f9c2a1b"

A version is copied in full before `LATEST` is rewritten, in one single-object write, so a reader
sees either the previous version or the new one, never a half-copied folder.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from tasks.core.data.files import filesystem_for, remote_errors
from tasks.core.serving.bundle import MANIFEST, BundleError

LATEST = "LATEST"
# Versions sort by publication time; the hash tells apart two bundles published in the same second.
VERSION_TIME = "%Y%m%dT%H%M%SZ"
HASH_CHARS = 8


def bundle_digest(directory: str) -> str:
    """A hash of every file of a local bundle folder: names and contents."""
    digest = hashlib.sha256()
    root = Path(directory)
    for file in sorted(path for path in root.rglob("*") if path.is_file()):
        digest.update(file.relative_to(root).as_posix().encode() + b"\0")
        with file.open("rb") as stream:
            digest.update(hashlib.file_digest(stream, "sha256").digest())
    return digest.hexdigest()


def new_version(directory: str, now: datetime | None = None) -> str:
    moment = (now or datetime.now(UTC)).strftime(VERSION_TIME)
    return f"{moment}-{bundle_digest(directory)[:HASH_CHARS]}"


def join(uri: str, *names: str) -> str:
    return "/".join([uri.rstrip("/"), *names])


def publish_bundle(local_dir: str, prefix: str) -> str:
    """Copy the bundle folder `local_dir` to `<prefix>/<version>/`, then point `<prefix>/LATEST` at it.

    Returns the version's URI.
    """
    if not (Path(local_dir) / MANIFEST).is_file():
        raise BundleError(f"{local_dir}: not a model bundle (no {MANIFEST}); nothing to publish")
    if not prefix:
        raise BundleError("no prefix to publish to: name a folder or URI such as s3://bucket/models/churn")
    version = new_version(local_dir)
    target = join(prefix, version)
    filesystem, path = filesystem_for(target)
    with remote_errors(target):
        filesystem.put(str(local_dir).rstrip("/") + "/", path, recursive=True)
        # Last, and one object: readers of LATEST never see a version whose files are still arriving.
        filesystem.pipe_file(join(filesystem_for(prefix)[1], LATEST), version.encode())
    return target


def resolve_bundle(uri: str) -> str:
    """`uri` itself when it holds a bundle, else the version its `LATEST` names, as a URI."""
    if not uri:
        raise BundleError("no model given: name a bundle folder or a prefix that bundles were published to")
    filesystem, path = filesystem_for(uri)
    with remote_errors(uri):
        if filesystem.isfile(join(path, MANIFEST)):
            return uri
        latest = join(path, LATEST)
        version = (
            filesystem.cat_file(latest).decode("utf-8", "replace").strip()
            if filesystem.isfile(latest)
            else None
        )
    if version is None:
        raise BundleError(
            f"{uri}: neither a model bundle (no {MANIFEST}) nor a publish prefix (no {LATEST}); "
            "name a bundle folder, or a prefix written by publish_to"
        )
    if not version or PurePosixPath(version).name != version or version in (".", ".."):
        raise BundleError(f"{join(uri, LATEST)}: {version!r} is not a version folder name")
    with remote_errors(uri):
        published = filesystem.isfile(join(path, version, MANIFEST))
    if not published:
        raise BundleError(
            f"{join(uri, LATEST)} names version {version!r}, but {join(uri, version)} holds no {MANIFEST}"
        )
    return join(uri, version)
