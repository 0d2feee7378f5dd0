"""What a publish prefix keeps: its settings in `SERVING.json`, and the serving layouts of its versions.

    <prefix>/SERVING.json   {"model_name": "churn", "keep_versions": 3}

`model_name` is the name Triton and TF Serving serve the model under. The first publish fixes it: the
name an earlier publish used (the model folder under `triton/`, or the one `tf_serving/models.config`
names) or else the prefix's last folder (layouts.serving_name). A copied or renamed prefix carries the
file, so its model keeps its name rather than becoming a second served model.

`keep_versions` bounds what the layouts hold (KServe's storage initializer copies the whole Triton
repository at each pod start): after each publish, the version folders of `triton/<model>/` (with their
labels files) and of `tf_serving/` are pruned to the newest `keep_versions` in each, plus whatever
`LATEST` and the two configuration files name. `null` keeps every version. The bundle versions
themselves (`<prefix>/<version>/`) are never pruned, so promoting a pruned version (a rollback) copies
its layouts back from its own folder first, as its `PUBLISHED.json` records them.

Edit the file (or write it before the first publish) to change either; publishing fills in what is
missing and refuses what is not valid.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath

import fsspec

from tasks.core.bundle.table_input import BundleError
from tasks.core.data.api import filesystem_for, remote_errors
from tasks.core.publish.layouts import (
    LATEST,
    TF_SERVING,
    TF_SERVING_CONFIG,
    TRITON,
    is_version,
    join,
    labels_file,
    served_version,
    server_configs,
    serving_name,
)

SETTINGS = "SERVING.json"
KEEP_VERSIONS = 3  # the served one, and two to roll back to without copying
VALID_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]*")
CONFIGURED_NAME = re.compile(r'^\s*name:\s*"((?:[^"\\]|\\.)*)"', re.MULTILINE)


@dataclass
class ServingSettings:
    model_name: str
    keep_versions: int | None = KEEP_VERSIONS  # None: every version


def serving_settings(
    filesystem: fsspec.AbstractFileSystem, prefix_path: str, prefix: str
) -> tuple[ServingSettings, bool]:
    """The prefix's settings, and whether `SERVING.json` must be written to hold them all."""
    path = join(prefix_path, SETTINGS)
    with remote_errors(prefix):
        text = filesystem.cat_file(path) if filesystem.isfile(path) else b"{}"
        earlier = earlier_name(filesystem, prefix_path)
    found = json_object(text, path)
    settings = ServingSettings(
        found.get("model_name") or earlier or serving_name(prefix), found.get("keep_versions", KEEP_VERSIONS)
    )
    if problem := settings_problem(settings):
        raise BundleError(f"{path}: {problem}")
    return settings, asdict(settings) != found


def settings_problem(settings: ServingSettings) -> str:
    name, keep = settings.model_name, settings.keep_versions
    if not isinstance(name, str) or not VALID_NAME.fullmatch(name):
        return f"model_name {name!r} is not a name Triton and TF Serving take (letters, digits, _ . -)"
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        return f"keep_versions {keep!r} is neither a whole number of at least 1 nor null (keep all)"
    return ""


def settings_text(settings: ServingSettings) -> bytes:
    return (json.dumps(asdict(settings), indent=2) + "\n").encode()


def json_object(text: bytes, path: str) -> dict:
    try:
        found = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BundleError(f"{path}: not valid JSON: {error}") from error
    if not isinstance(found, dict):
        raise BundleError(f"{path}: not a JSON object")
    return found


def earlier_name(filesystem: fsspec.AbstractFileSystem, prefix_path: str) -> str:
    """The name publishes before SERVING.json existed used: the one model folder under `triton/`, or the
    name `tf_serving/models.config` serves; "" where neither is there."""
    models = [PurePosixPath(path).name for path in folders(filesystem, join(prefix_path, TRITON))]
    if len(models) == 1:
        return models[0]
    config = join(prefix_path, TF_SERVING, TF_SERVING_CONFIG)
    if filesystem.isfile(config):
        from google.protobuf import text_encoding

        found = CONFIGURED_NAME.search(filesystem.cat_file(config).decode("utf-8", "replace"))
        return text_encoding.CUnescape(found.group(1)).decode() if found else ""
    return ""


def folders(filesystem: fsspec.AbstractFileSystem, path: str) -> list[str]:
    try:
        entries = filesystem.ls(path, detail=True)
    except FileNotFoundError:
        return []
    return [entry["name"] for entry in entries if entry["type"] == "directory"]


def served_now(
    filesystem: fsspec.AbstractFileSystem, prefix_path: str, settings: ServingSettings
) -> dict[str, str]:
    """Each server's configuration file (its path under the prefix) -> the version it serves now."""
    configs = server_configs(settings.model_name).values()
    return {config: served_version(read_text(filesystem, join(prefix_path, config))) for config in configs}


def prune_layouts(
    filesystem: fsspec.AbstractFileSystem,
    prefix_path: str,
    settings: ServingSettings,
    served_before: Mapping[str, str] | None = None,
) -> list[str]:
    """Remove the layouts of versions past the newest `keep_versions` of each server's folder, except
    the versions `LATEST` and that server's configuration file name, and the one it named before this
    publish promoted (`served_before`, from `served_now`): TF Serving reads its configuration file only
    every --model_config_file_poll_wait_seconds, and meanwhile unloads a model whose version folder is
    gone (tensorflow/serving, file_system_storage_path_source.cc: no version found, none aspired), so
    that version stays until the next publish. Returns what was removed, as paths under the prefix."""
    if settings.keep_versions is None:
        return []
    latest = read_text(filesystem, join(prefix_path, LATEST)).strip()
    before = served_before or {}
    removed = []
    for config in server_configs(settings.model_name).values():
        layout = str(PurePosixPath(config).parent)
        held = {latest, served_version(read_text(filesystem, join(prefix_path, config))), before.get(config)}
        found = [PurePosixPath(path).name for path in folders(filesystem, join(prefix_path, layout))]
        versions = sorted((name for name in found if is_version(name)), key=int, reverse=True)
        for version in versions[settings.keep_versions :]:
            if version not in held:
                removed += remove_version(filesystem, prefix_path, layout, version)
    return removed


def read_text(filesystem: fsspec.AbstractFileSystem, path: str) -> str:
    """The file's text; "" where there is none."""
    return filesystem.cat_file(path).decode("utf-8", "replace") if filesystem.isfile(path) else ""


def remove_version(
    filesystem: fsspec.AbstractFileSystem, prefix_path: str, layout: str, version: str
) -> list[str]:
    """The version's folder in the layout, then its labels file, where it has one."""
    removed = [f"{layout}/{version}"]
    filesystem.rm(join(prefix_path, layout, version), recursive=True)
    labels = join(prefix_path, layout, labels_file(int(version)))
    if layout.startswith(f"{TRITON}/") and filesystem.isfile(labels):
        filesystem.rm_file(labels)
        removed.append(f"{layout}/{labels_file(int(version))}")
    return removed


def restore_layouts(
    filesystem: fsspec.AbstractFileSystem, prefix_path: str, version: str, record: dict
) -> None:
    """Copy back, from the version's own folder, the layouts pruning removed: what its `PUBLISHED.json`
    records under `restore` (copies: path under the prefix -> path in the version folder; files: path
    -> content)."""
    restore = record.get("restore", {})
    for relative, source in restore.get("copies", {}).items():
        target = join(prefix_path, relative)
        if not filesystem.exists(target):
            copy_within(filesystem, join(prefix_path, version, source), target)
    for relative, text in restore.get("files", {}).items():
        if not filesystem.isfile(join(prefix_path, relative)):
            filesystem.pipe_file(join(prefix_path, relative), text.encode())
    missing = [path for path in record.get("layouts", []) if not filesystem.exists(join(prefix_path, path))]
    if missing:
        raise BundleError(
            f"version {version}'s layouts {missing} were pruned and its PUBLISHED.json does not say how to "
            "copy them back; publish its bundle again instead"
        )


def copy_within(filesystem: fsspec.AbstractFileSystem, source: str, target: str) -> None:
    """A file or a folder's files, from one path of the filesystem to another."""
    files = filesystem.find(source) if filesystem.isdir(source) else [source]
    for path in files:
        relative = PurePosixPath(path).relative_to(PurePosixPath(source)).as_posix()
        destination = target if relative == "." else join(target, relative)
        filesystem.makedirs(str(PurePosixPath(destination).parent), exist_ok=True)
        filesystem.copy(path, destination)


def model_name(prefix: str) -> str:
    """The name the prefix's model is served under: as its SERVING.json records it, or as the first
    publish will."""
    filesystem, prefix_path = filesystem_for(prefix)
    return serving_settings(filesystem, prefix_path, prefix)[0].model_name
