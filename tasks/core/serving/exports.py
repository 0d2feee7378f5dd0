"""Serving exports of a trained model, written into its bundle: ONNX, and a SavedModel for Keras.

Every export returns "logits" and "probabilities" (the softmax), both float32 `[rows, n_classes]`; the
batch dimension, "rows", is dynamic. Given an `ExportDescription` (the manifest's feature names, label
column, class labels and format version), it also returns "label", string `[rows]`, the class label of
the largest probability, and describes itself (`ExportPlan.metadata`: the description, the input rules
and the outputs): in the ONNX file's metadata_props (text as it is, the rest as JSON), and in the
SavedModel's assets.extra/metadata.json, a folder TF Serving leaves alone. Its inputs are the RAW rows,
in one of two forms:

- Where the bundle's encoding is its numeric columns as they are (or it has none): one input,
  "features", float32 `[rows, n_features]` in the manifest's feature order; a NaN takes the encoding's
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

import json
import logging
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tasks.core.data.api import FittedEncoding, ScalerStats
from tasks.core.serving.raw_inputs import (
    input_rules,
    raw_feeds,
    read_as_is,
    sample_table,
    tf_encoded,
    tf_input_signature,
    with_raw_inputs,
)

INPUT = "features"
OUTPUTS = ("logits", "probabilities")
LABEL = "label"
# A regression's one output: the number in the label's units, float64 `[rows]`.
PREDICTION = "prediction"
REGRESSION_OUTPUTS = (PREDICTION,)
ROWS = "rows"
ONNX_FILE = "model.onnx"
SAVED_MODEL_DIR = "saved_model"
# TF Serving's folder for files beside a SavedModel that it does not load (its warm-up requests).
SAVED_MODEL_METADATA = os.path.join("assets.extra", "metadata.json")
SERVING_ENDPOINT = "serve"
# ONNX 1.13's IR version and opsets; onnxruntime 1.15 (ONNX 1.14: IR 9, opset 19) loads them.
ONNX_OPSET = 18
ONNX_IR_VERSION = 8
ML_OPSET_FLOOR = 3
ONNXRUNTIME_FLOOR = "1.15"
PARITY_ROWS = 8
# The largest difference in a probability, or a logit's relative to it above 1; a regression's in the
# label's standard deviations (relative to the standardised prediction above 1).
PARITY_TOLERANCE = 1e-4
OUTPUT_RULES = {
    "logits": "float32 [rows, classes], classes in the order of class_labels",
    "probabilities": "float32 [rows, classes], the softmax of the logits",
    LABEL: "string [rows], the class label of the largest probability (the first where tied); empty where the "
    "probabilities are not finite (no answer)",
}
REGRESSION_OUTPUT_RULES = {
    PREDICTION: "float64 [rows], the predicted number in the label's units; NaN where the model's output "
    "is not finite (no answer)",
}
WHOLE_NUMBER_OUTPUT_RULES = {
    PREDICTION: "float64 [rows], the predicted number in the label's units, rounded to a whole number (half "
    "to even) as the label holds integers; NaN where the model's output is not finite (no answer)",
}

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportDescription:
    """What the exports say of the model they serve, as the bundle's manifest records it."""

    feature_names: list[str]  # the model's features, in order (the encoded ones where columns are raw)
    label_column: str
    class_labels: list[str]  # text, in class order: what the "label" output returns
    format_version: int  # the bundle's format
    problem_type: str = "classification"
    # A regression's label: mean + std x the model's one output is the prediction.
    target_mean: float = 0.0
    target_std: float = 1.0
    whole_numbers: bool = False  # a regression of an integer label: the prediction is rounded

    @property
    def regression(self) -> bool:
        return self.problem_type == "regression"

    @property
    def output_rules(self) -> dict[str, str]:
        if not self.regression:
            return OUTPUT_RULES
        return WHOLE_NUMBER_OUTPUT_RULES if self.whole_numbers else REGRESSION_OUTPUT_RULES


@dataclass
class ExportResult:
    """What was exported (export name -> path relative to the bundle folder) and what was not, and why;
    `checks`: export name -> what its check at export time found (onnxruntime against the model)."""

    files: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class ExportPlan:
    """What every export of one model shares: the scaler; `fill` (the encoding's value for a missing
    number, by feature) where the input is "features"; `encoding` where the inputs are the raw
    columns; the description, where given."""

    scaler: ScalerStats
    fill: list[float] | None = None
    encoding: FittedEncoding | None = None
    description: ExportDescription | None = None

    @property
    def regression(self) -> bool:
        return self.description is not None and self.description.regression

    @property
    def outputs(self) -> tuple[str, ...]:
        return REGRESSION_OUTPUTS if self.regression else OUTPUTS

    @property
    def rounds(self) -> bool:
        """Whether the prediction is rounded to a whole number, half to even, as the bundle rounds it."""
        return self.regression and self.description.whole_numbers

    def label_units(self) -> tuple[float, float] | None:
        """A regression's (mean, std) of the label, which turn the model's output into its units."""
        return (self.description.target_mean, self.description.target_std) if self.regression else None

    def metadata(self) -> dict[str, Any] | None:
        """The description and the input rules, as the exports carry them; None without a description."""
        described = self.description
        if described is None:
            return None
        inputs = input_rules(self.encoding) if self.encoding is not None else [self.features_rule()]
        return {
            "problem_type": described.problem_type,
            "label_column": described.label_column,
            "class_labels": list(described.class_labels),
            "feature_names": list(described.feature_names),
            "bundle_format_version": described.format_version,
            "inputs": inputs,
            "outputs": described.output_rules,
        }

    def features_rule(self) -> dict[str, Any]:
        rule = {
            "name": INPUT,
            "dtype": "float32",
            "shape": [ROWS, len(self.scaler.mean)],
            "order": "feature_names",
        }
        return {**rule, "missing": "NaN"} if self.fill is not None else rule


def export_model(
    model,
    framework: str,
    scaler: ScalerStats,
    directory: str,
    encoding: FittedEncoding | None = None,
    *,
    description: ExportDescription | None = None,
) -> ExportResult:
    """Write the serving exports of `model` (a torch module in eval mode on CPU, or a Keras model)
    into `directory`: taking "features" where `encoding` is the identity (or None), else the raw
    columns it reads, encoded in the graph. With `description`, each export also returns "label" and
    carries the description."""
    exporters = {"pytorch": export_torch, "tensorflow": export_keras}
    if framework not in exporters:
        raise ValueError(f"cannot export a model of framework {framework!r}: not one of {tuple(exporters)}")
    if encoded_columns(encoding):
        plan = ExportPlan(scaler, encoding=encoding, description=description)
    else:
        fill = [column.encoder.fill for column in encoding.columns] if encoding else None
        plan = ExportPlan(scaler, fill=fill, description=description)
    return exporters[framework](model, plan, directory)


def encoded_columns(encoding: FittedEncoding | None) -> list[str]:
    """The raw columns whose features are not the column's own numbers: categorical, boolean and date
    columns, and numeric ones with a missing-value indicator. None for a numeric encoding without
    missing values, whose features are the raw columns it keeps, as the exports take them."""
    if encoding is None:
        return []
    return [column.name for column in encoding.columns if not read_as_is(column)]


def export_torch(model, plan: ExportPlan, directory: str) -> ExportResult:
    """ONNX of `model` behind the scaler: from "features", or with an encoding, from the raw columns."""
    result = ExportResult()
    serving = torch_serving_module(model, plan.scaler, plan.fill, plan.label_units())

    def live(features: np.ndarray) -> tuple[np.ndarray, ...]:
        import torch

        with torch.no_grad():
            return tuple(output.numpy() for output in serving(torch.from_numpy(features)))

    def write(path: str) -> dict[str, Any]:
        write_torch_onnx(serving, len(plan.scaler.mean), path, plan.encoding is not None, plan.outputs)
        finish_onnx(path, plan)
        return check_parity(path, live, plan)

    attempt(result, "onnx", ONNX_FILE, directory, write)
    return result


def torch_serving_module(
    model,
    scaler: ScalerStats,
    fill: list[float] | None = None,
    label_units: tuple[float, float] | None = None,
):
    """`model` behind the scaler, returning (logits, probabilities). With `fill` (the encoding's value
    for a missing number, by feature), a NaN is filled as the bundle fills it. With a regression's
    `label_units` (mean, std), returning (prediction,): the one output in the label's units, float64."""
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
            self.regression = label_units is not None
            if self.regression:
                # Tensors of shape [1], not Python numbers: the exporter's optimizer drops an Add of a
                # scalar within 1e-8 of 0 and a Mul of one within 1e-5 of 1 as no-ops (onnxscript
                # rewriter/rules/common/_no_op.py, matched with rewriter/_pattern_ir.py's tolerances),
                # and a label's mean may be that small.
                self.register_buffer("label_mean", torch.tensor([label_units[0]], dtype=torch.float64))
                self.register_buffer("label_std", torch.tensor([label_units[1]], dtype=torch.float64))

        def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, ...]:
            raw = features.double()
            if self.fills:
                raw = torch.where(torch.isnan(raw), self.fill, raw)
            standardised = ((raw - self.mean) / self.scale).float()
            logits = self.model(standardised).float()
            if self.regression:
                return (logits[:, 0].double() * self.label_std + self.label_mean,)
            return logits, torch.softmax(logits, dim=-1)

    return Serving().eval()


def write_torch_onnx(
    serving, n_features: int, path: str, exact: bool = False, outputs: tuple[str, ...] = OUTPUTS
) -> None:
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
            output_names=list(outputs),
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


def export_keras(model, plan: ExportPlan, directory: str) -> ExportResult:
    """A SavedModel and ONNX of `model` behind the scaler: from "features", or with an encoding, from
    the raw columns (the SavedModel encodes with TensorFlow ops, the ONNX file with ONNX ones)."""
    result = ExportResult()
    exact = plan.encoding is not None
    serve = keras_serving_function(model, plan.scaler, plan.fill, exact, plan.label_units())
    endpoint = serve if plan.encoding is None else keras_raw_row_function(serve, plan.encoding)
    if plan.description is not None and not plan.regression:
        endpoint = keras_labelled_function(endpoint, plan.description.class_labels)
    if plan.rounds:
        endpoint = keras_rounded_function(endpoint)

    def live(features: np.ndarray) -> tuple[np.ndarray, ...]:
        outputs = serve(features)
        return tuple(outputs[name].numpy() for name in plan.outputs)

    def write_onnx(path: str) -> dict[str, Any]:
        write_keras_onnx(serve, path)
        finish_onnx(path, plan)
        return check_parity(path, live, plan)

    def write_saved_model_with_metadata(path: str) -> None:
        write_saved_model(model, endpoint, path)
        if plan.description is not None:
            write_json(os.path.join(path, SAVED_MODEL_METADATA), plan.metadata())

    attempt(result, "saved_model", SAVED_MODEL_DIR, directory, write_saved_model_with_metadata)
    attempt(result, "onnx", ONNX_FILE, directory, write_onnx)
    return result


def keras_serving_function(
    model,
    scaler: ScalerStats,
    fill: list[float] | None = None,
    exact: bool = False,
    label_units: tuple[float, float] | None = None,
):
    """A `tf.function` from raw features to {"logits", "probabilities"}, traced on first use; with
    `fill`, a NaN is filled as the bundle fills it; `exact`: the features are float64, else float32.
    With a regression's `label_units` (mean, std): to {"prediction"}, float64 in the label's units."""
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
        if label_units is not None:
            mean, std = label_units
            return {PREDICTION: tf.cast(logits[:, 0], tf.float64) * std + mean}
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


def keras_labelled_function(endpoint, class_labels: list[str]):
    """`endpoint` with one more output, "label": the class label of each row's largest probability."""
    import tensorflow as tf

    def serve_labelled(*inputs):
        outputs = endpoint(*inputs)
        labels = tf.constant(class_labels, tf.string)
        probabilities = outputs["probabilities"]
        answered = tf.reduce_all(tf.math.is_finite(probabilities), axis=1)
        label = tf.where(answered, tf.gather(labels, tf.argmax(probabilities, axis=1)), tf.constant(""))
        return {**outputs, LABEL: label}

    return tf.function(serve_labelled, input_signature=endpoint.input_signature, autograph=False)


def keras_rounded_function(endpoint):
    """`endpoint` with its "prediction" rounded to a whole number, half to even as numpy rounds."""
    import tensorflow as tf

    def serve_rounded(*inputs):
        return {PREDICTION: tf.round(endpoint(*inputs)[PREDICTION])}

    return tf.function(serve_rounded, input_signature=endpoint.input_signature, autograph=False)


def write_json(path: str, content: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as file:
        json.dump(content, file, indent=2, ensure_ascii=False)
        file.write("\n")


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


def finish_onnx(path: str, plan: ExportPlan) -> None:
    """Make the ONNX file at `path`, which takes "features", what serving reads: the raw columns as its
    inputs where the plan has an encoding; the "label" output and the metadata where it has a
    description (and a whole-number "prediction" where the label holds integers); the IR version of
    the onnxruntime floor."""
    import onnx

    if plan.encoding is not None:
        with_raw_inputs(path, plan.encoding)
    exported = onnx.load(path)
    metadata = plan.metadata()
    if metadata is not None:
        if not plan.regression:
            add_label_output(exported, metadata["class_labels"])
        elif plan.rounds:
            round_prediction(exported)
        onnx.helper.set_model_props(exported, onnx_metadata(metadata))
    for_onnxruntime_floor(exported)
    onnx.checker.check_model(exported, full_check=True)
    onnx.save(exported, path)


def add_label_output(exported, class_labels: list[str]) -> None:
    """A "label" output, string `[rows]`: the class label at the argmax of "probabilities", or "" for a
    row whose probabilities are not all finite (overflowed logits): no answer rather than a confident one."""
    from onnx import TensorProto, helper, numpy_helper

    graph = exported.graph
    constants = {
        "serving/class_labels": np.asarray(class_labels, dtype=object),
        "serving/no_label": np.asarray("", dtype=object),
        "serving/class_axis": np.asarray([1], dtype=np.int64),
        "serving/zero": np.asarray(0.0, dtype=np.float32),
    }
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in constants.items())
    graph.node.extend([
        helper.make_node("ArgMax", ["probabilities"], ["serving/class"], "serving/argmax", axis=1, keepdims=0),
        helper.make_node("Gather", ["serving/class_labels", "serving/class"], ["serving/class_label"],
                         "serving/gather", axis=0),
        # x - x is 0 where x is finite and NaN where it is NaN or infinite; a row's sum tells which.
        helper.make_node("Sub", ["probabilities", "probabilities"], ["serving/finite_zero"], "serving/sub"),
        helper.make_node("ReduceSum", ["serving/finite_zero", "serving/class_axis"], ["serving/row_zero"],
                         "serving/row_sum", keepdims=0),
        helper.make_node("Equal", ["serving/row_zero", "serving/zero"], ["serving/answered"], "serving/equal"),
        helper.make_node("Where", ["serving/answered", "serving/class_label", "serving/no_label"], [LABEL],
                         "serving/label"),
    ])  # fmt: skip
    graph.output.append(helper.make_tensor_value_info(LABEL, TensorProto.STRING, [ROWS]))


def round_prediction(exported) -> None:
    """The "prediction" rounded to a whole number: ONNX's Round rounds half to even, as numpy does."""
    from onnx import helper

    graph = exported.graph
    unrounded = "serving/unrounded_prediction"
    for node in all_nodes(graph):
        node.output[:] = [unrounded if name == PREDICTION else name for name in node.output]
        node.input[:] = [unrounded if name == PREDICTION else name for name in node.input]
    graph.node.append(helper.make_node("Round", [unrounded], [PREDICTION], "serving/round"))


def onnx_metadata(metadata: dict[str, Any]) -> dict[str, str]:
    """ONNX's metadata_props: text as it is, anything else as JSON; and the onnxruntime floor."""
    props = {key: value if isinstance(value, str) else json.dumps(value) for key, value in metadata.items()}
    return {**props, "onnxruntime_floor": ONNXRUNTIME_FLOOR}


def for_onnxruntime_floor(exported) -> None:
    """Stamp the IR version of the onnxruntime floor, or refuse an opset above it. The torch exporter
    stamps IR 10 with opset 18 but uses nothing IR 10 added (4-bit types, function overloads) except
    the nodes' metadata_props, its source lines, which are dropped: they name the exporting machine's
    paths and no runtime reads them."""
    opsets = {opset.domain or "ai.onnx": opset.version for opset in exported.opset_import}
    floors = {"ai.onnx": ONNX_OPSET, "ai.onnx.ml": ML_OPSET_FLOOR}
    above = {domain: version for domain, version in opsets.items() if version > floors.get(domain, version)}
    if above:
        raise ValueError(f"the export uses opsets {above}, above onnxruntime {ONNXRUNTIME_FLOOR}'s {floors}")
    for graph in [exported.graph, *exported.functions]:
        for node in all_nodes(graph):
            del node.metadata_props[:]
    exported.ir_version = min(exported.ir_version, ONNX_IR_VERSION)


def all_nodes(graph):
    """The nodes of a graph or function, and those of their subgraphs (an If's branches, a Loop's body)."""
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            for subgraph in [attribute.g, *attribute.graphs] if attribute.HasField("g") else attribute.graphs:
                yield from all_nodes(subgraph)


def check_parity(path: str, live: Callable, plan: ExportPlan) -> dict[str, Any]:
    """onnxruntime's outputs for PARITY_ROWS rows against the live model's (`live`: its input features
    -> (logits, probabilities), or (prediction,)); refused over PARITY_TOLERANCE."""
    try:
        import onnxruntime
    except ImportError:
        return {"not_run": "onnxruntime is not installed where the bundle was written"}
    feeds, features = parity_inputs(plan)
    outputs = plan.outputs
    expected = dict(zip(outputs, live(features), strict=True))
    got = dict(zip(outputs, onnx_session(path).run(list(outputs), feeds), strict=True))
    if plan.rounds:
        expected[PREDICTION] = rounded_expectation(got[PREDICTION], expected[PREDICTION], *plan.label_units())
    difference = max(float(np.max(np.abs(got[name] - expected[name]))) for name in outputs)
    units = plan.label_units() or (0.0, 1.0)
    relative = max(scaled_difference(got[name], expected[name], *units) for name in outputs)
    if not relative <= PARITY_TOLERANCE:  # NaN too
        scale = "in the label's standard deviations" if plan.regression else "relative to values above 1"
        raise ValueError(
            f"onnxruntime {onnxruntime.__version__}'s answers differ from the model's by {relative:.3g} "
            f"({scale}), more than {PARITY_TOLERANCE:g}"
        )
    return {
        "max_abs_difference": difference,
        "max_scaled_difference": relative,
        "tolerance": PARITY_TOLERANCE,
        "onnxruntime": onnxruntime.__version__,
        "rows": len(features),
    }


def scaled_difference(got: np.ndarray, expected: np.ndarray, mean: float = 0.0, std: float = 1.0) -> float:
    """The largest difference in units of `std` (a regression's label's; 1 else), divided by the
    standardised value (expected - `mean`) / `std` where that is above 1: float32 logits of 1e6 differ
    in their last bits by more than a probability may differ at all. Equal where both are NaN."""
    both_nan = np.isnan(got) & np.isnan(expected)
    scale = np.maximum(std, np.abs(expected - mean))
    return float(np.max(np.where(both_nan, 0.0, np.abs(got - expected) / scale), initial=0.0))


def rounded_expectation(got: np.ndarray, unrounded: np.ndarray, mean: float, std: float) -> np.ndarray:
    """The live model's numbers rounded as the export rounds them, or, where one lies within the
    tolerance of a half, either whole number beside it: float32 rounding may tip it either way."""
    slack = PARITY_TOLERANCE * np.maximum(std, np.abs(unrounded - mean))
    below = np.floor(unrounded)
    at_half = np.abs(unrounded - below - 0.5) <= slack
    beside = (got == below) | (got == below + 1)
    return np.where(at_half & beside, got, np.round(unrounded))


def parity_inputs(plan: ExportPlan) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The ONNX file's feeds for the check's rows, and the features the live model takes for them:
    with an encoding, raw rows of every kind of value (`sample_table`) and their encoded features;
    else rows about the scaler's mean, with a NaN where the export fills one."""
    if plan.encoding is not None:
        table = sample_table(plan.encoding, plan.scaler.mean, plan.scaler.scale, PARITY_ROWS)
        return raw_feeds(table, plan.encoding), plan.encoding.transform(table)
    rng = np.random.default_rng(0)
    mean, scale = np.asarray(plan.scaler.mean), np.asarray(plan.scaler.scale)
    rows = (mean + scale * rng.normal(size=(PARITY_ROWS, len(mean)))).astype(np.float32)
    if plan.fill is not None:
        rows[0, 0] = np.nan
    return {INPUT: rows}, rows


def onnx_session(path: str):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def attempt(result: ExportResult, name: str, relative: str, directory: str, write: Callable[[str], Any]):
    """Run one export into `directory/relative`: recorded in `result.files` (and what `write` returns,
    its check, in `result.checks`) if it succeeds, else in `result.notes`, with nothing left behind."""
    path = os.path.join(directory, relative)
    try:
        check = write(path)
    except Exception as error:
        logger.warning("%s export left out", name, exc_info=True)
        result.notes.append(f"{name} not exported: {summary(error)}")
        discard(path)
    else:
        result.files[name] = relative
        if check is not None:
            result.checks[name] = check


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
