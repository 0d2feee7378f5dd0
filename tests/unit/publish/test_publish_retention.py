"""What a prefix keeps of its serving layouts: the model's name fixed by the first publish, the newest
versions (and whatever LATEST and the configuration files name) with older ones pruned and copied back on
a rollback, the int8 export beside model.onnx, and no labels file for a regression."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import fsspec
import pytest
from google.protobuf import text_format

from tasks.core.bundle.digests import content_digest
from tasks.core.bundle.manifest import read_manifest, write_manifest
from tasks.core.bundle.table_input import BundleError
from tasks.core.publish.retention import SETTINGS, model_name
from tasks.core.publish.versions import LATEST, PUBLISHED, promote_version, publish_bundle
from tests.unit.publish.test_publish import write_test_bundle
from tests.unit.publish.test_publish_layouts import (
    TfServingConfig,
    TritonConfig,
    read_triton_model,
    served_versions,
)

pytestmark = pytest.mark.slow  # writes model exports: seconds


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("retention-bundles")
    torch = write_test_bundle(root / "torch", seed=1)
    return {"torch": torch, "keras": write_test_bundle(root / "keras", seed=3, framework="tensorflow"),
            "int8": with_int8_file(torch, root / "int8")}  # fmt: skip


def with_int8_file(bundle: str, folder: Path) -> str:
    """The bundle with a kept int8 export, as evaluation lists one (a copy of model.onnx stands in)."""
    shutil.copytree(bundle, folder)
    shutil.copy(folder / "model.onnx", folder / "model.int8.onnx")
    manifest = read_manifest(fsspec.filesystem("file"), str(folder), str(folder))
    digests = {**manifest.digests, "model.int8.onnx": content_digest(folder / "model.int8.onnx")}
    write_manifest(str(folder), replace(manifest, files={**manifest.files, "onnx_int8": "model.int8.onnx"},
                                        digests=digests))  # fmt: skip
    return str(folder)


def publish(bundle: str, prefix: Path, promote: bool = True) -> str:
    return Path(publish_bundle(bundle, str(prefix), promote=promote)).name


def version_folders(folder: Path) -> list[str]:
    return sorted(entry.name for entry in folder.iterdir() if entry.is_dir())


# ---- the model's name --------------------------------------------------------------------------------


def test_a_copied_prefix_keeps_serving_its_model_under_the_first_name(bundles, tmp_path):
    prefix = tmp_path / "team-a" / "churn"
    publish(bundles["torch"], prefix)
    assert json.loads((prefix / SETTINGS).read_text())["model_name"] == "churn"
    copy = tmp_path / "team-b" / "churn-v2"
    shutil.copytree(prefix, copy)
    version = publish(bundles["torch"], copy)
    assert version_folders(copy / "triton") == ["churn"], "one served model, not a second"
    config = read_triton_model(copy / "triton" / "churn")
    assert config.name == "churn" and served_versions(config) == [int(version)]
    assert model_name(str(copy)) == "churn"


def test_a_prefix_published_before_the_name_was_recorded_keeps_its_model_s_name(bundles, tmp_path):
    prefix = tmp_path / "churn"
    publish(bundles["keras"], prefix)
    (prefix / SETTINGS).unlink()  # as a publish before SERVING.json left it
    renamed = tmp_path / "renamed"
    prefix.rename(renamed)
    publish(bundles["keras"], renamed)
    assert version_folders(renamed / "triton") == ["churn"]
    server = text_format.Parse((renamed / "tf_serving" / "models.config").read_text(), TfServingConfig())
    assert [config.name for config in server.model_config_list.config] == ["churn"]
    assert json.loads((renamed / SETTINGS).read_text())["model_name"] == "churn"


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [({"model_name": "a/b"}, "model_name 'a/b'"), ({"keep_versions": 0}, "keep_versions 0"),
     ({"keep_versions": "3"}, "keep_versions '3'"), (["churn"], "not a JSON object")],
)  # fmt: skip
def test_settings_that_cannot_be_served_are_refused_naming_the_file(bundles, tmp_path, settings, refusal):
    prefix = tmp_path / "churn"
    prefix.mkdir()
    (prefix / SETTINGS).write_text(json.dumps(settings))
    with pytest.raises(BundleError, match=f"{SETTINGS}: {refusal}"):
        publish(bundles["torch"], prefix)
    assert sorted(entry.name for entry in prefix.iterdir()) == [SETTINGS], "nothing published"


# ---- retention ---------------------------------------------------------------------------------------


def test_old_versions_are_pruned_from_the_layouts_but_latest_s_stays_and_a_rollback_copies_it_back(
    bundles, tmp_path
):
    prefix = tmp_path / "churn"
    model = prefix / "triton" / "churn"
    served = publish(bundles["torch"], prefix)
    held = [publish(bundles["torch"], prefix, promote=False) for _ in range(4)]
    assert json.loads((prefix / SETTINGS).read_text())["keep_versions"] == 3
    assert version_folders(model) == sorted([served, *held[-3:]]), "the newest 3, and what LATEST names"
    assert sorted(path.name for path in model.glob("labels-*.txt")) == [
        f"labels-{version}.txt" for version in sorted([served, *held[-3:]])
    ]
    assert (prefix / held[0] / PUBLISHED).is_file(), "bundle versions are never pruned"

    promote_version(str(prefix), held[0])  # a rollback to a pruned version
    assert (
        served_versions(read_triton_model(model)) == [int(held[0])]
        and (prefix / LATEST).read_text() == held[0]
    )
    assert (model / held[0] / "model.onnx").read_bytes() == (
        Path(bundles["torch"]) / "model.onnx"
    ).read_bytes()
    assert (model / f"labels-{held[0]}.txt").read_text().splitlines() == ["setosa", "versicolor", "virginica"]


def test_tf_serving_is_pruned_alike_and_keeps_the_version_its_config_serves(bundles, tmp_path):
    prefix = tmp_path / "churn"
    prefix.mkdir()
    (prefix / SETTINGS).write_text(json.dumps({"keep_versions": 1}))
    keras = publish(bundles["keras"], prefix)
    unserved = [publish(bundles["keras"], prefix, promote=False) for _ in range(2)]
    torch = [publish(bundles["torch"], prefix) for _ in range(2)]
    assert version_folders(prefix / "tf_serving") == [keras, unserved[1]], (
        "the newest, and what models.config serves"
    )
    assert version_folders(prefix / "triton" / "churn") == torch, "the newest, and what it served before"


def test_the_version_served_before_a_promotion_stays_until_the_next_publish(bundles, tmp_path):
    """TF Serving reads models.config only every --model_config_file_poll_wait_seconds (docs/serving.md)
    and unloads a model whose served version folder is gone: the promotion's prune must not take it."""
    prefix = tmp_path / "churn"
    prefix.mkdir()
    (prefix / SETTINGS).write_text(json.dumps({"keep_versions": 1}))
    first, second = publish(bundles["keras"], prefix), publish(bundles["keras"], prefix)
    assert version_folders(prefix / "tf_serving") == [first, second]
    server = text_format.Parse((prefix / "tf_serving" / "models.config").read_text(), TfServingConfig())
    (config,) = server.model_config_list.config
    assert list(config.model_version_policy.specific.versions) == [int(second)]
    third = publish(bundles["keras"], prefix)
    assert version_folders(prefix / "tf_serving") == [second, third]


def test_null_keeps_every_version(bundles, tmp_path):
    prefix = tmp_path / "churn"
    prefix.mkdir()
    (prefix / SETTINGS).write_text(json.dumps({"model_name": "churn", "keep_versions": None}))
    versions = [publish(bundles["torch"], prefix) for _ in range(5)]
    assert version_folders(prefix / "triton" / "churn") == versions


# ---- the int8 export, and regressions ---------------------------------------------------------------


def test_a_kept_int8_export_sits_beside_model_onnx_and_one_line_serves_it(bundles, tmp_path):
    prefix = tmp_path / "churn"
    version = publish(bundles["int8"], prefix)
    model = prefix / "triton" / "churn"
    int8 = (Path(bundles["int8"]) / "model.int8.onnx").read_bytes()
    assert (model / version / "model.int8.onnx").read_bytes() == int8
    written = (model / "config.pbtxt").read_text()
    assert text_format.Parse(written, TritonConfig()).default_model_filename == "", "model.onnx is served"
    swapped = written.replace(
        '# default_model_filename: "model.int8.onnx"', 'default_model_filename: "model.int8.onnx"'
    )
    assert swapped.count("\n") == written.count("\n") and swapped != written, "one line"
    assert text_format.Parse(swapped, TritonConfig()).default_model_filename == "model.int8.onnx"

    plain = publish(bundles["torch"], prefix)
    assert (
        not (model / plain / "model.int8.onnx").exists()
        and "int8" not in (model / "config.pbtxt").read_text()
    )


def test_the_layout_names_the_int8_export_as_the_int8_module_writes_it():
    from tasks.core.bundle import int8
    from tasks.core.publish import layouts

    assert (layouts.INT8_EXPORT, layouts.INT8_MODEL) == (int8.EXPORT, int8.INT8_FILE)


def test_a_regression_s_triton_folder_has_no_labels_file(tmp_path):
    from tests.unit.bundle.test_regression_bundle import regression_bundle

    prefix = tmp_path / "prices"
    version = publish(regression_bundle(tmp_path / "bundle", "float"), prefix)
    model = prefix / "triton" / "prices"
    assert list(model.glob("labels-*")) == []
    config = read_triton_model(model)
    assert served_versions(config) == [int(version)]
    assert [output.label_filename for output in config.output] == [""] * len(config.output)
