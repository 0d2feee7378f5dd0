"""The SavedModel and ONNX exports of a Keras model, the preprocessing in their graphs."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tasks.core.bundle.export_parity import check_parity
from tasks.core.bundle.export_plan import (
    INPUT,
    LABEL,
    ONNX_FILE,
    ONNX_OPSET,
    PREDICTION,
    SAVED_MODEL_DIR,
    SAVED_MODEL_METADATA,
    SERVING_ENDPOINT,
    ExportPlan,
    ExportResult,
    attempt,
    write_json,
)
from tasks.core.bundle.onnx_graph import check_dynamic_rows, finish_onnx, native_log_held
from tasks.core.bundle.raw_inputs import tf_encoded, tf_input_signature
from tasks.core.data.api import FittedEncoding, ScalerStats


def export_keras(model, plan: ExportPlan, directory: str) -> ExportResult:
    """A SavedModel and ONNX of `model` behind the scaler: from "features", or with an encoding, from
    the raw columns (the SavedModel encodes with TensorFlow ops, the ONNX file with ONNX ones)."""
    result = ExportResult()
    serve = keras_serving_function(model, plan.scaler, plan.fill, plan.label_units())
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
    label_units: tuple[float, float] | None = None,
):
    """A `tf.function` from raw features to {"logits", "probabilities"}, traced on first use; with
    `fill`, a NaN is filled as the bundle fills it. The features are float64, as the bundle scales them.
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

    signature = [tf.TensorSpec([None, len(scaler.mean)], tf.float64, name=INPUT)]
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
