"""Serving exports of a trained model, written into its bundle: ONNX, and a SavedModel for Keras.

Every export returns "logits" and "probabilities" (the softmax), both float32 `[rows, n_classes]`; the
batch dimension, "rows", is dynamic. Its inputs are the RAW rows, in one of two forms:

- Where the bundle's encoding is its numeric columns as they are (or it has none): one input,
  "features", float32 `[rows, n_features]` in the manifest's feature order; a NaN takes the encoding's
  fill (the train mean), as the bundle fills it.
- Otherwise (a categorical, boolean or date column, or a missing-value indicator): one input per raw
  column the encoding reads, `[rows, 1]`: text as strings ('' where missing), numbers, booleans (0/1)
  and dates (Unix seconds, UTC) as float64 (NaN where missing); the graph encodes them as the bundle's
  `FittedEncoding` does (raw_inputs.py holds the conventions). The ONNX inputs are named as the columns,
  the SavedModel's as `raw_inputs.signature_names` gives (TensorFlow refuses some characters).

The scaler is folded into the graph as `tasks.core.data.scaling.standardise` computes it: (x - mean) /
scale in float64, then cast to float32, so a row reaches the model as the bundle's loader feeds it.

- PyTorch -> ONNX: `torch.onnx.export(dynamo=True)`, the exporter built on `torch.export` and
  onnxscript; it runs offline on CPU. The TorchScript exporter (`dynamo=False`) also exports the
  built-ins (the cnn's `view(-1, *shape)` included) with a dynamic batch, but it is deprecated since
  torch 2.9, and for a model whose forward fixes the batch size it still labels the outputs dynamic,
  a file that fails or misleads at any other batch size. The dynamo exporter writes the fixed size
  into the graph's shapes, where `check_dynamic_rows` finds it.
- Keras -> SavedModel (TF Serving's format): `keras.export.ExportArchive`, endpoint "serve", which
  TF Serving also finds as "serving_default".
- Keras -> ONNX: tf2onnx converts the endpoint's function from "features" (the endpoint itself where
  there is no encoding), so the SavedModel and the ONNX file cannot standardise differently. It works
  with TensorFlow 2.20, Keras 3, numpy 2 and protobuf 7 when given a `tf.function` over the live
  model; it caps the opset at 18, hence ONNX_OPSET.

With raw columns, the encoding graph is written once in ONNX (ai.onnx.ml's LabelEncoder for the
categories) and put in front of the numeric export, from the torch exporter or tf2onnx alike, whose
"features" are then float64; the SavedModel encodes with TensorFlow ops under a signature of named
inputs. test_raw_row_exports.py holds the three to the bundle's answers.

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
import sys
import tempfile
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

from tasks.core.data.column_kinds import NUMERIC
from tasks.core.data.encoding import FittedEncoding
from tasks.core.data.scaling import ScalerStats
from tasks.core.serving.raw_inputs import tf_encoded, tf_input_signature, with_raw_inputs

INPUT = "features"
OUTPUTS = ("logits", "probabilities")
ROWS = "rows"
ONNX_FILE = "model.onnx"
SAVED_MODEL_DIR = "saved_model"
SERVING_ENDPOINT = "serve"
ONNX_OPSET = 18

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
    into `directory`: taking "features" where `encoding` is the identity (or None), else the raw
    columns it reads, encoded in the graph."""
    exporters = {"pytorch": export_torch, "tensorflow": export_keras}
    if framework not in exporters:
        raise ValueError(f"cannot export a model of framework {framework!r}: not one of {tuple(exporters)}")
    if encoded_columns(encoding):
        return exporters[framework](model, scaler, directory, encoding=encoding)
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


def export_torch(
    model,
    scaler: ScalerStats,
    directory: str,
    fill: list[float] | None = None,
    encoding: FittedEncoding | None = None,
) -> ExportResult:
    """ONNX of `model` behind the scaler: from "features", or with `encoding`, from the raw columns."""
    result = ExportResult()
    serving = torch_serving_module(model, scaler, fill)

    def write(path: str) -> None:
        write_torch_onnx(serving, len(scaler.mean), path, exact=encoding is not None)
        if encoding is not None:
            with_raw_inputs(path, encoding)

    attempt(result, "onnx", ONNX_FILE, directory, write)
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


def write_torch_onnx(serving, n_features: int, path: str, exact: bool = False) -> None:
    """`exact`: "features" in float64, as the raw-row encoding gives them; else float32."""
    import torch

    with quiet_exporter():
        torch.onnx.export(
            serving,
            # two rows: torch.export specialises a dimension of size 1
            (torch.zeros(2, n_features, dtype=torch.float64 if exact else torch.float32),),
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


@contextmanager
def quiet_exporter():
    """The dynamo exporter logs a warning for each torchvision op it cannot register where torchvision is
    not installed (no model here uses them), and torch.export a pytree FutureWarning: noise in a run's
    log that asks nothing of the user. Errors still reach the log and the export's note."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        registration.setLevel(level)


def export_keras(
    model,
    scaler: ScalerStats,
    directory: str,
    fill: list[float] | None = None,
    encoding: FittedEncoding | None = None,
) -> ExportResult:
    """A SavedModel and ONNX of `model` behind the scaler: from "features", or with `encoding`, from
    the raw columns (the SavedModel encodes with TensorFlow ops, the ONNX file with ONNX ones)."""
    result = ExportResult()
    serve = keras_serving_function(model, scaler, fill, exact=encoding is not None)
    endpoint = serve if encoding is None else keras_raw_row_function(serve, encoding)

    def write_onnx(path: str) -> None:
        write_keras_onnx(serve, path)
        if encoding is not None:
            with_raw_inputs(path, encoding)

    attempt(
        result,
        "saved_model",
        SAVED_MODEL_DIR,
        directory,
        lambda path: write_saved_model(model, endpoint, path),
    )
    attempt(result, "onnx", ONNX_FILE, directory, write_onnx)
    return result


def keras_serving_function(model, scaler: ScalerStats, fill: list[float] | None = None, exact: bool = False):
    """A `tf.function` from raw features to {"logits", "probabilities"}, traced on first use; with
    `fill`, a NaN is filled as the bundle fills it; `exact`: the features are float64, else float32."""
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

    dtype = tf.float64 if exact else tf.float32
    signature = [tf.TensorSpec([None, len(scaler.mean)], dtype, name=INPUT)]
    return tf.function(serve, input_signature=signature, autograph=False)


def keras_raw_row_function(serve, encoding: FittedEncoding):
    """`serve` behind the encoding: a `tf.function` whose one argument is a dict of the raw columns,
    named by `raw_inputs.signature_names`."""
    import tensorflow as tf

    def serve_raw(columns):
        return serve(tf_encoded(columns, encoding))

    return tf.function(serve_raw, input_signature=[tf_input_signature(encoding)], autograph=False)


def write_saved_model(model, serve, path: str) -> None:
    import keras

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(SERVING_ENDPOINT, serve)
    archive.write_out(path, verbose=False)


def write_keras_onnx(serve, path: str) -> None:
    import tf2onnx

    with native_log_held():
        tf2onnx.convert.from_function(
            serve, input_signature=serve.input_signature, opset=ONNX_OPSET, output_path=path
        )
    check_dynamic_rows(path)


@contextmanager
def native_log_held():
    """tf2onnx runs TensorFlow's graph optimizer, whose C++ lines ("Starting new session", a count of
    GPUs) reach the process's stderr before absl's log is set up, past TF_CPP_MIN_LOG_LEVEL. They are
    held in a file while it runs and shown only where the conversion fails."""
    sys.stderr.flush()
    kept = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(kept, 2)
            held.seek(0)
            sys.stderr.write(held.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(kept, 2)
            os.close(kept)


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
