"""A bundle folder that does not match its manifest is refused when loading, naming the mismatch: weights
from another bundle (by their sha256, or by the model and shape they record where the manifest has no
digests), a class label removed, a scale that is not positive; a manifest edited since it was written
(its own digest), or stripped of a digest its format records; a bundle written before digests still
loads; publishing checks every file the manifest records, exports included."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from tasks.core.bundle import writing as bundles
from tasks.core.bundle.digests import MANIFEST_DIGEST, content_digest
from tasks.core.bundle.loading import check_files, load_bundle
from tasks.core.bundle.manifest import MANIFEST
from tasks.core.bundle.table_input import BundleError
from tasks.core.models.plugins import build, input_spec_for, mlp_spec
from tasks.core.publish.versions import publish_bundle
from tests.conftest import blobs_frame
from tests.unit.publish.test_publish import CLASSES, FEATURES, write_test_bundle, write_unexported_bundle


@pytest.fixture(scope="module")
def bundle_pair(tmp_path_factory) -> tuple[str, str]:
    """Two bundles of the same model, seeded differently: the first with its exports."""
    root = tmp_path_factory.mktemp("bundle_integrity")
    return write_test_bundle(root / "first", seed=1), write_unexported_bundle(root / "second", seed=2)


def manifest_of(folder: Path) -> dict:
    return json.loads((folder / MANIFEST).read_text())


def edit_manifest(folder: Path, change) -> None:
    manifest = manifest_of(folder)
    change(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))


def copy_of(bundle: str, root: Path, name: str = "bundle") -> Path:
    return Path(shutil.copytree(bundle, root / name))


def without_digests(manifest: dict) -> None:
    """As bundles were written before digests existed: format 2, no file's digest nor the manifest's."""
    del manifest["digests"], manifest[MANIFEST_DIGEST]
    manifest["format_version"] = 2


def weights_for(n_features: int, n_classes: int, path: Path) -> None:
    """Another run's weights: an MLP of the same builder for another input."""
    import torch

    from tasks.core.models.torch_models import save_torch_artifact

    spec = mlp_spec([16])
    torch.manual_seed(5)
    model = build(spec, n_features, n_classes, "pytorch")
    save_torch_artifact(model, spec, input_spec_for(spec, n_features, n_classes), str(path))


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_the_manifest_records_the_sha256_of_the_weights_and_each_export(bundle_pair):
    folder = Path(bundle_pair[0])
    manifest = manifest_of(folder)
    assert set(manifest["digests"]) == set(manifest["files"].values())
    assert "model.pt" in manifest["digests"] and len(manifest["digests"]) > 1, "the weights and an export"
    for path, digest in manifest["digests"].items():
        assert digest == content_digest(folder / path) and len(digest) == 64


def swap_weights(folder: Path, other: str) -> None:
    shutil.copyfile(Path(other) / "model.pt", folder / "model.pt")


def fewer_classes(folder: Path, other: str) -> None:
    weights_for(len(FEATURES), 4, folder / "model.pt")
    edit_manifest(folder, without_digests)


def class_label_removed(folder: Path, other: str) -> None:
    edit_manifest(folder, lambda manifest: manifest["class_labels"].pop())


def scale(value: float):
    def change(folder: Path, other: str) -> None:
        edit_manifest(folder, lambda manifest: manifest["scaler"]["scale"].__setitem__(2, value))

    return change


def class_labels_reversed(folder: Path, other: str) -> None:
    edit_manifest(folder, lambda manifest: manifest["class_labels"].reverse())


def digests_deleted(folder: Path, other: str) -> None:
    swap_weights(folder, other)
    edit_manifest(folder, lambda manifest: manifest.pop("digests"))


def weights_digest_deleted(folder: Path, other: str) -> None:
    swap_weights(folder, other)
    edit_manifest(folder, lambda manifest: manifest["digests"].pop("model.pt"))


def manifest_digest_deleted(folder: Path, other: str) -> None:
    edit_manifest(folder, lambda manifest: manifest.pop(MANIFEST_DIGEST))


MISMATCHES = {
    "weights of another bundle": (swap_weights, "model.pt does not match the bundle's manifest: its sha256 is"),
    "weights for another input, no digests": (fewer_classes, 'the weights record input {"n_features": 4, "n_classes": 4}, the manifest {"n_features": 4, "n_classes": 3}'),
    "a class label removed": (class_label_removed, "the manifest lists 2 class labels (setosa, versicolor), but its model was built for 3 (model.input.n_classes)"),
    "a negative scale": (scale(-1.5), "the scaler's scale of feature 'f2' is -1.5; a scale must be a positive finite number"),
    "a zero scale": (scale(0.0), "the scaler's scale of feature 'f2' is 0; a scale must be a positive finite number"),
}  # fmt: skip
# Edits of the manifest that its own digest, or a digest its format always records, tells.
EDITS = {
    "class labels reversed": (class_labels_reversed, f"bundle.json does not match its {MANIFEST_DIGEST}"),
    "digests deleted, weights swapped": (digests_deleted, "bundle.json: digests missing, which format 3 always records"),
    "the weights' digest deleted": (weights_digest_deleted, "bundle.json: digests['model.pt'] missing"),
    "the manifest's digest deleted": (manifest_digest_deleted, f"bundle.json: {MANIFEST_DIGEST} missing"),
}  # fmt: skip
MISMATCHES |= EDITS


@pytest.mark.slow  # writes a bundle with its model exports: seconds
@pytest.mark.parametrize("change", list(MISMATCHES))
def test_a_folder_that_does_not_match_its_manifest_is_refused_naming_the_mismatch(
    bundle_pair, tmp_path, change
):
    folder = copy_of(bundle_pair[0], tmp_path)
    edit, words = MISMATCHES[change]
    edit(folder, bundle_pair[1])
    with pytest.raises(BundleError) as error:
        load_bundle(str(folder))
    assert str(error.value).startswith(str(folder)) and words in str(error.value)


@pytest.mark.slow  # writes a bundle with its model exports: seconds
@pytest.mark.parametrize("change", list(EDITS))
def test_publishing_refuses_an_edited_manifest(bundle_pair, tmp_path, change):
    folder = copy_of(bundle_pair[0], tmp_path)
    edit, words = EDITS[change]
    edit(folder, bundle_pair[1])
    with pytest.raises(BundleError, match=re.escape(words)):
        publish_bundle(str(folder), str(tmp_path / "models"))
    assert not (tmp_path / "models").exists()


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_a_bundle_written_before_digests_loads_and_scores_as_it_did(bundle_pair, tmp_path):
    folder = copy_of(bundle_pair[0], tmp_path)
    edit_manifest(folder, without_digests)
    rows = blobs_frame(n_rows=20)
    old = load_bundle(str(folder))
    assert old.manifest.digests == {}
    np.testing.assert_array_equal(old.predict_proba(rows), load_bundle(bundle_pair[0]).predict_proba(rows))


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_the_manifest_s_digest_does_not_depend_on_its_layout(bundle_pair, tmp_path):
    folder = copy_of(bundle_pair[0], tmp_path)
    manifest = manifest_of(folder)
    (folder / MANIFEST).write_text(json.dumps(dict(reversed(manifest.items())), indent=4))
    assert load_bundle(str(folder)).manifest == load_bundle(bundle_pair[0]).manifest
    check_files(str(folder))


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_publishing_checks_every_recorded_file_exports_included(bundle_pair, tmp_path):
    folder = copy_of(bundle_pair[0], tmp_path)
    exports = [path for path in manifest_of(folder)["files"].values() if path != "model.pt"]
    assert exports, "a torch MLP over numeric features is exported"
    with (folder / exports[0]).open("ab") as file:
        file.write(b"\0")
    with pytest.raises(BundleError, match=f"{exports[0]} does not match the bundle's manifest"):
        publish_bundle(str(folder), str(tmp_path / "models"))
    assert not (tmp_path / "models").exists()


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_the_digests_survive_adding_the_metrics(bundle_pair, tmp_path):
    folder = copy_of(bundle_pair[0], tmp_path)
    digests = manifest_of(folder)["digests"]
    bundles.add_metrics(str(folder), some_metrics())
    assert manifest_of(folder)["digests"] == digests
    load_bundle(str(folder))


def some_metrics():
    from tasks.core.evaluation.metrics import classification_metrics

    return classification_metrics(np.array([0, 1, 2]), np.array([0, 1, 1]), CLASSES)
