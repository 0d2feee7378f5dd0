"""Publishing model bundles under a prefix, laid out for serving, and finding the latest one again.

A prefix (any fsspec URI: a folder, s3://bucket/models/churn, gs://...) holds one folder per published
version, named by an integer that orders versions by publication time (the UTC time as YYYYMMDDhhmmss,
the second after the newest where that is taken), a small `LATEST` object naming the one in use, and the
layouts that Triton and TF Serving load as they are (layouts.py):

    <prefix>/20250301020412/bundle.json, model.pt, model.onnx, ..., PUBLISHED.json
    <prefix>/LATEST                      -> "20250301020412"
    <prefix>/SERVING.json                the served model's name, how many versions the layouts keep
    <prefix>/triton/churn/config.pbtxt, labels-20250301020412.txt, 20250301020412/model.onnx
    <prefix>/tf_serving/models.config, 20250301020412/saved_model.pb   (Keras bundles)

`PUBLISHED.json` records the version's readable id (UTC time and content hash, the names versions had
before they were integers), the bundle's hash, where it came from, and the serving configuration that
promoting it writes. bundle.json is copied as it is: its digests are checked on load.

A version and its layouts' files are copied in full before anything names them. Promoting it then
replaces the servers' configuration files (`config.pbtxt`, `models.config`), then `LATEST`, each whole:
an object store replaces an object in one write; on a filesystem (a local disk, an NFS mount) the new
content is written under a temporary name in the same folder and renamed over the old, so a reader
never finds one empty or half-written. A publish never moves them back to an older version: where
`LATEST` names a newer one by then (another publisher's), the version stays published, unserved
(`serve`). A version published without promoting (`promote=False`) is copied, and `LATEST` and what the
servers serve stay where they were. `promote_version` moves them to any version, once its files are
checked against its manifest. `PUBLISHED.json` records the decision and its reason.

A promoted version without a server's export (a torch bundle has no SavedModel) leaves that server on
the version it serves: TF Serving goes on answering with the last Keras version rather than with
nothing, while `LATEST` and Triton move. Publishing logs a warning naming both versions, and the
version's `notes` in `PUBLISHED.json` say the same.

Each publish then prunes the layouts of older versions past `keep_versions`; promoting a pruned version
copies its layouts back first (retention.py).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath

import fsspec

from tasks.core.bundle.digests import content_digest
from tasks.core.bundle.loading import check_files, check_stored
from tasks.core.bundle.manifest import MANIFEST
from tasks.core.bundle.table_input import BundleError
from tasks.core.data.api import DatasetError, filesystem_for, is_local, remote_errors
from tasks.core.publish.layouts import (
    LATEST,
    SERVED_EXPORT,
    Layouts,
    is_version,
    join,
    served_version,
    server_configs,
    version_layouts,
)
from tasks.core.publish.prefixes import prefix_problem
from tasks.core.publish.retention import (
    SETTINGS,
    prune_layouts,
    read_text,
    restore_layouts,
    served_now,
    serving_settings,
    settings_text,
)

PUBLISHED = "PUBLISHED.json"
# Integer versions: Triton and TF Serving read a version folder's name as an int64; 14 digits fit.
VERSION_NUMBER = "%Y%m%d%H%M%S"
VERSION_DIGITS = 14
# Readable ids (and the version names of prefixes published before versions were integers).
VERSION_TIME = "%Y%m%dT%H%M%SZ"
HASH_CHARS = 8

logger = logging.getLogger(__name__)


@dataclass
class PromotionDecision:
    """Whether a published version becomes LATEST, and why (the promotion gate's, promotion.py)."""

    promote: bool
    reason: str
    new: float | None = None  # the new version's figure (the policy's metric, or RMSE), where measured
    current: float | None = None  # the current LATEST's, on the same rows


def as_decision(promote: bool | PromotionDecision) -> PromotionDecision:
    if isinstance(promote, PromotionDecision):
        return promote
    return PromotionDecision(promote, f"published with promote={promote}")


def bundle_digest(directory: str) -> str:
    """A hash of every file of a local bundle folder: names and contents."""
    return content_digest(Path(directory))


def readable_id(directory: str, now: datetime | None = None) -> str:
    """The UTC time and the bundle's hash, e.g. "20250301T020412Z-3f9c2a1b"."""
    moment = (now or datetime.now(UTC)).strftime(VERSION_TIME)
    return f"{moment}-{bundle_digest(directory)[:HASH_CHARS]}"


def version_number(now: datetime | None = None) -> int:
    return int((now or datetime.now(UTC)).strftime(VERSION_NUMBER))


def next_version(taken: list[str], now: datetime | None = None) -> int:
    """The time's number, or the second after the newest version taken where that is not later: versions
    stay in publication order, and read as times, even where two are published in one second or the
    clock steps back."""
    newest = max((int(name) for name in taken if is_version(name)), default=0)
    return max(version_number(now), second_after(newest))


def second_after(version: int) -> int:
    """The version one second after `version` read as a time (20250302021459 -> 20250302021500); one
    more where it reads as no time."""
    text = str(version)
    if len(text) == VERSION_DIGITS:
        with suppress(ValueError, OverflowError):
            return version_number(datetime.strptime(text, VERSION_NUMBER) + timedelta(seconds=1))
    return version + 1


def publish_bundle(
    local_dir: str, prefix: str, origin: str = "", promote: bool | PromotionDecision = True
) -> str:
    """Copy the bundle folder `local_dir` to `<prefix>/<version>/` with its serving layouts, then, where
    `promote` says so (True, or the promotion gate's decision, recorded with its reason), make it the
    version `LATEST` names and the servers serve. The prefix and the folder (against its manifest) are
    checked first. A failure names where the bundle still is: `origin` (where it lasts, e.g. the run's
    output) or else `local_dir`.

    Returns the version's URI.
    """
    if not (Path(local_dir) / MANIFEST).is_file():
        raise BundleError(f"{local_dir}: not a model bundle (no {MANIFEST}); nothing to publish")
    try:
        return copy_version(local_dir, prefix, origin, as_decision(promote))
    except (BundleError, DatasetError) as error:
        kept = f"the bundle is not published and stays at {origin or local_dir}"
        raise type(error)(f"{error}; {kept}") from error


def copy_version(local_dir: str, prefix: str, origin: str, decision: PromotionDecision) -> str:
    if not prefix:
        raise BundleError("no prefix to publish to: name a folder or URI such as s3://bucket/models/churn")
    if problem := prefix_problem(prefix):
        raise BundleError(f"{prefix}: {problem}")
    manifest = check_files(local_dir)
    filesystem, prefix_path = filesystem_for(prefix)
    now = datetime.now(UTC)
    settings, unrecorded = serving_settings(filesystem, prefix_path, prefix)
    with remote_errors(prefix):
        version = claim_version(filesystem, prefix_path, now)
        if unrecorded:
            replace_whole(filesystem, join(prefix_path, SETTINGS), settings_text(settings))
        target = join(prefix_path, str(version))
        filesystem.put(str(local_dir).rstrip("/") + "/", target, recursive=True)
        layouts = version_layouts(local_dir, manifest, settings.model_name, version)
        copy_layouts(filesystem, prefix_path, layouts)
        behind = left_behind(filesystem, prefix, str(version), layouts.served) if decision.promote else []
        record = published_record(local_dir, version, now, origin, layouts, decision, behind)
        # Last of the version's files: a version whose PUBLISHED.json exists has all its layouts.
        write_file(filesystem, join(target, PUBLISHED), json.dumps(record, indent=2).encode())
        for note in layouts.notes:
            logger.warning("published version %s of %s with %s", version, prefix, note)
        served_before = served_now(filesystem, prefix_path, settings)
        if decision.promote:
            promote_published(filesystem, prefix, record, layouts, behind)
        if pruned := prune_layouts(filesystem, prefix_path, settings, served_before):
            logger.info("pruned %s of %s (%s: keep_versions)", ", ".join(pruned), prefix, SETTINGS)
    return join(prefix, str(version))


def claim_version(filesystem: fsspec.AbstractFileSystem, prefix_path: str, now: datetime) -> int:
    """The next version; on a filesystem its folder is made here, so that two publishers in the same
    second cannot both take it (an object store has no folder to claim)."""
    try:
        taken = [PurePosixPath(path).name for path in filesystem.ls(prefix_path, detail=False)]
    except FileNotFoundError:
        taken = []
    version = next_version(taken, now)
    if not is_local(filesystem):
        return version
    os.makedirs(prefix_path, exist_ok=True)
    while True:
        try:
            os.mkdir(join(prefix_path, str(version)))
            return version
        except FileExistsError:
            version = second_after(version)


def copy_layouts(filesystem: fsspec.AbstractFileSystem, prefix_path: str, layouts: Layouts) -> None:
    for source, relative in layouts.copies.items():
        target = join(prefix_path, relative)
        if os.path.isdir(source):
            filesystem.put(source.rstrip("/") + "/", target, recursive=True)
        else:
            make_parent(filesystem, target)
            filesystem.put_file(source, target)
    for relative, text in layouts.files.items():
        write_file(filesystem, join(prefix_path, relative), text.encode())


def published_record(
    local_dir: str,
    version: int,
    now: datetime,
    origin: str,
    layouts: Layouts,
    decision: PromotionDecision,
    behind: list[str],
) -> dict:
    digest = bundle_digest(local_dir)
    return {
        "version": version,
        "id": f"{now.strftime(VERSION_TIME)}-{digest[:HASH_CHARS]}",  # readable_id's form
        "bundle_sha256": digest,
        "published": now.isoformat(timespec="seconds"),
        "origin": origin,  # where the bundle lasts, e.g. the run's output; "" where not told
        "layouts": sorted({*layouts.copies.values(), *layouts.files}),
        "notes": [*layouts.notes, *behind],
        "promotion": asdict(decision),
        "serve": layouts.served,  # what promoting this version writes: path under the prefix -> content
        "restore": restore_record(local_dir, layouts),
    }


def restore_record(local_dir: str, layouts: Layouts) -> dict:
    """How to copy the version's layouts back from its own folder once pruned (retention.py)."""
    copies = {
        target: Path(source).relative_to(local_dir).as_posix() for source, target in layouts.copies.items()
    }
    return {"copies": copies, "files": layouts.files}


def promote_published(
    filesystem: fsspec.AbstractFileSystem, prefix: str, record: dict, layouts: Layouts, behind: list[str]
) -> None:
    """Serve the version just published, unless LATEST names a newer one by now (a publisher that
    claimed a later version finished first): then it stays published beside it, and its PUBLISHED.json
    says why it is not served."""
    prefix_path, version = filesystem_for(prefix)[1], str(record["version"])
    newer = serve(filesystem, prefix_path, version, layouts.served)
    if not newer:
        warn_left_behind(prefix, version, behind)
        return
    note = (
        f"not served: version {newer}, published meanwhile, is newer and LATEST names it; "
        "promote_version serves this one"
    )
    logger.warning("published version %s of %s, %s", version, prefix, note)
    record = {**record, "notes": [*layouts.notes, note]}
    replace_whole(filesystem, join(prefix_path, version, PUBLISHED), json.dumps(record, indent=2).encode())


def left_behind(
    filesystem: fsspec.AbstractFileSystem, prefix: str, version: str, served: dict[str, str]
) -> list[str]:
    """What promoting `version` leaves serving another version: each server whose configuration under
    `prefix` it does not rewrite (`served`), for want of the export that server needs."""
    prefix_path = filesystem_for(prefix)[1]
    notes = []
    name = serving_settings(filesystem, prefix_path, prefix)[0].model_name
    for server, relative in server_configs(name).items():
        path = join(prefix_path, relative)
        if relative in served or not filesystem.isfile(path):
            continue
        kept = served_version(filesystem.cat_file(path).decode("utf-8", "replace")) or "?"
        notes.append(
            f"{server} still serves version {kept}, not version {version}, which LATEST names: "
            f"version {version} has no {SERVED_EXPORT[server]}"
        )
    return notes


def warn_left_behind(prefix: str, version: str, notes: list[str]) -> None:
    for note in notes:
        logger.warning("promoted version %s of %s, but %s", version, prefix, note)


def promote_version(prefix: str, version: str) -> str:
    """Make a published version the one `LATEST` names and the servers serve: a rollback, or a promotion
    decided after publishing. The version is checked as publishing checks a bundle first (`check_files`,
    and the exports its layouts hold): a file changed since is refused by name, and nothing moves. A
    version published before layouts existed moves `LATEST` alone; a server that has no export of the
    version stays where it is, with a warning. Returns the version's URI."""
    filesystem, prefix_path = filesystem_for(prefix)
    folder = join(prefix_path, version)
    with remote_errors(prefix):
        named = PurePosixPath(version).name == version and filesystem.isfile(join(folder, MANIFEST))
        record = published(filesystem, folder) if named else {}
    if not named:
        raise BundleError(f"{join(prefix, version)}: not a published version (no {MANIFEST})")
    check_version(filesystem, prefix, version, record)
    with remote_errors(prefix):
        served = record.get("serve", {})
        behind = left_behind(filesystem, prefix, version, served)
        if served:
            restore_layouts(filesystem, prefix_path, version, record)
        serve(filesystem, prefix_path, version, served, rollback=True)
    warn_left_behind(prefix, version, behind)
    return join(prefix, version)


def check_version(filesystem: fsspec.AbstractFileSystem, prefix: str, version: str, record: dict) -> None:
    """The version's folder against its manifest, and each export its layouts hold (the copies its
    PUBLISHED.json records, where not pruned) against the manifest's digest of it."""
    manifest = check_files(join(prefix, version))
    prefix_path = filesystem_for(prefix)[1]
    for relative, source in record.get("restore", {}).get("copies", {}).items():
        path = join(prefix_path, relative)
        if source in manifest.digests and filesystem.exists(path):
            check_stored(filesystem, path, manifest.digests[source], join(prefix, relative))


def published(filesystem: fsspec.AbstractFileSystem, folder: str) -> dict:
    """The version's PUBLISHED.json; empty for a version published before it existed."""
    path = join(folder, PUBLISHED)
    if not filesystem.isfile(path):
        return {}
    try:
        return json.loads(filesystem.cat_file(path))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BundleError(f"{path}: not valid JSON: {error}") from error


def serve(
    filesystem: fsspec.AbstractFileSystem,
    prefix_path: str,
    version: str,
    served: dict[str, str],
    rollback: bool = False,
) -> str:
    """The servers' configuration files first, then `LATEST`: a failure leaves `LATEST` as it was.
    Unless a `rollback` (promote_version), nothing is written where `LATEST` already names a newer
    version: that version is returned, else ""."""
    with turn_at_latest(filesystem, prefix_path):
        current = read_text(filesystem, join(prefix_path, LATEST)).strip()
        if not rollback and is_version(current) and is_version(version) and int(current) > int(version):
            return current
        for relative, text in served.items():
            replace_whole(filesystem, join(prefix_path, relative), text.encode())
        point_latest(filesystem, prefix_path, version)
    return ""


@contextmanager
def turn_at_latest(filesystem: fsspec.AbstractFileSystem, prefix_path: str) -> Iterator[None]:
    """On a filesystem, an exclusive lock on the prefix's folder, so that publishers read and move
    `LATEST` one at a time. An object store has no lock, nor has a mount that refuses one: there `LATEST`
    is read just before it is written, which leaves two publishers finishing at the same moment a
    window to cross in."""
    if not is_local(filesystem):
        yield
        return
    os.makedirs(prefix_path, exist_ok=True)
    descriptor = os.open(prefix_path, os.O_RDONLY)
    try:
        with suppress(OSError):  # e.g. an NFS mount emulating flock for files opened to write only
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # which releases the lock


def point_latest(filesystem: fsspec.AbstractFileSystem, prefix_path: str, version: str) -> None:
    """Replace `<prefix>/LATEST` whole with `version`."""
    replace_whole(filesystem, join(prefix_path, LATEST), version.encode())


def replace_whole(filesystem: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    if not is_local(filesystem):
        filesystem.pipe_file(path, data)  # an object store replaces the object in one write
        return
    # Written aside, then renamed over: truncating the file in place would let a reader find it empty.
    folder, name = os.path.split(path)
    os.makedirs(folder, exist_ok=True)
    temporary = f"{folder}/.{name}.{secrets.token_hex(8)}"
    # Created as any new file is (0666 less the umask): mkstemp's 0600 would hide it from other users.
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def write_file(filesystem: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """A new file, which nothing reads before the version is promoted."""
    make_parent(filesystem, path)
    filesystem.pipe_file(path, data)


def make_parent(filesystem: fsspec.AbstractFileSystem, path: str) -> None:
    if is_local(filesystem):
        os.makedirs(os.path.dirname(path), exist_ok=True)


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
