"""The serving layouts a publish writes, checked as the servers read them: Triton's model repository
(integer version folders under a model folder, config.pbtxt parsed against Triton's field names, the
inputs and outputs onnxruntime finds in the file, the labels of the classification output), TF Serving's
`<int>/saved_model.pb` and model config; integer versions in publication order; LATEST and the served
version moving together, or not at all with promote=False; a version whose files changed since it was
published is not promoted; prefixes published before integer versions."""

from __future__ import annotations

import json
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

import fsspec
import numpy as np
import onnxruntime
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from benchmarks.triton_check import TritonRefusal, json_inputs, json_request
from tasks.core.bundle.loading import load_bundle
from tasks.core.bundle.manifest import MANIFEST
from tasks.core.bundle.raw_inputs import raw_feeds
from tasks.core.publish import versions as publish
from tasks.core.publish.layouts import TF_SERVING_ROOT, serving_name
from tasks.core.publish.versions import (
    LATEST,
    PUBLISHED,
    is_version,
    next_version,
    promote_version,
    publish_bundle,
    resolve_bundle,
)
from tests.conftest import blobs_frame
from tests.unit.publish.test_publish import (
    CLASSES,
    FEATURES,
    files_of,
    messy_table,
    write_messy_bundle,
    write_test_bundle,
    write_unexported_bundle,
)

# Each test here writes a model export (torch.onnx, tf2onnx, a SavedModel): seconds, so not in make test-fast.
pytestmark = pytest.mark.slow

# ---- the servers' configuration formats: the fields used here, named and typed as their protos do ------
# Triton: model_config.proto (triton-inference-server/common); TF Serving: model_server_config.proto and
# file_system_storage_path_source.proto. Text format refuses a field or an enum value the schema lacks.

OPTIONAL, REPEATED = (
    descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
)
KINDS = {
    "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    "int32": descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
    "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
    "uint32": descriptor_pb2.FieldDescriptorProto.TYPE_UINT32,
    "uint64": descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
}  # fmt: skip
TRITON_DATA_TYPES = ["TYPE_INVALID", "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64",
                     "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32",
                     "TYPE_FP64", "TYPE_STRING", "TYPE_BF16"]  # fmt: skip
# message -> (field, number, type: a scalar kind, a message or "DataType", repeated)
TRITON_MESSAGES = {
    "ModelTensorReshape": [("shape", 1, "int64", True)],
    "ModelInput": [("name", 1, "string", False), ("data_type", 2, "DataType", False),
                   ("dims", 4, "int64", True), ("reshape", 5, "ModelTensorReshape", False)],
    "ModelOutput": [("name", 1, "string", False), ("data_type", 2, "DataType", False),
                    ("dims", 3, "int64", True), ("label_filename", 4, "string", False),
                    ("reshape", 5, "ModelTensorReshape", False)],
    "Latest": [("num_versions", 1, "uint32", False)],
    "All": [],
    "Specific": [("versions", 1, "int64", True)],
    "ModelVersionPolicy": [("latest", 1, "Latest", False), ("all", 2, "All", False),
                           ("specific", 3, "Specific", False)],
    "ModelDynamicBatching": [("preferred_batch_size", 1, "int32", True),
                             ("max_queue_delay_microseconds", 2, "uint64", False)],
    "ModelConfig": [("name", 1, "string", False), ("platform", 2, "string", False),
                    ("version_policy", 3, "ModelVersionPolicy", False), ("max_batch_size", 4, "int32", False),
                    ("input", 5, "ModelInput", True), ("output", 6, "ModelOutput", True),
                    ("default_model_filename", 8, "string", False), ("dynamic_batching", 11, "ModelDynamicBatching", False), ("backend", 17, "string", False)],
}  # fmt: skip
TF_SERVING_MESSAGES = {
    "Latest": [("num_versions", 1, "uint32", False)],
    "All": [],
    "Specific": [("versions", 1, "int64", True)],
    "ServableVersionPolicy": [("latest", 100, "Latest", False), ("all", 101, "All", False),
                              ("specific", 102, "Specific", False)],
    "ModelConfig": [("name", 1, "string", False), ("base_path", 2, "string", False),
                    ("model_platform", 4, "string", False),
                    ("model_version_policy", 7, "ServableVersionPolicy", False)],
    "ModelConfigList": [("config", 1, "ModelConfig", True)],
    "ModelServerConfig": [("model_config_list", 1, "ModelConfigList", False)],
}  # fmt: skip


def message_class(package: str, messages: dict, name: str, enum: list[str] | None = None):
    """The class of `name` in a file of `messages` (and the enum DataType, where given)."""
    file = descriptor_pb2.FileDescriptorProto(name=f"{package}.proto", package=package, syntax="proto3")
    if enum:
        file.enum_type.add(name="DataType").value.extend(
            descriptor_pb2.EnumValueDescriptorProto(name=value, number=number)
            for number, value in enumerate(enum)
        )
    for message, message_fields in messages.items():
        described = file.message_type.add(name=message)
        for field_name, number, kind, repeated in message_fields:
            field = described.field.add(
                name=field_name, number=number, label=REPEATED if repeated else OPTIONAL
            )
            if kind in KINDS:
                field.type = KINDS[kind]
            else:
                field.type = (
                    descriptor_pb2.FieldDescriptorProto.TYPE_ENUM
                    if kind == "DataType"
                    else descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
                )
                field.type_name = f".{package}.{kind}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))


TritonConfig = message_class("inference", TRITON_MESSAGES, "ModelConfig", TRITON_DATA_TYPES)
TfServingConfig = message_class("tensorflow.serving", TF_SERVING_MESSAGES, "ModelServerConfig")
# onnxruntime's element types -> Triton's (model_configuration.md, "Datatypes")
ORT_TYPES = {"tensor(float)": "TYPE_FP32", "tensor(double)": "TYPE_FP64", "tensor(string)": "TYPE_STRING",
             "tensor(int64)": "TYPE_INT64", "tensor(bool)": "TYPE_BOOL"}  # fmt: skip


# ---- bundles and prefixes -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, str]:
    """Untrained bundles with their exports: torch (ONNX of "features"), torch over raw columns of
    text, booleans and dates (ONNX of named inputs), Keras (SavedModel and ONNX)."""
    root = tmp_path_factory.mktemp("layout-bundles")
    return {
        "torch": write_test_bundle(root / "torch", seed=1),
        "raw columns": write_messy_bundle(root / "messy", seed=2),
        "keras": write_test_bundle(root / "keras", seed=3, framework="tensorflow"),
    }


@pytest.fixture(scope="module")
def unexported(tmp_path_factory) -> str:
    return write_unexported_bundle(tmp_path_factory.mktemp("layout-unexported") / "bundle", seed=4)


def latest(prefix: Path) -> str:
    return (prefix / LATEST).read_text()


# ---- Triton ---------------------------------------------------------------------------------------------


def read_triton_model(model: Path):
    """config.pbtxt as Triton parses it, with Triton's rules for the model folder checked."""
    config = text_format.Parse((model / "config.pbtxt").read_text(), TritonConfig())
    assert config.name == model.name, "a config's name must be its model folder's"
    assert config.backend == "onnxruntime" and config.max_batch_size > 0
    assert config.HasField("dynamic_batching")
    folders = [entry.name for entry in model.iterdir() if entry.is_dir()]
    assert folders and all(is_version(name) for name in folders), f"only integer versions: {folders}"
    return config


def served_versions(config) -> list[int]:
    policy = config.version_policy
    assert policy.HasField("specific") and not (policy.HasField("latest") or policy.HasField("all"))
    return list(config.version_policy.specific.versions)


def assert_tensors_match_the_file(configured, found) -> None:
    """Each configured input or output as onnxruntime finds it in the file: name, type, and its shape
    less the batch dimension (Triton's dims where max_batch_size > 0; one value a row is [1] reshaped
    to [])."""
    assert [tensor.name for tensor in configured] == [tensor.name for tensor in found]
    for tensor, actual in zip(configured, found, strict=True):
        data_types = tensor.DESCRIPTOR.fields_by_name["data_type"].enum_type
        assert data_types.values_by_number[tensor.data_type].name == ORT_TYPES[actual.type], tensor.name
        batch, *rest = actual.shape
        assert not isinstance(batch, int), f"{tensor.name}: the batch dimension must be dynamic"
        expected = [size if isinstance(size, int) else -1 for size in rest]
        if expected:
            assert list(tensor.dims) == expected and not tensor.HasField("reshape"), tensor.name
        else:
            assert list(tensor.dims) == [1] and list(tensor.reshape.shape) == [], tensor.name


def triton_batch(session: onnxruntime.InferenceSession, config, request: bytes) -> dict:
    """A JSON request answered as Triton answers it: its inputs read as Triton's HTTP front end reads
    them (a gap as NaN; `null` refused with TritonRefusal, HTTP 500), fed shaped as Triton sends a batch:
    [batch, *dims] per input, reshaped where configured."""
    rows = json_inputs(request)
    feeds = {}
    for tensor in config.input:
        values = rows[tensor.name]
        shape = [len(values), *tensor.dims]
        feeds[tensor.name] = values.reshape(shape if not tensor.HasField("reshape") else [len(values)])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


def feeds_of(kind: str, bundle_folder: str, rows: int = 5) -> dict[str, np.ndarray]:
    if kind == "raw columns":
        return raw_feeds(messy_table(rows, seed=5), load_bundle(bundle_folder).encoding)
    return {"features": blobs_frame(n_rows=rows)[FEATURES].to_numpy(np.float64)}


@pytest.mark.parametrize("kind", ["torch", "raw columns", "keras"])
def test_the_triton_repository_serves_latest_with_the_onnx_file_s_inputs_outputs_and_labels(
    exported, kind, tmp_path
):
    prefix = tmp_path / "models" / "churn"
    version = Path(publish_bundle(exported[kind], str(prefix))).name
    repository = prefix / "triton"
    assert [entry.name for entry in repository.iterdir()] == ["churn"], (
        "one model folder, named as the prefix"
    )
    model = repository / "churn"
    config = read_triton_model(model)
    assert served_versions(config) == [int(version)] and version == latest(prefix)
    onnx_file = model / version / "model.onnx"
    assert onnx_file.read_bytes() == (Path(exported[kind]) / "model.onnx").read_bytes()
    session = onnxruntime.InferenceSession(str(onnx_file))
    assert_tensors_match_the_file(config.input, session.get_inputs())
    assert_tensors_match_the_file(config.output, session.get_outputs())
    (labelled,) = [output for output in config.output if output.label_filename]
    assert labelled.name == "probabilities"
    labels = (model / labelled.label_filename).read_text().splitlines()
    manifest = json.loads((Path(exported[kind]) / MANIFEST).read_text())
    assert labels == [str(label) for label in manifest["class_labels"]] == CLASSES
    assert list(labelled.dims) == [len(labels)], "a label for each probability, in output order"
    outputs = triton_batch(session, config, json_request(feeds_of(kind, exported[kind]), []))
    assert outputs["probabilities"].shape == (5, len(CLASSES))


def test_a_gap_reaches_triton_as_json_nan_and_a_null_is_refused(exported, tmp_path):
    prefix = tmp_path / "models" / "churn"
    version = Path(publish_bundle(exported["raw columns"], str(prefix))).name
    model = prefix / "triton" / "churn"
    session = onnxruntime.InferenceSession(str(model / version / "model.onnx"))
    rows = messy_table(6, seed=5)
    feeds = raw_feeds(rows, load_bundle(exported["raw columns"]).encoding)
    numbers = [name for name, array in feeds.items() if array.dtype.kind == "f"]
    assert numbers and any(np.isnan(feeds[name]).any() for name in numbers), "the rows have number gaps"
    answered = triton_batch(session, read_triton_model(model), json_request(feeds, []))
    expected = load_bundle(exported["raw columns"]).predict_proba(rows)
    np.testing.assert_allclose(answered["probabilities"], expected, atol=1e-5)
    with pytest.raises(TritonRefusal, match="HTTP 500.*non-number as double"):
        triton_batch(session, read_triton_model(model), json_request(feeds, [], null_gaps=True))


def test_a_column_name_any_text_reaches_config_pbtxt_and_parses_back():
    from tasks.core.publish.layouts import Tensor, triton_config

    name = 'home "city"\\ünïcode'
    text = triton_config(
        "m", 7, [Tensor(name, "TYPE_STRING", [1])], [Tensor("label", "TYPE_STRING", [1], [])], "l.txt"
    )
    config = text_format.Parse(text, TritonConfig())
    assert config.input[0].name == name and list(config.output[0].reshape.shape) == []


# ---- TF Serving -----------------------------------------------------------------------------------------


def test_tf_serving_loads_the_latest_saved_model_from_its_integer_folder(exported, tmp_path):
    prefix = tmp_path / "models" / "churn"
    first = Path(publish_bundle(exported["keras"], str(prefix))).name
    second = Path(publish_bundle(exported["keras"], str(prefix), promote=False)).name
    base = prefix / "tf_serving"
    assert sorted(entry.name for entry in base.iterdir() if entry.is_dir()) == sorted([first, second])
    assert all((base / version / "saved_model.pb").is_file() for version in (first, second))
    server = text_format.Parse((base / "models.config").read_text(), TfServingConfig())
    (config,) = server.model_config_list.config
    assert (config.name, config.base_path, config.model_platform) == (
        "churn",
        f"{TF_SERVING_ROOT}/churn",
        "tensorflow",
    )
    assert list(config.model_version_policy.specific.versions) == [int(first)] and latest(prefix) == first

    import tensorflow as tf

    signature = tf.saved_model.load(str(base / first)).signatures["serving_default"]
    rows = blobs_frame(n_rows=6)[FEATURES]
    outputs = signature(features=tf.constant(rows.to_numpy(np.float64)))
    expected = load_bundle(exported["keras"]).predict_proba(rows)
    np.testing.assert_allclose(outputs["probabilities"].numpy(), expected, atol=1e-5)


def test_a_torch_bundle_leaves_tf_serving_on_the_keras_version_and_says_so(exported, tmp_path, caplog):
    prefix = tmp_path / "models"
    keras = Path(publish_bundle(exported["keras"], str(prefix))).name
    served = (prefix / "tf_serving" / "models.config").read_bytes()
    with caplog.at_level("WARNING", logger=publish.__name__):
        version = Path(publish_bundle(exported["torch"], str(prefix))).name
    assert not (prefix / "tf_serving" / version).exists()
    assert (prefix / "tf_serving" / "models.config").read_bytes() == served
    assert served_versions(read_triton_model(prefix / "triton" / "models")) == [int(version)]
    assert latest(prefix) == version
    said = (
        f"tf_serving still serves version {keras}, not version {version}, which LATEST names: "
        f"version {version} has no SavedModel"
    )
    assert [said in message for message in caplog.messages] == [True], "one warning, naming both versions"
    notes = json.loads((prefix / version / PUBLISHED).read_text())["notes"]
    assert [said in note for note in notes] == [True]

    caplog.clear()
    held = Path(publish_bundle(exported["torch"], str(prefix), promote=False)).name
    assert json.loads((prefix / held / PUBLISHED).read_text())["notes"] == [], "nothing served moves"
    with caplog.at_level("WARNING", logger=publish.__name__):
        promote_version(str(prefix), held)
    assert any(f"tf_serving still serves version {keras}, not version {held}" in m for m in caplog.messages)
    caplog.clear()
    with caplog.at_level("WARNING", logger=publish.__name__):
        promote_version(str(prefix), keras)  # a rollback to the Keras version moves both servers
    assert caplog.messages == [] and served_versions(read_triton_model(prefix / "triton" / "models")) == [
        int(keras)
    ]


def test_the_published_record_holds_the_promotion_decision(exported, tmp_path):
    prefix = tmp_path / "models"
    promoted = Path(publish_bundle(exported["torch"], str(prefix))).name
    held = Path(publish_bundle(exported["torch"], str(prefix), promote=False)).name
    records = [json.loads((prefix / version / PUBLISHED).read_text()) for version in (promoted, held)]
    assert [record["promotion"] for record in records] == [
        {"promote": True, "reason": "published with promote=True", "new": None, "current": None},
        {"promote": False, "reason": "published with promote=False", "new": None, "current": None},
    ]


# ---- versions, LATEST and the served version -------------------------------------------------------------


def test_versions_are_integers_in_publication_order_that_int64_holds():
    morning = datetime(2026, 11, 25, 20, 17, 44, tzinfo=UTC)
    assert next_version([], morning) == 20261125201744
    assert next_version(["20261125201744", "triton", "LATEST"], morning) == 20261125201745, (
        "taken: a second on"
    )
    assert next_version(["20261125201750"], morning) == 20261125201751, "a clock stepping back stays in order"
    assert next_version(["20250301T020412Z-3f9c2a1b", "0999"], morning) == 20261125201744, "not versions"
    assert next_version([], datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)) < 2**63
    assert next_version(["20261125201759"], morning) == 20261125201800, "a second on is a time, not :60"
    assert next_version(["20261231235959"], morning) == 20270101000000
    assert next_version(["20261125201760"], morning) == 20261125201761, "a number that is no time: one more"


def test_bundles_published_in_one_second_get_increasing_versions(exported, tmp_path, monkeypatch):
    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 11, 25, 20, 17, 59, tzinfo=UTC)

    monkeypatch.setattr(publish, "datetime", Frozen)
    prefix = tmp_path / "models"
    versions = [Path(publish_bundle(exported["torch"], str(prefix))).name for _ in range(3)]
    assert versions == ["20261125201759", "20261125201800", "20261125201801"]
    record = json.loads((prefix / versions[1] / PUBLISHED).read_text())
    assert record["version"] == 20261125201800 and record["id"].startswith("20261125T201759Z-")
    assert record["bundle_sha256"] == publish.bundle_digest(exported["torch"])
    assert record["id"].endswith(record["bundle_sha256"][:8])


def test_latest_and_the_served_version_move_together_and_promote_false_moves_neither(exported, tmp_path):
    prefix = tmp_path / "models" / "churn"
    model = prefix / "triton" / "churn"
    first = Path(publish_bundle(exported["torch"], str(prefix))).name
    served = (model / "config.pbtxt").read_bytes()
    held = Path(publish_bundle(exported["torch"], str(prefix), promote=False)).name
    assert int(held) > int(first)
    assert latest(prefix) == first and resolve_bundle(str(prefix)) == str(prefix / first)
    assert (model / "config.pbtxt").read_bytes() == served, "the servers keep serving the promoted version"
    assert (model / held / "model.onnx").is_file() and (model / f"labels-{held}.txt").is_file()
    assert load_bundle(str(prefix / held)).manifest == load_bundle(exported["torch"]).manifest

    assert promote_version(str(prefix), held) == str(prefix / held), "a promotion decided later"
    assert latest(prefix) == held and served_versions(read_triton_model(model)) == [int(held)]
    newest = Path(publish_bundle(exported["torch"], str(prefix))).name
    assert latest(prefix) == newest and served_versions(read_triton_model(model)) == [int(newest)]
    promote_version(str(prefix), first)  # a rollback
    assert latest(prefix) == first and (model / "config.pbtxt").read_bytes() == served


def test_a_failed_config_rename_leaves_latest_and_the_served_version_as_they_were(
    exported, tmp_path, monkeypatch
):
    prefix = tmp_path / "models"
    first = Path(publish_bundle(exported["torch"], str(prefix))).name
    served = (prefix / "triton" / "models" / "config.pbtxt").read_bytes()

    def full_disk(source, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(publish.os, "replace", full_disk)
    with pytest.raises(ValueError, match="No space left"):
        publish_bundle(exported["torch"], str(prefix))
    assert latest(prefix) == first and (prefix / "triton" / "models" / "config.pbtxt").read_bytes() == served
    leftovers = [path for path in prefix.rglob(".*")]
    assert leftovers == [], "no temporary file is left behind"


def replace_onnx(path: Path | str, source: str, filesystem=None) -> None:
    """Another bundle's model.onnx in place of the one published: answers a manifest does not describe."""
    data = (Path(source) / "model.onnx").read_bytes()
    if filesystem is None:
        Path(path).write_bytes(data)
    else:
        filesystem.pipe_file(str(path), data)


@pytest.mark.parametrize("where", ["version", "triton"])
def test_promoting_a_version_whose_files_changed_since_it_was_published_is_refused_naming_the_file(
    exported, tmp_path, where
):
    prefix = tmp_path / "models" / "churn"
    first = Path(publish_bundle(exported["torch"], str(prefix))).name
    held = Path(publish_bundle(exported["torch"], str(prefix), promote=False)).name
    served = (prefix / "triton" / "churn" / "config.pbtxt").read_bytes()
    changed = {
        "version": prefix / held / "model.onnx",
        "triton": prefix / "triton" / "churn" / held / "model.onnx",
    }
    replace_onnx(changed[where], exported["raw columns"])
    with pytest.raises(
        ValueError, match=f"{changed[where]} does not match the bundle's manifest: its sha256"
    ):
        promote_version(str(prefix), held)
    assert latest(prefix) == first and (prefix / "triton" / "churn" / "config.pbtxt").read_bytes() == served


def test_promoting_a_changed_version_under_any_fsspec_uri_is_refused(exported):
    prefix = "memory://mixedml-layouts/models/tampered"
    first = Path(publish_bundle(exported["torch"], prefix)).name
    held = Path(publish_bundle(exported["torch"], prefix, promote=False)).name
    memory = fsspec.filesystem("memory")
    replace_onnx(f"/mixedml-layouts/models/tampered/{held}/model.onnx", exported["raw columns"], memory)
    with pytest.raises(ValueError, match=f"{prefix}/{held}/model.onnx does not match the bundle's manifest"):
        promote_version(prefix, held)
    assert memory.cat_file("/mixedml-layouts/models/tampered/LATEST").decode() == first
    assert promote_version(prefix, first) == f"{prefix}/{first}", "an untouched version still promotes"


def test_layouts_are_written_under_any_fsspec_uri(exported):
    prefix = "memory://mixedml-layouts/models/churn"
    uri = publish_bundle(exported["torch"], prefix)
    version = uri.rsplit("/", 1)[1]
    memory = fsspec.filesystem("memory")
    root = "/mixedml-layouts/models/churn"
    assert memory.cat_file(f"{root}/{LATEST}").decode() == version and resolve_bundle(prefix) == uri
    config = text_format.Parse(memory.cat_file(f"{root}/triton/churn/config.pbtxt").decode(), TritonConfig())
    assert served_versions(config) == [int(version)]
    assert memory.isfile(f"{root}/triton/churn/{version}/model.onnx")


# ---- prefixes published before versions were integers ----------------------------------------------------


def test_a_prefix_published_with_the_old_version_names_still_resolves_and_takes_new_versions(
    unexported, tmp_path
):
    prefix = tmp_path / "models"
    old = "20250301T020412Z-3f9c2a1b"
    shutil.copytree(unexported, prefix / old)
    (prefix / LATEST).write_text(old)
    assert resolve_bundle(str(prefix)) == str(prefix / old)
    assert load_bundle(resolve_bundle(str(prefix))).manifest == load_bundle(unexported).manifest

    new = Path(publish_bundle(unexported, str(prefix))).name
    assert is_version(new) and latest(prefix) == new and resolve_bundle(str(prefix)) == str(prefix / new)
    assert promote_version(str(prefix), old) == str(prefix / old), "an old version can be rolled back to"
    assert resolve_bundle(str(prefix)) == str(prefix / old)
    assert files_of(str(prefix / old)) == files_of(unexported)


def test_promoting_what_is_not_a_published_version_is_refused_naming_it(unexported, tmp_path):
    prefix = tmp_path / "models"
    publish_bundle(unexported, str(prefix))
    for version in ("20990101000000", "../elsewhere", "triton"):
        with pytest.raises(ValueError, match="not a published version"):
            promote_version(str(prefix), version)


@pytest.mark.parametrize(
    "prefix, name",
    [("s3://bucket/models/churn", "churn"), ("/srv/models/churn/", "churn"), ("gs://b/my model", "my_model"),
     ("simplecache::s3://b/m/iris.v2", "iris.v2"), ("memory://", "model")],
)  # fmt: skip
def test_the_served_model_is_named_after_the_prefix(prefix, name):
    assert serving_name(prefix) == name


def teardown_module():
    memory = fsspec.filesystem("memory")
    if memory.exists("/mixedml-layouts"):
        memory.rm("/mixedml-layouts", recursive=True)


def test_published_files_are_readable_by_other_users(exported, tmp_path):
    prefix = tmp_path / "models"
    publish_bundle(exported["torch"], str(prefix))
    (tmp_path / "new-file").write_text("")
    expected = os.stat(tmp_path / "new-file").st_mode & 0o777
    assert os.stat(prefix / "triton" / "models" / "config.pbtxt").st_mode & 0o777 == expected


def test_the_kserve_example_serves_a_prefix_s_triton_repository_with_the_triton_runtime():
    import yaml

    manifest = yaml.safe_load(
        (Path(__file__).resolve().parents[3] / "deploy/kserve-inferenceservice.yaml").read_text()
    )
    assert (manifest["apiVersion"], manifest["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    model = manifest["spec"]["predictor"]["model"]
    assert (model["runtime"], model["protocolVersion"], model["modelFormat"]["name"]) == (
        "kserve-tritonserver",
        "v2",
        "onnx",
    )
    prefix, repository = model["storageUri"].rsplit("/", 1)
    assert repository == "triton" and serving_name(prefix) == manifest["metadata"]["name"]
