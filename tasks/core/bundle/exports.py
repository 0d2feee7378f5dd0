"""Serving exports of a trained model, written into its bundle: ONNX, and a SavedModel for Keras.

Every export returns "logits" and "probabilities" (the softmax), both float32 `[rows, n_classes]`; the
batch dimension, "rows", is dynamic. Given an `ExportDescription` (the manifest's feature names, label
column, class labels and format version), it also returns "label", string `[rows]`, the class label of
the largest probability, and describes itself (`ExportPlan.metadata`: the description, the input rules
and the outputs): in the ONNX file's metadata_props (text as it is, the rest as JSON), and in the
SavedModel's assets.extra/metadata.json, a folder TF Serving leaves alone. Its inputs are the RAW rows,
in one of two forms:

- Where the bundle's encoding is its numeric columns as they are (or it has none): one input,
  "features", float64 `[rows, n_features]` in the manifest's feature order; a NaN takes the encoding's
  fill (the train mean), as the bundle fills it.
- Otherwise (a categorical, boolean or date column, or a missing-value indicator): one input per raw
  column the encoding reads, `[rows, 1]`: text as strings ('' where missing), numbers, booleans (0/1)
  and dates (Unix seconds, UTC) as float64 (NaN where missing); the graph encodes them as the bundle's
  `FittedEncoding` does (raw_inputs.py holds the conventions). The ONNX inputs are named as the columns
  (`raw_inputs.onnx_input_names`: a column named as an output, e.g. "label", as "input/label"), the
  SavedModel's as `raw_inputs.signature_names` gives (TensorFlow renames some characters).

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

The ONNX files are stamped IR 8 with opset 18 (ai.onnx.ml 3 at most), ONNX 1.13's, for a floor of
onnxruntime 1.15 (1.15.0 loads them and agrees within 3e-7; 1.14, built on ONNX 1.13, should too,
untested). onnxruntime refuses a file whose IR version is above its ONNX's (IR 10 needs 1.18, IR 9
1.15), and the torch exporter stamps IR 10 while using nothing added since IR 8.
Each ONNX file is run in onnxruntime as it is written, on PARITY_ROWS rows with every kind of value and
a gap (`parity_inputs`), against the live model: the largest difference and onnxruntime's version go
in the result's `checks`, and a file beyond PARITY_TOLERANCE is left out with a note. A regression's
difference is counted in the label's standard deviations, so a label of any scale is held alike. A
regression of an integer label answers whole numbers, as the bundle does: ONNX's Round and the
SavedModel's tf.round, both half to even as numpy; its check takes the live model's numbers rounded,
either whole number beside a half within the tolerance.

A user's model may use what an exporter cannot express (data-dependent control flow, an op without
an ONNX conversion, a batch size fixed in its forward). Its weights still load through the bundle,
so such an export is left out and the result's notes say why, rather than failing the run.

Imports torch, tensorflow, keras, onnx and tf2onnx only inside the functions that use them: this
module is imported where only one framework is installed.
"""

from __future__ import annotations

from tasks.core.bundle.export_plan import ExportDescription, ExportPlan, ExportResult
from tasks.core.bundle.keras_export import export_keras
from tasks.core.bundle.raw_inputs import read_as_is
from tasks.core.bundle.torch_export import export_torch
from tasks.core.data.api import FittedEncoding, ScalerStats


def export_model(
    model,
    framework: str,
    scaler: ScalerStats,
    directory: str,
    encoding: FittedEncoding,
    *,
    description: ExportDescription | None = None,
) -> ExportResult:
    """Write the serving exports of `model` (a torch module in eval mode on CPU, or a Keras model)
    into `directory`: taking "features" where `encoding` reads every column as it is, else the raw
    columns it reads, encoded in the graph. With `description`, each export also returns "label" and
    carries the description."""
    exporters = {"pytorch": export_torch, "tensorflow": export_keras}
    if framework not in exporters:
        raise ValueError(f"cannot export a model of framework {framework!r}: not one of {tuple(exporters)}")
    if encoded_columns(encoding):
        plan = ExportPlan(scaler, encoding=encoding, description=description)
    else:
        fill = [column.encoder.fill for column in encoding.columns]
        plan = ExportPlan(scaler, fill=fill, description=description)
    return exporters[framework](model, plan, directory)


def encoded_columns(encoding: FittedEncoding) -> list[str]:
    """The raw columns whose features are not the column's own numbers: categorical, boolean, date and
    text columns, and numeric ones with a missing-value indicator. None for a numeric encoding without
    missing values, whose features are the raw columns it keeps, as the exports take them."""
    return [column.name for column in encoding.columns if not read_as_is(column)]
