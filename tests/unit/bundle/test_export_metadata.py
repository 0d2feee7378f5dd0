"""Self-describing exports: given a description, the ONNX file carries it in its metadata_props and
returns a "label" output (the class label of the largest probability); the SavedModel's signature
returns "label" too, and assets.extra/metadata.json holds the same description. The ONNX file's
agreement with the model is checked as it is written: the figure is in the result's checks, and a file
that disagrees is left out with a note."""

from __future__ import annotations

import json
import sys

import keras
import numpy as np
import onnx
import onnxruntime
import pyarrow as pa
import pytest
import tensorflow as tf
import torch

from tasks.core.bundle import export_parity
from tasks.core.bundle.export_plan import ExportDescription
from tasks.core.bundle.exports import export_model
from tasks.core.bundle.raw_inputs import raw_feeds, sample_table, signature_names
from tasks.core.data.column_kinds import propose_kinds
from tasks.core.data.encoding import FittedEncoding, batch_stats
from tasks.core.data.scaling import ScalerStats
from tasks.core.models.plugins import build, mlp_spec
from tests.unit.bundle.encodings import numbered_encoding

# Each test here writes a model export (torch.onnx, tf2onnx, a SavedModel): seconds, so not in make test-fast.
pytestmark = pytest.mark.slow

CLASSES = ["setosa", "versicolor", "virginica"]
N_FEATURES = 6
SCALER = ScalerStats(mean=[1.0, -2.0, 0.5, 3.0, 0.0, 10.0], scale=[0.5, 2.0, 1.0, 4.0, 1.0, 3.0])
NUMBERS = {f"f{index}": [float(index + row) for row in range(4)] for index in range(N_FEATURES)}


def description(feature_names: list[str]) -> ExportDescription:
    return ExportDescription(
        feature_names=feature_names, label_column="species", class_labels=CLASSES, format_version=2
    )


def fitted(table: pa.Table) -> FittedEncoding:
    return batch_stats(propose_kinds(table.schema, sample=table), table).fit()


def model_of(framework: str, n_features: int, seed: int = 1):
    torch.manual_seed(seed)
    keras.utils.set_random_seed(seed)
    model = build(mlp_spec([8]), n_features, len(CLASSES), framework)
    return model.eval() if framework == "pytorch" else model


def session(path) -> onnxruntime.InferenceSession:
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def run(path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    loaded = session(path)
    names = [value.name for value in loaded.get_outputs()]
    return dict(zip(names, loaded.run(None, feeds), strict=True))


def rows(count: int = 9) -> np.ndarray:
    rng = np.random.default_rng(count)
    return np.asarray(SCALER.mean) + 3 * np.asarray(SCALER.scale) * rng.normal(size=(count, N_FEATURES))


@pytest.fixture(scope="module", params=["pytorch", "tensorflow"])
def described(request, tmp_path_factory):
    """Each framework's exports of a model over numbers, with a description."""
    folder = tmp_path_factory.mktemp(request.param)
    encoding = fitted(pa.table(NUMBERS))
    result = export_model(
        model_of(request.param, N_FEATURES),
        request.param,
        SCALER,
        str(folder),
        encoding,
        description=description(list(NUMBERS)),
    )
    return request.param, folder, result


def test_the_onnx_metadata_describes_the_model_and_its_inputs(described):
    _, folder, result = described
    assert result.notes == []
    props = {prop.key: prop.value for prop in onnx.load(str(folder / "model.onnx")).metadata_props}
    assert props.keys() == {
        "problem_type", "label_column", "class_labels", "feature_names", "bundle_format_version", "inputs",
        "outputs", "onnxruntime_floor",
    }  # fmt: skip
    assert props["problem_type"] == "classification" and props["label_column"] == "species"
    assert json.loads(props["class_labels"]) == CLASSES
    assert json.loads(props["feature_names"]) == list(NUMBERS)
    assert json.loads(props["bundle_format_version"]) == 2
    assert props["onnxruntime_floor"] == "1.15"
    assert json.loads(props["inputs"]) == [
        {"name": "features", "dtype": "float64", "shape": ["rows", N_FEATURES], "order": "feature_names",
         "missing": "NaN"}
    ]  # fmt: skip
    assert set(json.loads(props["outputs"])) == {"logits", "probabilities", "label"}
    # as onnxruntime hands it to a server
    assert session(folder / "model.onnx").get_modelmeta().custom_metadata_map == props


def test_the_onnx_label_output_names_the_class_of_the_largest_probability(described):
    _, folder, _ = described
    outputs = {
        value.name: (value.type, value.shape) for value in session(folder / "model.onnx").get_outputs()
    }
    assert outputs["label"] == ("tensor(string)", ["rows"])
    for count in (1, 9):
        answers = run(folder / "model.onnx", {"features": rows(count)})
        assert answers["label"].shape == (count,)
        assert answers["label"].tolist() == [
            CLASSES[index] for index in answers["probabilities"].argmax(axis=1)
        ]
    assert len(set(run(folder / "model.onnx", {"features": rows(64)})["label"])) > 1, "one class tests little"


def test_the_onnx_file_checked_at_export_time_stays_in_the_onnxruntime_floor(described):
    _, folder, result = described
    assert result.checks["onnx"]["max_abs_difference"] <= 1e-4
    exported = onnx.load(str(folder / "model.onnx"))
    assert exported.ir_version == 8
    assert {opset.domain: opset.version for opset in exported.opset_import}[""] == 18


@pytest.mark.parametrize("described", ["tensorflow"], indirect=True)  # Keras models only have one
def test_the_saved_model_returns_the_label_and_holds_the_metadata(described):
    _, folder, result = described
    assert result.files == {"saved_model": "saved_model", "onnx": "model.onnx"}
    serving = tf.saved_model.load(str(folder / "saved_model")).signatures["serving_default"]
    assert serving.structured_outputs["label"].dtype == tf.string
    answers = {name: value.numpy() for name, value in serving(features=tf.constant(rows())).items()}
    assert [label.decode() for label in answers["label"]] == [
        CLASSES[index] for index in answers["probabilities"].argmax(axis=1)
    ]
    np.testing.assert_array_equal(
        run(folder / "model.onnx", {"features": rows()})["label"], answers["label"].astype(str)
    )
    metadata = json.loads((folder / "saved_model" / "assets.extra" / "metadata.json").read_text())
    props = {prop.key: prop.value for prop in onnx.load(str(folder / "model.onnx")).metadata_props}
    assert {
        key: json.dumps(value) if not isinstance(value, str) else value for key, value in metadata.items()
    } == {key: value for key, value in props.items() if key != "onnxruntime_floor"}


# ---- raw columns -----------------------------------------------------------------------------------------

RAW = pa.table({
    "amount": [1.0, None, 2.0, 30.0],
    "home city": ["oslo", "rome", None, "oslo"],
    "member": [True, False, None, True],
    "joined": pa.array([0, 400, None, 9000], pa.date32()),
})  # fmt: skip


def raw_scaler(encoding: FittedEncoding) -> ScalerStats:
    encoded = encoding.transform(RAW)
    return ScalerStats(encoded.mean(axis=0).tolist(), np.maximum(encoded.std(axis=0), 1.0).tolist())


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_raw_column_inputs_are_described_as_a_client_sends_them(framework, tmp_path):
    encoding = fitted(RAW)
    names = encoding.encoded_names()
    result = export_model(
        model_of(framework, len(names)),
        framework,
        raw_scaler(encoding),
        str(tmp_path),
        encoding,
        description=description(names),
    )
    assert result.notes == [] and result.checks["onnx"]["rows"] == 8
    props = {prop.key: prop.value for prop in onnx.load(str(tmp_path / "model.onnx")).metadata_props}
    common = {"shape": ["rows", 1]}
    assert json.loads(props["inputs"]) == [
        {"name": "amount", "column": "amount", "signature_name": "amount", "kind": "numeric", "dtype": "float64", "missing": "NaN", **common},
        {"name": "home city", "column": "home city", "signature_name": "home_city", "kind": "categorical", "dtype": "string", "missing": "",
         "unseen": "<other>", **common},
        {"name": "member", "column": "member", "signature_name": "member", "kind": "boolean", "dtype": "float64", "missing": "NaN",
         "values": [0, 1], **common},
        {"name": "joined", "column": "joined", "signature_name": "joined", "kind": "date", "dtype": "float64", "missing": "NaN",
         "unit": "seconds since 1970-01-01T00:00:00Z", **common},
    ]  # fmt: skip
    assert json.loads(props["feature_names"]) == names
    feeds = raw_feeds(RAW, encoding)
    answers = run(tmp_path / "model.onnx", feeds)
    assert answers["label"].tolist() == [CLASSES[index] for index in answers["probabilities"].argmax(axis=1)]
    if framework == "tensorflow":
        serving = tf.saved_model.load(str(tmp_path / "saved_model")).signatures["serving_default"]
        named = {signature_names(encoding)[column]: tf.constant(values) for column, values in feeds.items()}
        np.testing.assert_array_equal(serving(**named)["label"].numpy().astype(str), answers["label"])


def test_the_check_s_rows_hold_every_kind_of_value_and_a_gap_in_each_column():
    encoding = fitted(RAW)
    table = sample_table(encoding, *vars(raw_scaler(encoding)).values(), rows=8)
    assert table.column_names == RAW.column_names
    assert [table.column(name).null_count for name in table.column_names] == [1, 1, 1, 1]
    cities = set(table.column("home city").drop_null().to_pylist())
    assert {"oslo", "rome"} < cities and len(cities) == 3, "each category and an unseen one"
    assert set(table.column("member").drop_null().to_pylist()) == {True, False}
    encoding.transform(table)  # values the bundle takes


# ---- the check at export time ------------------------------------------------------------------------------


def test_an_onnx_file_that_disagrees_with_the_model_is_left_out_with_the_figure(tmp_path, monkeypatch):
    monkeypatch.setattr(export_parity, "PARITY_TOLERANCE", -1.0)  # any difference is too large
    result = export_model(
        model_of("pytorch", N_FEATURES), "pytorch", SCALER, str(tmp_path), numbered_encoding(N_FEATURES)
    )
    assert result.files == {} and result.checks == {}
    (note,) = result.notes
    assert note.startswith(f"onnx not exported: ValueError: onnxruntime {onnxruntime.__version__}'s answers")
    assert "more than -1" in note
    assert list(tmp_path.iterdir()) == []


def test_without_onnxruntime_the_export_is_kept_and_the_check_says_it_did_not_run(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # importing it now fails
    result = export_model(
        model_of("pytorch", N_FEATURES), "pytorch", SCALER, str(tmp_path), numbered_encoding(N_FEATURES)
    )
    assert result.files == {"onnx": "model.onnx"} and result.notes == []
    assert result.checks == {"onnx": {"not_run": "onnxruntime is not installed where the bundle was written"}}


def test_a_column_named_label_is_the_input_input_label_of_the_described_onnx_export(tmp_path):
    table = pa.table({"label": ["a", "b", "a", None]})
    encoding = fitted(table)
    n_features = len(encoding.encoded_names())
    scaler = ScalerStats([0.0] * n_features, [1.0] * n_features)
    model = model_of("pytorch", n_features)
    result = export_model(model, "pytorch", scaler, str(tmp_path), encoding, description=description([]))
    assert result.notes == [] and result.files == {"onnx": "model.onnx"}
    assert [value.name for value in session(tmp_path / "model.onnx").get_inputs()] == ["input/label"]
    answers = run(tmp_path / "model.onnx", raw_feeds(table, encoding))
    assert answers["label"].tolist() == [CLASSES[index] for index in answers["probabilities"].argmax(axis=1)]
