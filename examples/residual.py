"""A user's own model, worked through: a small residual MLP. Copy this module to bring your own.

Name it in a run as the model `examples.residual:build` with options such as
`{"width": 128, "blocks": 2, "dropout": 0.1}`. The module must be importable in the training image
(installed with the project, or on its PYTHONPATH); the reference is resolved there, never shipped
as pickled code.

The contract (`tasks.core.models.plugins` states it in full):

- `build(spec, options)` returns a `torch.nn.Module`, used for PyTorch targets;
  `build_keras(spec, options)` returns a `keras.Model`, used for TensorFlow targets (the `_keras`
  twin of the name in the reference). Leave one out if you only train with one framework.
- `spec` is an `InputSpec`: `n_features`, `n_classes`, and `input_shape` (None here: this model
  takes flat rows; a model for image-shaped features reshapes each row to `spec.input_shape`).
- `options` holds numbers (as floats) and strings; read them with the `option_*` helpers, which
  accept both, and refuse names you do not know.
- The model maps float32 rows `[batch, n_features]` to logits `[batch, n_classes]`: no softmax.

Before anything is trained the reference is imported, the builder is called and a forward pass on a
few CPU rows must give `[rows, n_classes]`; the artifact stores this reference, the options and the
weights, and evaluation rebuilds the model through `build` to load them.

Each framework is imported inside its builder: the TensorFlow images have no torch, the torch images
no TensorFlow, and one module serves both.
"""

from __future__ import annotations

from tasks.core.models.plugins import InputSpec, Options, check_options, option_float, option_int

DEFAULTS = {"width": 128, "blocks": 2, "dropout": 0.1}


def settings(options: Options) -> tuple[int, int, float]:
    """(width, blocks, dropout) from the options, with the defaults for what is left out."""
    check_options(options, DEFAULTS)
    width = option_int(options, "width", DEFAULTS["width"])
    blocks = option_int(options, "blocks", DEFAULTS["blocks"])
    dropout = option_float(options, "dropout", DEFAULTS["dropout"])
    if width < 1 or blocks < 0 or not 0.0 <= dropout < 1.0:
        raise ValueError(
            f"need width >= 1, blocks >= 0 and dropout in [0, 1); got {width}, {blocks}, {dropout}"
        )
    return width, blocks, dropout


def build(spec: InputSpec, options: Options):
    """The PyTorch model: a `torch.nn.Module` mapping `[batch, n_features]` to logits."""
    from examples.residual_torch import ResidualMLP

    return ResidualMLP(spec.n_features, spec.n_classes, *settings(options))


def build_keras(spec: InputSpec, options: Options):
    """The same network for TensorFlow targets, a `keras.Model`; its logits layer stays float32 so
    that mixed precision leaves the loss in full precision."""
    import keras

    width, blocks, dropout = settings(options)
    inputs = keras.Input(shape=(spec.n_features,), name="features")
    x = keras.layers.Dense(width)(inputs)
    for _ in range(blocks):
        h = keras.layers.LayerNormalization(epsilon=1e-5)(x)
        h = keras.layers.Dense(width, activation="relu")(h)
        h = keras.layers.Dropout(dropout)(h)
        x = keras.layers.Add()([x, keras.layers.Dense(width)(h)])
    x = keras.layers.LayerNormalization(epsilon=1e-5)(x)
    logits = keras.layers.Dense(spec.n_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, logits, name="residual_mlp")
