"""Publishing bundles under a prefix: versions, the LATEST pointer, and resolving a prefix back."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from tasks.core.data.files import DatasetError
from tasks.core.data.scaling import ScalerStats
from tasks.core.models.plugins import build, input_spec_for, mlp_spec
from tasks.core.serving.bundle import MANIFEST, BundleError, BundleRecord, load_bundle, write_bundle
from tasks.core.serving.publish import LATEST, new_version, publish_bundle, resolve_bundle
from tasks.core.training.records import Hardware, TrainingRun
from tests.conftest import blobs_frame

FEATURES = ["f0", "f1", "f2", "f3"]
CLASSES = ["setosa", "versicolor", "virginica"]


def write_test_bundle(folder: Path, seed: int = 0) -> str:
    """An untrained MLP for the blobs' features and classes as a bundle: seeded, so that two seeds
    give two models that score differently."""
    import torch

    from tasks.core.models.torch_models import save_torch_artifact

    spec = mlp_spec([16])
    torch.manual_seed(seed)
    model = build(spec, len(FEATURES), len(CLASSES), "pytorch")
    folder.mkdir(parents=True, exist_ok=True)
    artifact = folder.parent / f"{folder.name}-model.pt"
    save_torch_artifact(model, spec, input_spec_for(spec, len(FEATURES), len(CLASSES)), str(artifact))
    features = blobs_frame(n_rows=400)[FEATURES]
    run = TrainingRun("pytorch", "cpu", 1, "gloo", "fp32", "single-process", [], 0.0, 0.0, model=spec)
    record = BundleRecord(
        framework="pytorch",
        feature_names=FEATURES,
        scaler=ScalerStats(features.mean().tolist(), features.std().tolist()),
        class_labels=CLASSES,
        label_kind="string",
        label_column="species",
        source="blobs.parquet",
        data_fingerprint="0" * 32,
        run=run,
        billed=Hardware("cpu", 1),
    )
    return write_bundle(str(folder), str(artifact), record)


@pytest.fixture(scope="module")
def two_bundles(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("publish-bundles")
    return write_test_bundle(root / "first", seed=1), write_test_bundle(root / "second", seed=2)


def files_of(folder: str) -> dict[str, bytes]:
    root = Path(folder)
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_publishing_twice_keeps_both_versions_and_latest_names_the_second(two_bundles, tmp_path):
    first, second = two_bundles
    prefix = str(tmp_path / "models" / "blobs")
    first_uri = publish_bundle(first, prefix)
    second_uri = publish_bundle(second, prefix)
    assert first_uri != second_uri
    assert files_of(first_uri) == files_of(first) and files_of(second_uri) == files_of(second)
    assert (Path(prefix) / LATEST).read_text() == Path(second_uri).name
    assert resolve_bundle(prefix) == second_uri
    assert resolve_bundle(first_uri) == first_uri, "a bundle folder resolves to itself"
    assert load_bundle(resolve_bundle(prefix)).manifest == load_bundle(second).manifest


def test_versions_sort_by_publication_time_and_differ_by_content(two_bundles):
    first, second = two_bundles
    earlier, later = datetime(2025, 3, 1, 2, 4, 12, tzinfo=UTC), datetime(2025, 3, 1, 2, 4, 13, tzinfo=UTC)
    assert new_version(second, earlier) < new_version(first, later)
    assert new_version(first, earlier) != new_version(second, earlier)
    assert new_version(first, earlier).startswith("20250301T020412Z-")


def test_a_prefix_under_any_fsspec_uri_resolves_to_a_loadable_bundle(two_bundles):
    first, second = two_bundles
    prefix = "memory://mixedml-publish/models"
    publish_bundle(first, prefix)
    uri = publish_bundle(second, prefix)
    assert uri.startswith(prefix + "/") and resolve_bundle(prefix) == uri
    assert load_bundle(resolve_bundle(prefix)).manifest == load_bundle(second).manifest


def test_a_failed_copy_leaves_latest_at_the_previous_version(two_bundles, monkeypatch):
    first, second = two_bundles
    prefix = "memory://mixedml-publish/interrupted"
    first_uri = publish_bundle(first, prefix)

    def lose_the_connection(*args, **kwargs):
        raise ConnectionError("connection reset by peer")

    monkeypatch.setattr(MemoryFileSystem, "put", lose_the_connection)
    with pytest.raises(DatasetError, match="connection reset"):
        publish_bundle(second, prefix)
    assert resolve_bundle(prefix) == first_uri


@pytest.mark.parametrize(
    "latest, expected",
    [
        (None, ["no bundle.json", "no LATEST"]),
        ("20250301T020412Z-0badc0de", ["names version '20250301T020412Z-0badc0de'", "holds no bundle.json"]),
        ("../elsewhere", ["'../elsewhere' is not a version folder name"]),
        ("", ["'' is not a version folder name"]),
    ],
)
def test_a_prefix_that_names_no_bundle_is_refused_naming_it(tmp_path, latest, expected):
    prefix = tmp_path / "models"
    prefix.mkdir()
    if latest is not None:
        (prefix / LATEST).write_text(latest)
    with pytest.raises(BundleError) as error:
        resolve_bundle(str(prefix))
    assert str(prefix) in str(error.value)
    for words in expected:
        assert words in str(error.value)


def test_only_a_bundle_folder_is_published(tmp_path):
    with pytest.raises(BundleError, match=f"not a model bundle \\(no {MANIFEST}\\)"):
        publish_bundle(str(tmp_path), str(tmp_path / "models"))
    assert not (tmp_path / "models").exists()


def test_an_unreadable_uri_is_refused_naming_it():
    with pytest.raises(DatasetError, match="nosuchscheme://models/blobs"):
        resolve_bundle("nosuchscheme://models/blobs")


def test_the_publish_task_returns_the_version_uri_and_skips_an_empty_prefix(two_bundles, tmp_path):
    from flytekit.types.directory import FlyteDirectory

    from tasks.publish import publish_model

    first, _ = two_bundles
    uri = publish_model(bundle=FlyteDirectory(first), prefix=str(tmp_path / "models"))
    assert resolve_bundle(str(tmp_path / "models")) == uri
    assert files_of(uri) == files_of(first)
    assert publish_model(bundle=FlyteDirectory(first), prefix="") == ""


def teardown_module():
    """The memory filesystem lives as long as the process; other tests must not find these prefixes."""
    memory = fsspec.filesystem("memory")
    if memory.exists("/mixedml-publish"):  # a parallel session's worker may have run none of them
        memory.rm("/mixedml-publish", recursive=True)
