"""The serving exports: ONNX (run by onnxruntime) and the SavedModel's serving signature, given raw
rows, agree with the framework's model given the standardised rows, for any batch size."""

from __future__ import annotations

import os

import keras
import numpy as np
import onnx
import onnxruntime
import pytest
import tensorflow as tf
import torch
from torch import nn

from tasks.core.data.scaling import ScalerStats
from tasks.core.models.plugins import ModelSpec, build
from tasks.core.serving.exports import ExportResult, export_model

N_FEATURES, N_CLASSES = 64, 3
RNG = np.random.default_rng(7)
SCALER = ScalerStats(
    mean=RNG.normal(loc=3.0, size=N_FEATURES).tolist(), scale=RNG.uniform(0.5, 4.0, N_FEATURES).tolist()
)
SPECS = {
    "mlp": ModelSpec("mlp", options={"hidden_sizes": "32,16"}),
    "cnn": ModelSpec("cnn", "1x8x8", {"channels": "4,8"}),
    "residual": ModelSpec("examples.residual:build", options={"width": 32, "blocks": 2}),
}
BATCHES = (1, 7)  # the exports were traced with neither


def raw_rows(count: int) -> np.ndarray:
    rng = np.random.default_rng(count)
    return rng.normal(loc=SCALER.mean, scale=SCALER.scale, size=(count, N_FEATURES)).astype(np.float32)


def standardised(raw: np.ndarray) -> np.ndarray:
    return ((raw.astype(np.float64) - SCALER.mean) / SCALER.scale).astype(np.float32)


def export(model, framework: str, directory) -> ExportResult:
    return export_model(model, framework, SCALER, str(directory))


def onnx_outputs(path: str, raw: np.ndarray) -> dict[str, np.ndarray]:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    assert [value.name for value in session.get_inputs()] == ["features"]
    assert session.get_inputs()[0].shape == ["rows", N_FEATURES]
    names = [value.name for value in session.get_outputs()]
    return dict(zip(names, session.run(None, {"features": raw}), strict=True))


def assert_agree(outputs: dict[str, np.ndarray], logits: np.ndarray) -> None:
    """The export's logits match the model's; its probabilities are their softmax and sum to 1."""
    assert set(outputs) == {"logits", "probabilities"}
    assert outputs["logits"].dtype == outputs["probabilities"].dtype == np.float32
    assert outputs["logits"].shape == outputs["probabilities"].shape == logits.shape
    np.testing.assert_allclose(outputs["logits"], logits, atol=1e-5, rtol=1e-5)
    expected = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(
        outputs["probabilities"], expected / expected.sum(axis=1, keepdims=True), atol=1e-6
    )
    np.testing.assert_allclose(outputs["probabilities"].sum(axis=1), 1.0, atol=1e-6)


# ---- PyTorch -> ONNX ------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=list(SPECS))
def torch_export(request, tmp_path_factory):
    torch.manual_seed(0)
    model = build(SPECS[request.param], N_FEATURES, N_CLASSES, "pytorch").eval()
    directory = tmp_path_factory.mktemp(f"torch-{request.param}")
    return model, directory, export(model, "pytorch", directory)


@pytest.mark.slow
def test_a_torch_model_is_exported_to_onnx(torch_export):
    _, directory, result = torch_export
    assert result == ExportResult(files={"onnx": "model.onnx"}, notes=[])
    assert sorted(os.listdir(directory)) == ["model.onnx"]  # one self-contained file, no external data


@pytest.mark.parametrize("rows", BATCHES)
def test_torch_onnx_takes_raw_rows_and_gives_the_model_s_logits(torch_export, rows):
    model, directory, _ = torch_export
    raw = raw_rows(rows)
    with torch.no_grad():
        logits = model(torch.from_numpy(standardised(raw))).numpy()
    assert_agree(onnx_outputs(str(directory / "model.onnx"), raw), logits)


class FixedBatch(nn.Module):
    """Treats the batch size it was traced with as a constant."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(N_FEATURES, N_CLASSES)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.linear(rows).reshape(2, N_CLASSES)


def test_an_export_the_model_cannot_give_is_left_out_with_the_reason(tmp_path):
    result = export(FixedBatch().eval(), "pytorch", tmp_path)
    assert result.files == {}
    (note,) = result.notes
    assert note.startswith("onnx not exported") and "has a fixed batch of 2 rows" in note
    assert os.listdir(tmp_path) == []


def test_an_unknown_framework_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="'jax'"):
        export(None, "jax", tmp_path)


# ---- Keras -> SavedModel and ONNX ----------------------------------------------------------------------


@pytest.fixture(scope="module", params=["mlp", "cnn"])
def keras_export(request, tmp_path_factory):
    keras.utils.set_random_seed(0)
    model = build(SPECS[request.param], N_FEATURES, N_CLASSES, "tensorflow")
    directory = tmp_path_factory.mktemp(f"keras-{request.param}")
    return model, directory, export(model, "tensorflow", directory)


def keras_logits(model, raw: np.ndarray) -> np.ndarray:
    return np.asarray(model(standardised(raw), training=False))


def test_a_keras_model_is_exported_to_a_saved_model_and_onnx(keras_export):
    _, directory, result = keras_export
    assert result == ExportResult(files={"saved_model": "saved_model", "onnx": "model.onnx"}, notes=[])
    assert sorted(os.listdir(directory)) == ["model.onnx", "saved_model"]


@pytest.mark.parametrize("rows", BATCHES)
def test_the_saved_model_serving_signature_takes_raw_rows(keras_export, rows):
    model, directory, _ = keras_export
    loaded = tf.saved_model.load(str(directory / "saved_model"))
    assert {"serve", "serving_default"} <= set(loaded.signatures)
    serving = loaded.signatures["serving_default"]
    raw = raw_rows(rows)
    outputs = {name: value.numpy() for name, value in serving(features=tf.constant(raw)).items()}
    assert_agree(outputs, keras_logits(model, raw))


@pytest.mark.parametrize("rows", BATCHES)
def test_keras_onnx_takes_raw_rows_and_gives_the_model_s_logits(keras_export, rows):
    model, directory, _ = keras_export
    exported = onnx.load(str(directory / "model.onnx"))
    assert [value.type.tensor_type.shape.dim[0].dim_param for value in exported.graph.output] == ["rows"] * 2
    raw = raw_rows(rows)
    assert_agree(onnx_outputs(str(directory / "model.onnx"), raw), keras_logits(model, raw))
