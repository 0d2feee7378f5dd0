"""Publishing model bundles under a prefix, and finding the latest one again.

A prefix (any fsspec URI: a folder, s3://bucket/models/churn, gs://...) holds one folder per published
version and a small `LATEST` object naming the newest:

    <prefix>/20250301T020412Z-3f9c2a1b/bundle.json, model.pt, model.onnx, ...
    <prefix>/LATEST                      -> "20250301T020412Z-3f9c2a1b"

A version is copied in full before `LATEST` is rewritten, so a reader sees either the previous version
or the new one, never a half-copied folder. `LATEST` itself is replaced whole: an object store replaces
an object in one write; on a filesystem (a local disk, an NFS mount) it is written under a temporary
name in the same folder and renamed over `LATEST`, so a reader never finds it empty or half-written.
"""

from __future__ import annotations

import os
import secrets
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

import fsspec

from tasks.core.data.files import DatasetError, filesystem_for, is_local, remote_errors
from tasks.core.serving.bundle import MANIFEST, BundleError, check_files, content_digest
from tasks.core.serving.prefixes import prefix_problem

LATEST = "LATEST"
# Versions sort by publication time; the hash tells apart two bundles published in the same second.
VERSION_TIME = "%Y%m%dT%H%M%SZ"
HASH_CHARS = 8


def bundle_digest(directory: str) -> str:
    """A hash of every file of a local bundle folder: names and contents."""
    return content_digest(Path(directory))


def new_version(directory: str, now: datetime | None = None) -> str:
    moment = (now or datetime.now(UTC)).strftime(VERSION_TIME)
    return f"{moment}-{bundle_digest(directory)[:HASH_CHARS]}"


def join(uri: str, *names: str) -> str:
    return "/".join([uri.rstrip("/"), *names])


def publish_bundle(local_dir: str, prefix: str, origin: str = "") -> str:
    """Copy the bundle folder `local_dir` to `<prefix>/<version>/`, then point `<prefix>/LATEST` at it.
    The prefix and the folder (against its manifest) are checked first. A failure names where the
    bundle still is: `origin` (where it lasts, e.g. the run's output) or else `local_dir`.

    Returns the version's URI.
    """
    if not (Path(local_dir) / MANIFEST).is_file():
        raise BundleError(f"{local_dir}: not a model bundle (no {MANIFEST}); nothing to publish")
    try:
        return copy_version(local_dir, prefix)
    except (BundleError, DatasetError) as error:
        kept = f"the bundle is not published and stays at {origin or local_dir}"
        raise type(error)(f"{error}; {kept}") from error


def copy_version(local_dir: str, prefix: str) -> str:
    if not prefix:
        raise BundleError("no prefix to publish to: name a folder or URI such as s3://bucket/models/churn")
    if problem := prefix_problem(prefix):
        raise BundleError(f"{prefix}: {problem}")
    check_files(local_dir)
    version = new_version(local_dir)
    target = join(prefix, version)
    filesystem, path = filesystem_for(target)
    with remote_errors(target):
        filesystem.put(str(local_dir).rstrip("/") + "/", path, recursive=True)
        # Last: readers of LATEST never see a version whose files are still arriving.
        point_latest(filesystem, filesystem_for(prefix)[1], version)
    return target


def point_latest(filesystem: fsspec.AbstractFileSystem, prefix_path: str, version: str) -> None:
    """Replace `<prefix>/LATEST` whole with `version`."""
    latest = join(prefix_path, LATEST)
    if not is_local(filesystem):
        filesystem.pipe_file(latest, version.encode())  # an object store replaces the object in one write
        return
    # Written aside, then renamed over: truncating LATEST in place would let a reader find it empty.
    os.makedirs(os.path.dirname(latest), exist_ok=True)
    temporary = f"{os.path.dirname(latest)}/.{LATEST}.{secrets.token_hex(8)}"
    # Created as any new file is (0666 less the umask): mkstemp's 0600 would hide LATEST from other users.
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(version.encode())
        os.replace(temporary, latest)
    except BaseException:
        os.unlink(temporary)
        raise


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
