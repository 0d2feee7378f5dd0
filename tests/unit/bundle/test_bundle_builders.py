"""A bundle names the code that rebuilds its model, and loading imports and calls it: a built-in is
rebuilt always, a user's builder only where the caller trusts it (`trusted_builders`, `allow_user_code`).
Otherwise the bundle is refused naming the builder and how to allow it, before anything is imported,
whether the manifest or only the weights name it."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from tasks.core.bundle.digests import MANIFEST_DIGEST, content_digest, manifest_digest
from tasks.core.bundle.loading import load_bundle
from tasks.core.bundle.manifest import MANIFEST
from tasks.core.bundle.table_input import BundleError
from tasks.core.models.plugins import BuilderTrust
from tests.conftest import blobs_frame
from tests.unit.publish.test_publish import write_unexported_bundle

BUILDER_MODULE = """
from pathlib import Path

Path(__file__).with_suffix(".imported").touch()  # what importing it did, for the test to see


def build(spec, options):
    from tasks.core.models.torch_models import mlp

    return mlp(spec, options)
"""


@pytest.fixture(scope="module")
def mlp_bundle(tmp_path_factory) -> str:
    return write_unexported_bundle(tmp_path_factory.mktemp("builders") / "bundle", seed=1)


def renamed_builder(bundle: str, folder: Path, builder: str, in_manifest: bool = True) -> Path:
    """The bundle with its weights edited to name `builder`, as whoever hands over a bundle may edit
    it: the manifest's digests kept in step, and its model record too where `in_manifest`."""
    import torch

    folder = Path(shutil.copytree(bundle, folder))
    payload = torch.load(folder / "model.pt", weights_only=True)
    payload["model"]["builder"] = builder
    torch.save(payload, folder / "model.pt")
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["digests"]["model.pt"] = content_digest(folder / "model.pt")
    if in_manifest:
        manifest["model"]["model"]["builder"] = builder
    manifest[MANIFEST_DIGEST] = manifest_digest(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


@pytest.fixture
def user_module(tmp_path, monkeypatch) -> tuple[str, Path]:
    """An importable module of the user's, named for this test, that leaves a mark when imported."""
    name = f"user_builder_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(BUILDER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name, tmp_path / f"{name}.imported"


@pytest.mark.parametrize("in_manifest", [True, False], ids=["manifest and weights", "weights only"])
def test_a_bundle_naming_builtins_print_is_refused_and_nothing_runs(
    mlp_bundle, tmp_path, capsys, in_manifest
):
    folder = renamed_builder(mlp_bundle, tmp_path / "bundle", "builtins:print", in_manifest)
    with pytest.raises(BundleError) as error:
        load_bundle(str(folder))
    message = str(error.value)
    where = folder / (MANIFEST if in_manifest else "model.pt")
    assert message.startswith(f"{where}: the model is rebuilt by 'builtins:print', which is not a built-in")
    assert "trusted_builders=['builtins:print']" in message and "allow_user_code=True" in message
    assert capsys.readouterr().out == ""


def test_a_users_builder_is_not_imported_unless_trusted(mlp_bundle, tmp_path, user_module):
    name, imported = user_module
    folder = renamed_builder(mlp_bundle, tmp_path / "bundle", f"{name}:build")
    with pytest.raises(BundleError, match=f"rebuilt by '{name}:build', which is not a built-in"):
        load_bundle(str(folder), trusted_builders=["someone.else:build"])
    assert not imported.exists() and name not in sys.modules


@pytest.mark.parametrize("allow", ["listed", "a string", "any user code"])
def test_a_trusted_users_builder_rebuilds_the_model(mlp_bundle, tmp_path, user_module, allow):
    name, imported = user_module
    folder = renamed_builder(mlp_bundle, tmp_path / "bundle", f"{name}:build")
    reference = f"{name}:build"
    options = {
        "listed": {"trusted_builders": [reference]},
        "a string": {"trusted_builders": reference},
        "any user code": {"allow_user_code": True},
    }[allow]
    loaded = load_bundle(str(folder), **options)
    assert imported.exists()
    rows = blobs_frame(n_rows=20)
    np.testing.assert_array_equal(loaded.predict_proba(rows), load_bundle(mlp_bundle).predict_proba(rows))


@pytest.mark.parametrize(
    "builder, trust, allowed",
    [
        ("mlp", BuilderTrust(), True),
        ("cnn", BuilderTrust(), True),
        ("tasks.core.models.torch_models:mlp", BuilderTrust(), True),
        ("examples.residual:build", BuilderTrust(), False),
        ("examples.residual:build", BuilderTrust(frozenset({"examples.residual:build"})), True),
        ("examples.residual:build", BuilderTrust(any_code=True), True),
        ("builtins:print", BuilderTrust(frozenset({"examples.residual:build"})), False),
    ],
)
def test_built_ins_are_trusted_and_a_users_builder_only_when_allowed(builder, trust, allowed):
    assert trust.allows(builder) is allowed


def test_scoring_imports_a_users_builder_only_where_the_scoring_trusts_it(mlp_bundle, tmp_path, user_module):
    from tasks.core.scoring.run import score_dataset

    name, imported = user_module
    folder = renamed_builder(mlp_bundle, tmp_path / "bundle", f"{name}:build")
    rows = tmp_path / "rows.parquet"
    blobs_frame(n_rows=30).to_parquet(rows, index=False)
    with pytest.raises(BundleError, match=f"rebuilt by '{name}:build', which is not a built-in"):
        score_dataset(str(folder), str(rows), str(tmp_path / "refused"))
    assert not imported.exists() and not (tmp_path / "refused").exists()
    report = score_dataset(
        str(folder), str(rows), str(tmp_path / "scored"), trusted_builders=[f"{name}:build"]
    )
    assert imported.exists() and report.rows == 30
