"""A bundle with a text column: the bundle, its ONNX file (onnxruntime), its SavedModel and its MLflow
model give every row the same features and the same class, whatever shares its batch."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnxruntime
import pyarrow as pa
import pytest

from tasks.core.bundle.loading import load_bundle
from tasks.core.bundle.raw_inputs import onnx_encoding, raw_feeds, signature_names, tf_encoded
from tasks.core.data.api import TEXT, FittedEncoding
from tests.floats import assert_float32_close, assert_scored_alike
from tests.unit.bundle.test_raw_row_exports import CLASSES, prepared_table, write_raw_bundle

# Each test here writes a model export (torch.onnx, tf2onnx, a SavedModel): seconds, so not in make test-fast.
pytestmark = pytest.mark.slow

MAKERS = [["ford", "chevrolet", "plymouth"], ["toyota", "datsun", "honda"], ["volkswagen", "peugeot", "fiat"]]
MODELS = ["pinto", "malibu", "corolla", "510", "rabbit", "504", "civic", "custom", "wagon", "brougham"]
COLUMNS = ["name", "weight"]


def cars_table(rows: int = 240, seed: int = 0) -> pa.Table:
    """A car's name, mostly distinct, whose maker tells its class; its weight; gaps in both."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, len(CLASSES), rows)
    names = [
        f"{rng.choice(MAKERS[cls])} {rng.choice(MODELS)} {rng.integers(100, 1000)}"
        + (" (sw)" if row % 5 else "")
        for row, cls in enumerate(label)
    ]
    weight = rng.normal(3000 - 500 * label, 300)
    return pa.table({
        "name": pa.array(names, mask=np.arange(rows) % 23 == 5),
        "weight": pa.array(weight, mask=np.arange(rows) % 19 == 7),
        "label": np.asarray(CLASSES)[label],
    })  # fmt: skip


def scoring_rows() -> pa.Table:
    """Train rows, then rows a client may send: other cases and separators, words never seen, letters
    outside ASCII, an empty name, a missing one, a name of no word."""
    seen = cars_table().slice(0, 40).drop_columns(["label"])
    new = pa.table({
        "name": ["FORD Pinto", "Toyota-COROLLA (SW)", "", None, "Ärger über fiat", "unseen words only", "...",
                 "datsun\t510\u00a0wagon", "honda_civic honda"],
        "weight": [2500.0, None, 3000.0, 2000.0, np.nan, 2800.0, 3100.0, 2600.0, 2200.0],
    })  # fmt: skip
    return pa.concat_tables([seen, new.cast(seen.schema)])


@pytest.fixture(scope="module")
def prepared():
    return prepared_table(cars_table(), COLUMNS)


@pytest.fixture(scope="module")
def bundles(prepared, tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("text-bundles")
    return {
        framework: write_raw_bundle(folder / framework, framework, prepared)
        for framework in ("pytorch", "tensorflow")
    }


def client_feeds(rows: pa.Table) -> dict[str, np.ndarray]:
    """As a client sends them: the text as it is ('' where missing), the number float64 (NaN)."""
    names = ["" if name is None else name for name in rows.column("name").to_pylist()]
    weights = [np.nan if weight is None else weight for weight in rows.column("weight").to_pylist()]
    return {"name": np.asarray(names, object)[:, None], "weight": np.asarray(weights, np.float64)[:, None]}


def onnx_session(source) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def saved_model_outputs(folder: str, feeds: dict[str, np.ndarray], encoding: FittedEncoding) -> dict:
    import tensorflow as tf

    serving = tf.saved_model.load(os.path.join(folder, "saved_model")).signatures["serving_default"]
    names = signature_names(encoding)
    return {
        name: value.numpy()
        for name, value in serving(**{names[c]: tf.constant(v) for c, v in feeds.items()}).items()
    }


def test_the_name_is_encoded_as_text_and_the_exports_take_it_as_text(prepared, bundles):
    encoding = prepared.fitted_encoding()
    assert [(column.name, column.kind) for column in encoding.columns] == [
        ("name", TEXT),
        ("weight", "numeric"),
    ]
    for framework, folder in bundles.items():
        manifest = json.loads((Path(folder) / "bundle.json").read_text())
        assert manifest["export_notes"] == [] and {"onnx", "mlflow"} <= set(manifest["files"]), framework
        session = onnx_session(os.path.join(folder, "model.onnx"))
        assert [(value.name, value.type) for value in session.get_inputs()] == [
            ("name", "tensor(string)"), ("weight", "tensor(double)")
        ]  # fmt: skip
        (rule, _) = json.loads(session.get_modelmeta().custom_metadata_map["inputs"])
        assert rule["kind"] == TEXT and rule["onnx_operators"] == "com.microsoft" and "ASCII" in rule["words"]


def test_the_onnx_and_tensorflow_encodings_give_the_bundle_s_features(prepared, bundles):
    import tensorflow as tf

    rows = scoring_rows()
    encoding = prepared.fitted_encoding()
    expected = load_bundle(bundles["pytorch"]).features(rows)
    assert (
        expected[:, :-3].sum(axis=1).min() == 0 and expected[:, :-3].max() >= 2
    )  # no word, and a repeated one
    feeds = client_feeds(rows)
    for name, values in raw_feeds(rows, encoding).items():
        np.testing.assert_array_equal(values, feeds[name])
    session = onnx_session(onnx_encoding(encoding, 8, 18).SerializeToString())
    names = signature_names(encoding)
    from_tf = tf_encoded({names[column]: tf.constant(values) for column, values in feeds.items()}, encoding)
    for encoded in (session.run(None, feeds)[0], from_tf.numpy()):
        assert_float32_close(encoded, expected)
    for row in (0, 41, 44, len(expected) - 1):  # alone, as among the others
        alone = {name: values[row : row + 1] for name, values in feeds.items()}
        assert_float32_close(session.run(None, alone)[0], expected[row : row + 1])
        assert_float32_close(
            load_bundle(bundles["pytorch"]).features(rows.slice(row, 1)), expected[row : row + 1]
        )


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_the_bundle_onnx_and_saved_model_give_each_row_the_same_class(prepared, bundles, framework):
    folder = bundles[framework]
    rows = scoring_rows()
    bundle = load_bundle(folder)
    expected = bundle.predict_proba(rows)
    labels = [CLASSES[index] for index in expected.argmax(axis=1)]
    assert len(set(labels)) > 1, "an untrained model that predicts one class tests little"
    feeds = client_feeds(rows)
    session = onnx_session(os.path.join(folder, "model.onnx"))
    probabilities, label = session.run(["probabilities", "label"], feeds)
    assert_scored_alike(probabilities, expected)
    assert label.tolist() == labels
    outputs = [probabilities]
    if framework == "tensorflow":
        served = saved_model_outputs(folder, feeds, prepared.fitted_encoding())
        assert_scored_alike(served["probabilities"], expected)
        assert served["label"].astype(str).tolist() == labels
        outputs.append(served["probabilities"])
    for row in (0, 40, 42, len(labels) - 1):  # a row alone, in each runtime
        alone = {name: values[row : row + 1] for name, values in feeds.items()}
        assert_scored_alike(session.run(["probabilities"], alone)[0], expected[row : row + 1])
        assert_scored_alike(bundle.predict_proba(rows.slice(row, 1)), expected[row : row + 1])
        if framework == "tensorflow":
            served = saved_model_outputs(folder, alone, prepared.fitted_encoding())
            assert_scored_alike(served["probabilities"], expected[row : row + 1])


def test_the_mlflow_model_answers_as_the_bundle(bundles):
    from tasks.core.bundle import mlflow_pyfunc

    folder = bundles["pytorch"]
    rows = scoring_rows()
    expected = load_bundle(folder).predict_proba(rows)
    model = mlflow_pyfunc._load_pyfunc(os.path.join(folder, "mlflow", "model"))
    answer = model.predict(rows.to_pandas())
    assert answer["prediction"].tolist() == [CLASSES[index] for index in expected.argmax(axis=1)]
    assert_scored_alike(answer[[f"probability_{label}" for label in CLASSES]].to_numpy(), expected)
