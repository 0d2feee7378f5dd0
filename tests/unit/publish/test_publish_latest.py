"""LATEST is replaced whole: a reader polling a prefix while bundles are published there finds the
previous version or the new one, never an empty or half-written LATEST; on a filesystem the new value is
written aside and renamed over it, and a failed write leaves LATEST and no temporary file behind. Two
publishers finishing out of order never move LATEST back to the older version."""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tasks.core.bundle.table_input import BundleError
from tasks.core.publish import versions as publish
from tasks.core.publish.retention import SETTINGS
from tasks.core.publish.versions import LATEST, PUBLISHED, promote_version, publish_bundle, resolve_bundle
from tests.unit.publish.test_publish import write_unexported_bundle


@pytest.fixture(scope="module")
def bundle_pair(tmp_path_factory) -> tuple[str, str]:
    """Two bundles of the same model, seeded differently."""
    root = tmp_path_factory.mktemp("publish_latest")
    return write_unexported_bundle(root / "first", seed=1), write_unexported_bundle(root / "second", seed=2)


PUBLISHES = 40


def leftovers(prefix: Path) -> list[str]:
    return [path.name for path in prefix.iterdir() if path.name.startswith(".")]


def test_a_reader_polling_latest_while_bundles_are_published_never_finds_it_invalid(bundle_pair, tmp_path):
    prefix = tmp_path / "models"
    published = {publish_bundle(folder, str(prefix)) for folder in bundle_pair}
    done, invalid, found = threading.Event(), [], []

    def poll() -> None:
        while True:
            finished = done.is_set()  # read once more after the last publish
            try:
                found.append(resolve_bundle(str(prefix)))
            except BundleError as error:
                invalid.append(str(error))
            if finished:
                return

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        for index in range(PUBLISHES):
            published.add(publish_bundle(bundle_pair[index % 2], str(prefix)))
    finally:
        done.set()
        reader.join()
    reads = len(found) + len(invalid)
    assert invalid == [], f"{len(invalid)} of {reads} reads found LATEST invalid, e.g. {invalid[0]}"
    assert found and set(found) <= published, "each read names a version that was published"
    assert leftovers(prefix) == []


def test_the_local_latest_is_written_aside_then_renamed_over(bundle_pair, tmp_path, monkeypatch):
    prefix = tmp_path / "models"
    renames = []
    rename = os.replace

    def spy(source, target):
        renames.append((Path(source), Path(target), Path(source).read_text()))
        rename(source, target)

    monkeypatch.setattr(publish.os, "replace", spy)
    uri = publish_bundle(bundle_pair[0], str(prefix))
    version = Path(uri).name
    assert [target.name for _, target, _ in renames] == [SETTINGS, LATEST], (
        "the first publish records settings"
    )
    assert renames[1][1:] == (prefix / LATEST, version)
    source = renames[1][0]
    assert source.parent == prefix and source.name != LATEST and not source.exists()
    assert (prefix / LATEST).read_text() == version and leftovers(prefix) == []
    (tmp_path / "new-file").write_text("")
    assert mode(prefix / LATEST) == mode(tmp_path / "new-file"), "as readable as any new file"


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_failed_rename_leaves_latest_as_it_was_and_no_temporary_file(bundle_pair, tmp_path, monkeypatch):
    prefix = tmp_path / "models"
    first = publish_bundle(bundle_pair[0], str(prefix))

    def full_disk(source, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(publish.os, "replace", full_disk)
    with pytest.raises(ValueError, match="No space left") as error:
        publish_bundle(bundle_pair[1], str(prefix))
    assert f"the bundle is not published and stays at {bundle_pair[1]}" in str(error.value)
    assert resolve_bundle(str(prefix)) == first and leftovers(prefix) == []


def test_two_publishers_finishing_out_of_order_leave_latest_on_the_newer_version(
    bundle_pair, tmp_path, monkeypatch
):
    """Each publisher claims its version, then both wait; the one that claimed first (the older version)
    goes on only once the other has published in full, and would move LATEST back."""
    prefix = tmp_path / "models"
    claimed, finished, versions = threading.Barrier(2), threading.Event(), []
    left_behind = publish.left_behind

    def in_racy_order(filesystem, uri, version, served):
        versions.append(version)
        claimed.wait(timeout=60)
        if version == min(versions, key=int):
            assert finished.wait(timeout=60), "the newer version was published"
        return left_behind(filesystem, uri, version, served)

    def publisher(folder: str) -> str:
        uri = publish_bundle(folder, str(prefix))
        finished.set()
        return uri

    monkeypatch.setattr(publish, "left_behind", in_racy_order)
    with ThreadPoolExecutor(2) as pool:
        uris = list(pool.map(publisher, bundle_pair))
    older, newer = sorted((Path(uri).name for uri in uris), key=int)
    assert (prefix / LATEST).read_text() == newer, "LATEST stays on the newer version"
    notes = json.loads((prefix / older / PUBLISHED).read_text())["notes"]
    assert notes[-1:] == [
        f"not served: version {newer}, published meanwhile, is newer and LATEST names it; "
        "promote_version serves this one"
    ]
    monkeypatch.setattr(publish, "left_behind", left_behind)
    assert promote_version(str(prefix), older) == str(prefix / older), "a deliberate rollback moves it back"
    assert (prefix / LATEST).read_text() == older and leftovers(prefix) == []
