"""`publish_to` is checked with the other workflow inputs, before any training: a local prefix that is a
file, lies under one or cannot be written, and a scheme no installed filesystem serves, each refused
naming the prefix; publishing there refuses the same way and names where the bundle stays."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tasks.core.bundle.table_input import BundleError
from tasks.core.publish import versions as publish
from tasks.core.publish.versions import publish_bundle
from tasks.core.validation import publish_problems
from tests.unit.publish.test_publish import write_unexported_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> str:
    return write_unexported_bundle(tmp_path_factory.mktemp("publish_prefix") / "bundle", seed=1)


def a_file(root: Path) -> Path:
    (root / "notes.txt").write_text("not a folder")
    return root / "notes.txt"


def unwritable(root: Path, monkeypatch) -> Path:
    """A folder this process may not write (root may write anywhere: access is refused here for it)."""
    folder = root / "readonly"
    folder.mkdir()
    folder.chmod(0o555)
    real_access = os.access
    monkeypatch.setattr(
        publish.os, "access", lambda path, mode: Path(path) != folder and real_access(path, mode)
    )
    return folder / "models"


BAD_PREFIXES = {
    "a file": (a_file, "is a file, not a folder to publish bundles under"),
    "under a file": (lambda root: a_file(root) / "models", "lies under {root}/notes.txt, which is a file"),
    "unknown scheme": (lambda root: "nosuchscheme://bucket/models", "cannot publish to this URI: Protocol not known"),
}  # fmt: skip


@pytest.fixture(params=[*BAD_PREFIXES, "unwritable"])
def bad_prefix(request, tmp_path, monkeypatch) -> tuple[str, str]:
    if request.param == "unwritable":
        return str(
            unwritable(tmp_path, monkeypatch)
        ), f"this process may not write to the folder {tmp_path}/readonly"
    make, words = BAD_PREFIXES[request.param]
    return str(make(tmp_path)), words.format(root=tmp_path)


def test_a_bad_prefix_is_refused_with_the_inputs_naming_it(bad_prefix):
    prefix, words = bad_prefix
    (problem,) = publish_problems(prefix)
    assert problem.startswith(f"input 'publish_to' = {prefix!r}: ") and words in problem


def test_publishing_to_a_bad_prefix_is_refused_naming_it_and_where_the_bundle_stays(bundle, bad_prefix):
    prefix, words = bad_prefix
    with pytest.raises(BundleError) as error:
        publish_bundle(bundle, prefix, origin="s3://runs/abc/model")
    message = str(error.value)
    assert message.startswith(f"{prefix}: ") and words in message
    assert message.endswith("the bundle is not published and stays at s3://runs/abc/model")


@pytest.mark.parametrize(
    "prefix", ["", "models/churn", "s3://bucket/models/churn", "memory://models", "file:///tmp/m"]
)
def test_a_usable_prefix_or_none_passes(prefix):
    assert publish_problems(prefix) == []


def test_a_new_folder_under_a_writable_one_passes(tmp_path):
    assert publish_problems(str(tmp_path / "models" / "churn")) == []


def test_the_publish_task_names_the_runs_bundle_when_publishing_fails(bundle, tmp_path):
    from flytekit.types.directory import FlyteDirectory

    from tasks.publish import publish_model

    with pytest.raises(Exception, match=f"stays at {bundle}"):
        publish_model(bundle=FlyteDirectory(bundle), prefix=str(a_file(tmp_path)))
