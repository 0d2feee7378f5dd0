"""The Keras half of the model plug-ins: built-in builders, the checks, and the weights-only artifact.

Imports keras; `tasks.core.models` loads it only for TensorFlow targets, so torch processes never do.

The artifact is a directory holding `model.json` (the builder reference, its options and the input
spec) and `model.weights.h5` (`model.save_weights`: arrays only). Loading rebuilds the model through
the same builder and calls `load_weights`, so nothing in the file is deserialised as code. A full
`.keras` file is never written: it stores the model's config, and loading one would rebuild layers
from that config (even under `keras.saving.load_model(path, safe_mode=True)`, which only refuses
lambdas); the weights-only form needs no such trust.
"""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np

from tasks.core.config import mlp_problems
from tasks.core.models import (
    CNN_DEFAULTS,
    MLP_DEFAULTS,
    InputSpec,
    ModelSpec,
    Options,
    build,
    check_options,
    cnn_problems,
    image_shape,
    option_float,
    option_ints,
    spec_record,
)

MODEL_TYPE = "keras.Model"
SPEC_FILE = "model.json"
WEIGHTS_FILE = "model.weights.h5"


def is_model(value: object) -> bool:
    return isinstance(value, keras.Model)


def logits_shape(model: keras.Model, rows: int, n_features: int) -> list[int]:
    features = np.random.default_rng(0).standard_normal((rows, n_features)).astype("float32")
    return list(model(features, training=False).shape)


# ---- built-ins: the same architectures as their torch twins ----------------------------------------------


def mlp(spec: InputSpec, options: Options) -> keras.Model:
    """Twin of the torch `mlp`; same options. The logits layer stays float32 under mixed precision."""
    check_options(options, MLP_DEFAULTS)
    hidden = option_ints(options, "hidden_sizes", MLP_DEFAULTS["hidden_sizes"])
    dropout = option_float(options, "dropout", MLP_DEFAULTS["dropout"])
    if found := mlp_problems(hidden, dropout):
        raise ValueError("; ".join(f"{name} {rule}" for name, rule in found.items()))
    inputs = keras.Input(shape=(spec.n_features,), name="features")
    x = inputs
    for width in hidden:
        x = keras.layers.Dense(width, activation="relu")(x)
        x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, logits(x, spec.n_classes), name="mlp")


def cnn(spec: InputSpec, options: Options) -> keras.Model:
    """Twin of the torch `cnn`; same options. Rows are reshaped to (C, H, W), then to channels-last."""
    check_options(options, CNN_DEFAULTS)
    channels = option_ints(options, "channels", CNN_DEFAULTS["channels"])
    dropout = option_float(options, "dropout", CNN_DEFAULTS["dropout"])
    if found := cnn_problems(channels, dropout):
        raise ValueError("; ".join(found))
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


# ---- artifact --------------------------------------------------------------------------------------------


def save_keras_artifact(model: keras.Model, spec: ModelSpec, input_spec: InputSpec, directory: str) -> str:
    """Write the spec and the weights into `directory`; returns it."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "model": spec_record(spec),
        "input": {"n_features": input_spec.n_features, "n_classes": input_spec.n_classes},
    }
    (folder / SPEC_FILE).write_text(json.dumps(record, indent=2))
    model.save_weights(str(folder / WEIGHTS_FILE))
    return str(folder)


def load_keras_artifact(directory: str) -> tuple[keras.Model, ModelSpec]:
    """Rebuild the model through its builder and load the weights into it."""
    folder = Path(directory)
    record = json.loads((folder / SPEC_FILE).read_text())
    spec = ModelSpec(**record["model"])
    model = build(spec, record["input"]["n_features"], record["input"]["n_classes"], "tensorflow")
    model.load_weights(str(folder / WEIGHTS_FILE))
    return model, spec
