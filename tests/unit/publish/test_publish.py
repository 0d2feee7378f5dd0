"""Publishing bundles under a prefix: versions, the LATEST pointer, and resolving a prefix back."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from tasks.core.bundle import writing as bundle_module
from tasks.core.bundle.export_plan import ExportResult
from tasks.core.bundle.loading import load_bundle
from tasks.core.bundle.manifest import MANIFEST, WEIGHTS, BundleRecord
from tasks.core.bundle.table_input import BundleError
from tasks.core.bundle.writing import write_bundle
from tasks.core.data.column_kinds import propose_kinds
from tasks.core.data.encoding import batch_stats
from tasks.core.data.files import DatasetError
from tasks.core.data.prepare import PreparedTable
from tasks.core.data.scaling import ScalerStats
from tasks.core.models.plugins import ModelSpec, build, input_spec_for, mlp_spec
from tasks.core.publish.versions import LATEST, PUBLISHED, publish_bundle, readable_id, resolve_bundle
from tasks.core.training.config import TrainConfig
from tasks.core.training.records import Hardware, TrainingRun
from tests.conftest import blobs_frame

FEATURES = ["f0", "f1", "f2", "f3"]
CLASSES = ["setosa", "versicolor", "virginica"]


def write_test_bundle(
    folder: Path, seed: int = 0, table: PreparedTable | None = None, framework: str = "pytorch"
) -> str:
    """An untrained MLP as a bundle, for the blobs' features and classes or for what `table` holds:
    seeded, so that two seeds give two models that score differently; a torch one, or a Keras one
    (whose exports add a SavedModel)."""
    spec = mlp_spec([16])
    n_features = len(table.feature_names) if table else len(FEATURES)
    folder.mkdir(parents=True, exist_ok=True)
    artifact = folder.parent / f"{folder.name}-{WEIGHTS[framework]}"
    save_untrained(spec, n_features, framework, seed, str(artifact))
    backend = "gloo" if framework == "pytorch" else "default"
    run = TrainingRun(
        framework, "cpu", "cpu", 1, backend, "fp32", "single-process", [], 0.0, 0.0, TrainConfig(model=spec)
    )
    if table:
        record = BundleRecord.of(table, run, Hardware("cpu", 1), data_fingerprint="0" * 32)
        return write_bundle(str(folder), str(artifact), record)
    features = blobs_frame(n_rows=400)[FEATURES]
    record = BundleRecord(
        framework=framework,
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


def save_untrained(spec: ModelSpec, n_features: int, framework: str, seed: int, path: str) -> None:
    input_spec = input_spec_for(spec, n_features, len(CLASSES))
    if framework == "pytorch":
        import torch

        from tasks.core.models.torch_models import save_torch_artifact

        torch.manual_seed(seed)
        save_torch_artifact(build(spec, n_features, len(CLASSES), framework), spec, input_spec, path)
        return
    import keras

    from tasks.core.models.keras_models import save_keras_artifact

    keras.utils.set_random_seed(seed)
    save_keras_artifact(build(spec, n_features, len(CLASSES), framework), spec, input_spec, path)


@contextmanager
def no_exports() -> Iterator[None]:
    """Bundles written without their serving exports (seconds each), where a test is about the rest."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bundle_module, "export_model", lambda *args, **kwargs: ExportResult())
        yield


def write_unexported_bundle(folder: Path, seed: int = 0) -> str:
    with no_exports():
        return write_test_bundle(folder, seed)


# ---- a table of text, booleans, dates and missing values ----------------------------------------------

# The raw feature columns: an identifier and a constant, which the encoding leaves out, and four it reads.
MESSY_COLUMNS = ["customer_id", "amount", "city", "member", "joined", "region"]
MESSY_READ = ["amount", "city", "member", "joined"]


def messy_table(rows: int = 300, seed: int = 0) -> pa.Table:
    """Rows as a user's table holds them, with the text label `species`: every read column has some
    missing values (nulls, and NaN in the numbers too)."""
    rng = np.random.default_rng(seed)
    missing = rng.random((4, rows)) < 0.1
    species = rng.integers(0, len(CLASSES), rows)
    amount = rng.normal(species * 3.0, 1.0)
    amount[missing[0] & (np.arange(rows) % 2 == 0)] = np.nan  # and null in the odd rows
    cities = np.array(["paris", "oslo", "rome", "lima", "kyiv"])[(species + rng.integers(0, 3, rows)) % 5]
    joined = [date(2020, 1, 1) + timedelta(days=int(day)) for day in rng.integers(0, 1500, rows)]
    return pa.table({
        "customer_id": [f"c{seed}-{row:05d}" for row in range(rows)],
        "amount": pa.array(amount, mask=missing[0] & (np.arange(rows) % 2 == 1)),
        "city": pa.array(cities.tolist(), mask=missing[1]),
        "member": pa.array((rng.random(rows) < 0.3 + 0.2 * species).tolist(), mask=missing[2]),
        "joined": pa.array(joined, pa.date32(), mask=missing[3]),
        "region": ["north"] * rows,
        "species": np.asarray(CLASSES)[species],
    })  # fmt: skip


def messy_prepared(table: pa.Table) -> PreparedTable:
    """What preprocessing makes of `table`, all rows taken as train rows: the encoding fitted on them,
    and the scaler over the encoded features."""
    raw = table.select(MESSY_COLUMNS)
    encoding = batch_stats(propose_kinds(raw.schema, sample=raw), raw).fit()
    encoded = encoding.transform(raw)
    scale = encoded.std(axis=0)
    counts = Counter(table.column("species").to_pylist())
    return PreparedTable(
        feature_names=encoding.encoded_names(),
        label_column="species",
        class_labels=CLASSES,
        class_counts={label: counts[label] for label in CLASSES},
        rows={"train": table.num_rows, "val": 0, "test": 0},
        scaler=ScalerStats(encoded.mean(axis=0).tolist(), np.where(scale > 0, scale, 1.0).tolist()),
        source="messy.parquet",
        columns=MESSY_COLUMNS,
        encoding=json.dumps(encoding.to_dict()),
    )


def write_messy_bundle(folder: Path, seed: int = 0) -> str:
    """An untrained MLP over the messy table's encoded features, as a bundle."""
    return write_test_bundle(folder, seed, messy_prepared(messy_table()))


@pytest.fixture(scope="module")
def two_bundles(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("publish-bundles")
    return write_test_bundle(root / "first", seed=1), write_test_bundle(root / "second", seed=2)


def files_of(folder: str) -> dict[str, bytes]:
    root = Path(folder)
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def bundle_files_of(version: str) -> dict[str, bytes]:
    """A published version's files less the record publishing adds beside the bundle's own."""
    files = files_of(version)
    assert json.loads(files.pop(PUBLISHED))["version"] == int(Path(version).name)
    return files


@pytest.mark.slow
def test_publishing_twice_keeps_both_versions_and_latest_names_the_second(two_bundles, tmp_path):
    first, second = two_bundles
    prefix = str(tmp_path / "models" / "blobs")
    first_uri = publish_bundle(first, prefix)
    second_uri = publish_bundle(second, prefix)
    assert first_uri != second_uri
    assert bundle_files_of(first_uri) == files_of(first) and bundle_files_of(second_uri) == files_of(second)
    assert (Path(prefix) / LATEST).read_text() == Path(second_uri).name
    assert resolve_bundle(prefix) == second_uri
    assert resolve_bundle(first_uri) == first_uri, "a bundle folder resolves to itself"
    assert load_bundle(resolve_bundle(prefix)).manifest == load_bundle(second).manifest


def test_readable_ids_sort_by_publication_time_and_differ_by_content(two_bundles):
    first, second = two_bundles
    earlier, later = datetime(2025, 3, 1, 2, 4, 12, tzinfo=UTC), datetime(2025, 3, 1, 2, 4, 13, tzinfo=UTC)
    assert readable_id(second, earlier) < readable_id(first, later)
    assert readable_id(first, earlier) != readable_id(second, earlier)
    assert readable_id(first, earlier).startswith("20250301T020412Z-")


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


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_a_bundle_with_an_encoding_is_published_and_scores_raw_rows_from_the_prefix(tmp_path):
    folder = write_messy_bundle(tmp_path / "messy")
    uri = publish_bundle(folder, "memory://mixedml-publish/messy")
    assert resolve_bundle("memory://mixedml-publish/messy") == uri
    written = {name for name in files_of(folder) if not name.startswith("mlflow/")}
    assert written == {MANIFEST, "model.pt", "model.onnx"} and "mlflow/MLmodel" in files_of(folder)
    published, local = load_bundle(uri), load_bundle(folder)
    assert published.manifest == local.manifest
    assert local.encoding is not None and published.encoding == local.encoding
    rows = messy_table(50, seed=9)
    np.testing.assert_array_equal(published.predict_proba(rows), local.predict_proba(rows))


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
    assert bundle_files_of(uri) == files_of(first)
    assert publish_model(bundle=FlyteDirectory(first), prefix="") == ""


def teardown_module():
    """The memory filesystem lives as long as the process; other tests must not find these prefixes."""
    memory = fsspec.filesystem("memory")
    if memory.exists("/mixedml-publish"):  # a parallel session's worker may have run none of them
        memory.rm("/mixedml-publish", recursive=True)
