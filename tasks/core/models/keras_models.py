"""The Keras half of the model plug-ins: built-in builders, the checks, and the weights-only artifact.

Imports keras; `tasks.core.models.plugins` loads it only for TensorFlow targets, so torch processes never do.

The artifact is one numpy archive: the builder reference, its options and the input spec as JSON,
and the model's weight arrays. Loading reads it with `allow_pickle=False`, rebuilds the model through
the same builder and sets the weights, so nothing in the file is deserialised as code. A full
`.keras` file is never written: it stores the model's config, and loading one rebuilds layers from
that config (even `keras.saving.load_model(path, safe_mode=True)` only refuses lambdas); the
weights-only form needs no such trust.
"""

from __future__ import annotations

import json

import keras
import numpy as np

from tasks.core.models.memory import FP32, ModelFootprint
from tasks.core.models.plugins import (
    InputSpec,
    ModelSpec,
    Options,
    artifact_record,
    check_model,
    cnn_options,
    image_shape,
    mlp_options,
    rebuild,
)
from tasks.core.models.precision import for_planning

MODEL_TYPE = "keras.Model"
SPEC_KEY = "spec"
WEIGHT_PREFIX = "weight_"


def is_model(value: object) -> bool:
    return isinstance(value, keras.Model)


def trainable_count(model: keras.Model) -> int:
    return sum(int(np.prod(weight.shape)) for weight in model.trainable_weights)


def probe_logits(model: keras.Model, rows: int, n_features: int) -> tuple[list[int], bool]:
    """The logits' shape and whether they are all finite."""
    features = np.random.default_rng(0).standard_normal((rows, n_features)).astype("float32")
    logits = np.asarray(model(features, training=False))
    return list(logits.shape), bool(np.isfinite(logits).all())


def footprint(spec: ModelSpec, input_spec: InputSpec, precision: str) -> ModelFootprint:
    """The model built and checked on CPU rows; parameters counted from its weights. Activations are
    estimated, not probed: each layer's output per row, kept for the backward pass and matched by a
    gradient of the same size (in the precision's bytes per value). A model whose layers have no
    static output shape (subclassed) gets 0, and the OOM guard covers what the plan does not see."""
    model = check_model(spec, input_spec.n_features, input_spec.n_classes, "tensorflow")
    trainable = trainable_count(model)
    counted = for_planning(precision)
    return ModelFootprint(
        state_bytes=sum(int(np.prod(weight.shape)) * FP32 for weight in model.weights),
        trainable_bytes=trainable * FP32,
        trainable_count=trainable,
        activation_bytes_per_row=2 * counted.value_bytes * output_values_per_row(model),
        n_features=input_spec.n_features,
        precision=counted.name,
    )


def output_values_per_row(model: keras.Model) -> int:
    values = 0
    for layer in model.layers:
        try:
            shape = layer.output.shape
        except (AttributeError, ValueError):
            return 0
        if not isinstance(layer, keras.layers.InputLayer):
            values += int(np.prod([size for size in shape[1:] if size is not None]))
    return values


# ---- built-ins: the same architectures as their torch twins ----------------------------------------------


def mlp(spec: InputSpec, options: Options) -> keras.Model:
    """Twin of the torch `mlp`; same options. The logits layer stays float32 under mixed precision."""
    hidden, dropout = mlp_options(options)
    inputs = keras.Input(shape=(spec.n_features,), name="features")
    x = inputs
    for width in hidden:
        x = keras.layers.Dense(width, activation="relu")(x)
        x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, logits(x, spec.n_classes), name="mlp")


def cnn(spec: InputSpec, options: Options) -> keras.Model:
    """Twin of the torch `cnn`; same options. Rows are reshaped to (C, H, W), then to channels-last."""
    channels, dropout = cnn_options(options)
    inputs = keras.Input(shape=(spec.n_features,), name="features")
    x = keras.layers.Reshape(image_shape(spec))(inputs)
    x = keras.layers.Permute((2, 3, 1))(x)
    for width in channels:
        x = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D(2, padding="same")(x)
    x = keras.layers.Dropout(dropout)(keras.layers.Flatten()(x))
    return keras.Model(inputs, logits(x, spec.n_classes), name="cnn")


def logits(x, n_classes: int):
    return keras.layers.Dense(n_classes, dtype="float32", name="logits")(x)


# ---- artifact: the spec as JSON plus the weight arrays, in one .npz read with allow_pickle=False ------------


def save_keras_artifact(model: keras.Model, spec: ModelSpec, input_spec: InputSpec, path: str) -> None:
    """The builder reference, its options and the weights: one numpy archive of plain arrays."""
    record = artifact_record(spec, input_spec)
    weights = {f"{WEIGHT_PREFIX}{index}": array for index, array in enumerate(model.get_weights())}
    with open(path, "wb") as file:  # a file object: np.savez would append ".npz" to a bare name
        np.savez(file, **{SPEC_KEY: np.array(json.dumps(record))}, **weights)


def load_keras_artifact(path: str) -> tuple[keras.Model, ModelSpec]:
    """Rebuild the model through its builder and set its weights; nothing is deserialised as code."""
    with np.load(path, allow_pickle=False) as archive:
        record = json.loads(str(archive[SPEC_KEY]))
        weights = [archive[f"{WEIGHT_PREFIX}{index}"] for index in range(len(archive.files) - 1)]
    model, spec = rebuild(record, "tensorflow")
    model.set_weights(weights)
    return model, spec
