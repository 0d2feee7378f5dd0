"""What a bundle records of where its model comes from: the hyperparameters and seed (the run's config),
the split, the code version and the training data's hash; a sha256 of every file beside the manifest,
the model card included; bundles written before provenance still load."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.core.bundle.digests import MANIFEST_DIGEST, content_digest
from tasks.core.bundle.loading import check_files, load_bundle
from tasks.core.bundle.manifest import (
    CONTENT_HASH,
    MANIFEST,
    METADATA_FINGERPRINT,
    MODEL_CARD,
    BundleRecord,
    CodeVersion,
    Provenance,
    SplitSettings,
    data_hash,
)
from tasks.core.bundle.model_card import USER_SECTIONS, render_card, write_model_card
from tasks.core.bundle.table_input import BundleError
from tasks.core.bundle.writing import add_metrics, write_bundle
from tasks.core.data.assignment import SplitConfig
from tasks.core.data.prepare import prepare_dataset
from tasks.core.models.plugins import mlp_spec
from tasks.core.publish.versions import publish_bundle
from tasks.core.training.config import TrainConfig
from tasks.core.training.records import Hardware, TrainingRun
from tasks.plumbing.code_version import git_checkout, source_tree_hash
from tests.conftest import blobs_frame
from tests.unit.bundle.test_bundle_integrity import some_metrics
from tests.unit.data.tables import prepare_in_pieces
from tests.unit.publish.test_publish import messy_prepared, messy_table, save_untrained

SPEC = mlp_spec([16])
CONFIG = TrainConfig(epochs=3, batch_size=32, model=SPEC, seed=7)


@pytest.fixture(scope="module")
def code() -> CodeVersion:
    """The code version as evaluation takes it, once: others' edits to the sources change its hash."""
    return CodeVersion.of(source_tree_hash(), git_checkout(), "")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, code) -> Path:
    """An untrained MLP over the messy table, written as evaluation writes it: with its provenance,
    then its metrics, then its model card."""
    root = tmp_path_factory.mktemp("provenance")
    data = root / "messy.parquet"
    data.write_bytes(b"the training rows")  # only hashed here
    table = replace(messy_prepared(messy_table()), split=SplitConfig(seed=CONFIG.seed))
    save_untrained(SPEC, len(table.feature_names), "pytorch", 0, str(root / "model.pt"))
    run = TrainingRun("pytorch", "cpu", "cpu", 1, "gloo", "fp32", "single-process", [], 0.0, 0.0, CONFIG)
    record = BundleRecord.of(table, run, Hardware("cpu", 1), data_fingerprint="0" * 32)
    provenance = Provenance(SplitSettings.of(table), code, data_hash(str(data)))
    folder = write_bundle(str(root / "bundle"), str(root / "model.pt"), record, provenance)
    add_metrics(folder, some_metrics())
    write_model_card(folder)
    return Path(folder)


def manifest_of(folder: Path) -> dict:
    return json.loads((folder / MANIFEST).read_text())


def test_the_manifest_holds_the_hyperparameters_split_code_version_and_data_hash(bundle, code):
    manifest = manifest_of(bundle)
    assert manifest["run"]["config"]["seed"] == 7 and manifest["run"]["config"]["batch_size"] == 32
    split = manifest["provenance"]["split"]
    assert split == {
        "seed": 7, "rows": {"train": 300, "val": 0, "test": 0}, "val_fraction": 0.0, "test_fraction": 0.0,
        "split_by": "",
    }  # fmt: skip
    assert manifest["provenance"]["code"] == asdict(code)
    assert len(code.source_sha256) == 64
    checkout = git_checkout()
    if checkout:  # tests run from a git checkout: the commit identifies the code
        assert (code.identified_by, code.commit) == ("git commit", checkout[0])
    else:
        assert code.identified_by == "source hash" and code.commit == ""
    data = manifest["provenance"]["data"]
    assert data == {"kind": CONTENT_HASH, "sha256": hashlib.sha256(b"the training rows").hexdigest()}
    loaded = load_bundle(str(bundle)).manifest
    assert loaded.record.run.config == CONFIG
    assert loaded.provenance.split.split_by == "" and loaded.provenance.data.kind == CONTENT_HASH


def test_only_a_local_input_gets_a_content_hash(tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    (folder / "part-0.parquet").write_bytes(b"rows")
    assert data_hash(str(folder)) == data_hash(f"file://{folder}")
    assert data_hash(str(folder)).sha256 == content_digest(folder)
    for elsewhere in ("s3://bucket/rows.parquet", "embedded:sklearn-digits", str(tmp_path / "gone.csv")):
        assert data_hash(elsewhere).kind == METADATA_FINGERPRINT and data_hash(elsewhere).sha256 == ""


def test_the_source_hash_follows_the_sources_and_no_checkout_has_no_commit(tmp_path):
    (tmp_path / "tasks").mkdir()
    (tmp_path / "workflows").mkdir()
    (tmp_path / "tasks" / "a.py").write_text("x = 1\n")
    before = source_tree_hash(tmp_path)
    (tmp_path / "tasks" / "notes.txt").write_text("not source")
    assert source_tree_hash(tmp_path) == before
    (tmp_path / "tasks" / "a.py").write_text("x = 2\n")
    assert source_tree_hash(tmp_path) != before
    assert git_checkout(tmp_path) is None


def test_every_file_of_the_bundle_has_its_sha256(bundle):
    manifest = manifest_of(bundle)
    assert manifest["files"]["model_card"] == MODEL_CARD
    assert set(manifest["digests"]) == set(manifest["files"].values())
    assert {"model.pt", "model.onnx", "mlflow", MODEL_CARD} <= set(manifest["digests"])
    recorded = [bundle / path for path in manifest["digests"]]
    for path in bundle.rglob("*"):
        if path.is_file() and path.name != MANIFEST:
            assert any(path == top or top in path.parents for top in recorded), path
    for path, digest in manifest["digests"].items():
        assert digest == content_digest(bundle / path)


@pytest.mark.parametrize("changed", [MODEL_CARD, "mlflow/MLmodel"])
def test_a_changed_file_beside_the_weights_is_refused(bundle, tmp_path, changed):
    folder = Path(shutil.copytree(bundle, tmp_path / "bundle"))
    with (folder / changed).open("a") as file:
        file.write("\nchanged")
    recorded = changed.split("/")[0]
    with pytest.raises(BundleError, match=f"{recorded} does not match the bundle's manifest"):
        check_files(str(folder))
    with pytest.raises(BundleError, match=f"{recorded} does not match"):
        publish_bundle(str(folder), str(tmp_path / "models"))
    assert not (tmp_path / "models").exists()


def test_a_filled_in_card_is_kept_and_recorded_by_writing_the_card_again(bundle, tmp_path):
    folder = Path(shutil.copytree(bundle, tmp_path / "bundle"))
    card = folder / MODEL_CARD
    filled = card.read_text().replace(USER_SECTIONS["Intended use"], "Ranking leads for the sales team.")
    card.write_text(filled)
    with pytest.raises(BundleError, match=f"after editing {MODEL_CARD}, record it with write_model_card"):
        check_files(str(folder))
    write_model_card(str(folder))
    assert card.read_text() == filled
    assert USER_SECTIONS["Limitations"] in filled, "the section left alone keeps its placeholder"
    check_files(str(folder))


def test_a_bundle_written_before_provenance_loads(bundle, tmp_path):
    folder = Path(shutil.copytree(bundle, tmp_path / "bundle"))
    manifest = manifest_of(folder)
    run = manifest["run"]  # as runs were recorded then: the device by name alone, the model without config
    run["model"], run["device"] = run.pop("config")["model"], run.pop("device_name")
    del manifest["provenance"], run["device_type"], manifest[MANIFEST_DIGEST]
    (folder / MANIFEST).write_text(json.dumps({**manifest, "format_version": 2}))
    old = load_bundle(str(folder)).manifest
    assert old.provenance is None and old.record.run.config == TrainConfig(model=SPEC)
    assert (old.record.run.device_type, old.record.run.device_name) == ("cpu", "cpu")
    write_model_card(str(folder))
    assert "not recorded: the bundle was written before" in (folder / MODEL_CARD).read_text()


def test_the_code_version_says_what_identifies_it():
    """A checkout's commit; in a pod, without one, the version the task was registered under."""
    assert CodeVersion.of("ab", ("c0ffee", True), "v1") == CodeVersion(
        "ab", "git commit", "c0ffee", True, "v1"
    )
    assert CodeVersion.of("ab", None, "c0ffee-dirty-12345678") == CodeVersion(
        "ab", "registered version", registered_version="c0ffee-dirty-12345678"
    )
    assert CodeVersion.of("ab", None, "") == CodeVersion("ab", "source hash")


def test_the_split_settings_say_how_the_rows_were_split():
    table = messy_prepared(messy_table())
    table.rows = {"train": 70, "val": 15, "test": 15}
    split = SplitSettings.of(table)
    assert (split.val_fraction, split.test_fraction) == (0.15, 0.15)
    assert split.describe() == "method not recorded, seed None; rows train 70, val 15, test 15"
    random = SplitSettings.of(replace(table, split=SplitConfig(seed=3)))
    assert (random.seed, random.split_by) == (3, "")
    assert random.describe() == "random (stratified), seed 3; rows train 70, val 15, test 15"
    timed = SplitSettings.of(replace(table, split=SplitConfig(seed=3, split_by="joined")))
    assert timed.describe() == "time-ordered by 'joined'; rows train 70, val 15, test 15"


@pytest.fixture(scope="module")
def timed_input(tmp_path_factory) -> str:
    """Blobs with a `day` column, 20 rows a day over 10 days."""
    path = tmp_path_factory.mktemp("timed") / "timed.parquet"
    frame = blobs_frame(n_rows=200, seed=1).assign(day=np.repeat(np.arange(10), 20))
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return str(path)


def test_a_time_ordered_run_names_its_column_in_the_provenance_and_the_card(bundle, timed_input, tmp_path):
    split = SplitConfig(seed=4, split_by="day")
    one_pod = prepare_dataset(timed_input, "species", str(tmp_path / "one"), split).table
    in_pieces = prepare_in_pieces(timed_input, "species", str(tmp_path / "pieces"), split, 2).table
    assert one_pod.split == in_pieces.split == split, "the table carries the settings it was split by"
    settings = SplitSettings.of(one_pod)
    assert (settings.split_by, settings.rows) == ("day", {"train": 140, "val": 40, "test": 20})
    manifest = load_bundle(str(bundle)).manifest
    card = render_card(replace(manifest, provenance=replace(manifest.provenance, split=settings)))
    assert "- split: time-ordered by 'day'; rows train 140, val 40, test 20" in card
    random = prepare_dataset(timed_input, "species", str(tmp_path / "random"), SplitConfig(seed=4)).table
    assert SplitSettings.of(random).describe().startswith("random (stratified), seed 4;")
