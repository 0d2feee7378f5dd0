"""Serving exports of a trained model, written into its bundle: ONNX, and a SavedModel for Keras.

Every export takes RAW feature rows, float32 `[rows, n_features]` in the manifest's feature order,
under the input name "features", and returns "logits" and "probabilities" (the softmax), both
float32 `[rows, n_classes]`; the batch dimension, "rows", is dynamic. The scaler is folded into the
graph as `tasks.core.data.scaling.standardise` computes it: (x - mean) / scale in float64, then cast to
float32, so a row the float32 input holds exactly reaches the model as the bundle's loader feeds it.

- PyTorch -> ONNX: `torch.onnx.export(dynamo=True)`, the exporter built on `torch.export` and
  onnxscript; it runs offline on CPU. The TorchScript exporter (`dynamo=False`) also exports the
  built-ins (the cnn's `view(-1, *shape)` included) with a dynamic batch, but it is deprecated since
  torch 2.9, and for a model whose forward fixes the batch size it still labels the outputs dynamic,
  a file that fails or misleads at any other batch size. The dynamo exporter writes the fixed size
  into the graph's shapes, where `check_dynamic_rows` finds it.
- Keras -> SavedModel (TF Serving's format): `keras.export.ExportArchive`, endpoint "serve", which
  TF Serving also finds as "serving_default".
- Keras -> ONNX: tf2onnx converts the same endpoint function, so the SavedModel and the ONNX file
  cannot standardise differently. It works with TensorFlow 2.20, Keras 3, numpy 2 and protobuf 7
  when given a `tf.function` over the live model; it caps the opset at 18, hence ONNX_OPSET.

The exports read numbers only: where the bundle's encoding is more than the identity (a categorical,
boolean or date column, or a missing-value indicator: any encoded feature that is not a raw numeric
column as it is), they are left out with a note, and the bundle scores raw rows through its loader.

A user's model may use what an exporter cannot express (data-dependent control flow, an op without
an ONNX conversion, a batch size fixed in its forward). Its weights still load through the bundle,
so such an export is left out and the result's notes say why, rather than failing the run.

Imports torch, tensorflow, keras, onnx and tf2onnx only inside the functions that use them: this
module is imported where only one framework is installed.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

from tasks.core.data.column_kinds import NUMERIC
from tasks.core.data.encoding import FittedEncoding
from tasks.core.data.scaling import ScalerStats
from tasks.core.messages import preview

INPUT = "features"
OUTPUTS = ("logits", "probabilities")
ROWS = "rows"
ONNX_FILE = "model.onnx"
SAVED_MODEL_DIR = "saved_model"
SERVING_ENDPOINT = "serve"
ONNX_OPSET = 18
EXPORTS = {"pytorch": ("onnx",), "tensorflow": ("saved_model", "onnx")}
NOT_RAW_ROWS = (
    "the table has categorical/boolean/date or missing-value columns; a raw-row ONNX export is not built yet"
)

logger = logging.getLogger(__name__)


@dataclass
class ExportResult:
    """What was exported (export name -> path relative to the bundle folder) and what was not, and why."""

    files: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def export_model(
    model, framework: str, scaler: ScalerStats, directory: str, encoding: FittedEncoding | None = None
) -> ExportResult:
    """Write the serving exports of `model` (a torch module in eval mode on CPU, or a Keras model)
    into `directory`; none, each with a note, where `encoding` is more than the identity."""
    exporters = {"pytorch": export_torch, "tensorflow": export_keras}
    if framework not in exporters:
        raise ValueError(f"cannot export a model of framework {framework!r}: not one of {tuple(exporters)}")
    encoded = encoded_columns(encoding)
    if encoded:
        why = f"{NOT_RAW_ROWS} (columns {preview([repr(name) for name in encoded])})"
        return ExportResult(notes=[f"{name} not exported: {why}" for name in EXPORTS[framework]])
    fill = [column.encoder.fill for column in encoding.columns] if encoding else None
    return exporters[framework](model, scaler, directory, fill)


def encoded_columns(encoding: FittedEncoding | None) -> list[str]:
    """The raw columns whose features are not the column's own numbers: categorical, boolean and date
    columns, and numeric ones with a missing-value indicator. None for a numeric encoding without
    missing values, whose features are the raw columns it keeps, as the exports take them."""
    if encoding is None:
        return []
    return [
        column.name
        for column in encoding.columns
        if column.kind != NUMERIC or column.encoder.names(column.name) != [column.name]
    ]


def export_torch(model, scaler: ScalerStats, directory: str, fill: list[float] | None = None) -> ExportResult:
    result = ExportResult()
    serving = torch_serving_module(model, scaler, fill)
    attempt(
        result, "onnx", ONNX_FILE, directory, lambda path: write_torch_onnx(serving, len(scaler.mean), path)
    )
    return result


def torch_serving_module(model, scaler: ScalerStats, fill: list[float] | None = None):
    """`model` behind the scaler, returning (logits, probabilities). With `fill` (the encoding's value
    for a missing number, by feature), a NaN is filled as the bundle fills it."""
    import torch

    class Serving(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            self.register_buffer("mean", torch.tensor(scaler.mean, dtype=torch.float64))
            self.register_buffer("scale", torch.tensor(scaler.scale, dtype=torch.float64))
            self.fills = fill is not None
            if self.fills:
                self.register_buffer("fill", torch.tensor(fill, dtype=torch.float64))

        def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            raw = features.double()
            if self.fills:
                raw = torch.where(torch.isnan(raw), self.fill, raw)
            standardised = ((raw - self.mean) / self.scale).float()
            logits = self.model(standardised).float()
            return logits, torch.softmax(logits, dim=-1)

    return Serving().eval()


def write_torch_onnx(serving, n_features: int, path: str) -> None:
    import torch

    torch.onnx.export(
        serving,
        (torch.zeros(2, n_features),),  # two rows: torch.export specialises a dimension of size 1
        path,
        dynamo=True,
        dynamic_shapes={INPUT: {0: torch.export.Dim(ROWS)}},
        input_names=[INPUT],
        output_names=list(OUTPUTS),
        opset_version=ONNX_OPSET,
        external_data=False,
        verbose=False,
    )
    check_dynamic_rows(path)


def export_keras(model, scaler: ScalerStats, directory: str, fill: list[float] | None = None) -> ExportResult:
    result = ExportResult()
    serve = keras_serving_function(model, scaler, fill)
    attempt(
        result, "saved_model", SAVED_MODEL_DIR, directory, lambda path: write_saved_model(model, serve, path)
    )
    attempt(result, "onnx", ONNX_FILE, directory, lambda path: write_keras_onnx(serve, path))
    return result


def keras_serving_function(model, scaler: ScalerStats, fill: list[float] | None = None):
    """A `tf.function` from raw features to {"logits", "probabilities"}, traced on first use; with
    `fill`, a NaN is filled as the bundle fills it."""
    import tensorflow as tf

    def serve(features):
        # Constants made while tracing are part of the graph; eager tensors would be captured, and
        # tf2onnx turns captures into extra graph inputs.
        mean = tf.constant(scaler.mean, tf.float64)
        scale = tf.constant(scaler.scale, tf.float64)
        raw = tf.cast(features, tf.float64)
        if fill is not None:
            raw = tf.where(tf.math.is_nan(raw), tf.constant(fill, tf.float64), raw)
        standardised = tf.cast((raw - mean) / scale, tf.float32)
        logits = tf.cast(model(standardised, training=False), tf.float32)
        return {"logits": logits, "probabilities": tf.nn.softmax(logits)}

    signature = [tf.TensorSpec([None, len(scaler.mean)], tf.float32, name=INPUT)]
    return tf.function(serve, input_signature=signature, autograph=False)


def write_saved_model(model, serve, path: str) -> None:
    import keras

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(SERVING_ENDPOINT, serve)
    archive.write_out(path, verbose=False)


def write_keras_onnx(serve, path: str) -> None:
    import tf2onnx

    tf2onnx.convert.from_function(
        serve, input_signature=serve.input_signature, opset=ONNX_OPSET, output_path=path
    )
    check_dynamic_rows(path)


def check_dynamic_rows(path: str) -> None:
    """Refuse a graph whose inputs or outputs have a fixed batch size; name the dynamic one "rows"."""
    import onnx

    exported = onnx.load(path)
    for value in [*exported.graph.input, *exported.graph.output]:
        batch = value.type.tensor_type.shape.dim[0]
        if batch.HasField("dim_value"):
            raise ValueError(
                f"the exported {value.name!r} has a fixed batch of {batch.dim_value} rows: "
                "the model's forward treats the batch size as a constant"
            )
        batch.dim_param = ROWS
    onnx.save(exported, path)


def attempt(result: ExportResult, name: str, relative: str, directory: str, write: Callable[[str], None]):
    """Run one export into `directory/relative`: recorded in `result.files` if it succeeds, else in
    `result.notes`, with nothing left behind."""
    path = os.path.join(directory, relative)
    try:
        write(path)
    except Exception as error:
        logger.warning("%s export left out", name, exc_info=True)
        result.notes.append(f"{name} not exported: {summary(error)}")
        discard(path)
    else:
        result.files[name] = relative


def summary(error: BaseException) -> str:
    """The error's first line; exporters wrap the cause in pages of advice, so the cause speaks."""
    cause = error.__cause__ or error
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def discard(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)
