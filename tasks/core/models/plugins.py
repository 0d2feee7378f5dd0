"""Models are plug-ins: a name (a built-in or an importable `package.module:builder`) plus options.

The builder contract
--------------------
A builder is a plain function::

    def build(spec: InputSpec, options: Mapping[str, float | str]) -> Model

- `spec.n_features`: the number of feature columns; every batch is a float32 array or tensor of
  shape `[rows, n_features]`, standardised, in the column order of the prepared data.
- `spec.input_shape`: `None`, or the shape (e.g. `(1, 8, 8)`) the user said the feature columns form,
  row-major; the model reshapes each flat row itself.
- `spec.n_classes`: the model's output width: the number of classes, or 1 for a regression
  (`spec.regression`, also `spec.n_outputs`), whose single output is the standardised number.
- `options`: the user's options, by name; values are numbers or strings (numbers arrive as floats, so
  read them with `option_int`, `option_float`, `option_ints`). Refuse options you do not know
  (`check_options`) so a typo is an error rather than a silent default.

It returns, for a PyTorch target, a `torch.nn.Module` and, for a TensorFlow target, a `keras.Model`;
either maps a batch `[rows, n_features]` to class logits `[rows, n_classes]` (no softmax: the loss
applies it), or for a regression to `[rows, 1]` (no activation: the loss is the squared error). Keras models keep their logits layer `dtype="float32"` so mixed precision stays stable.

For a TensorFlow target, the reference `package.module:name` resolves to `name_keras` in the same
module when that exists, else to `name` itself. A module that serves both frameworks imports each
framework inside its builder, since the TensorFlow images have no torch and the torch images no
TensorFlow. `examples/residual.py` is a worked example to copy.

References are resolved by importing code present in the training image; an artifact records the
reference and options next to the weights and is rebuilt through the same builder, so no code is ever
unpickled from an input or an artifact. A reference in an artifact is still code chosen by whoever
wrote the file: a bundle from elsewhere is rebuilt through a user's builder only where the caller
trusts it (`BuilderTrust`); the built-ins always.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from tasks.core.models.memory import ModelFootprint

FRAMEWORKS = ("pytorch", "tensorflow")
# Built-in names and the builder each framework uses for them.
BUILTINS: dict[str, dict[str, str]] = {
    "mlp": {
        "pytorch": "tasks.core.models.torch_models:mlp",
        "tensorflow": "tasks.core.models.keras_models:mlp",
    },
    "cnn": {
        "pytorch": "tasks.core.models.torch_models:cnn",
        "tensorflow": "tasks.core.models.keras_models:cnn",
    },
}
# The framework-specific half of the checks and artifacts, imported only for its own framework.
FRAMEWORK_MODULES = {
    "pytorch": "tasks.core.models.torch_models",
    "tensorflow": "tasks.core.models.keras_models",
}
KERAS_SUFFIX = "_keras"
# The built-ins' options and their defaults.
MLP_DEFAULTS = {"hidden_sizes": [256, 128], "dropout": 0.1}
CNN_DEFAULTS = {"channels": [32, 64], "dropout": 0.25}

Options = Mapping[str, Any]


class FrameworkModels(Protocol):
    """What each framework's half (`FRAMEWORK_MODULES`: tasks/core/models/torch_models.py and keras_models.py,
    each a module that provides these names) gives the checks, the planner and the built-ins; a test
    checks both halves against it. The framework's types are `Any` here: this module imports neither."""

    MODEL_TYPE: ClassVar[str]  # what a builder must return, as an error message names it

    def is_model(self, value: object) -> bool: ...

    def trainable_count(self, model: Any) -> int: ...

    def probe_logits(self, model: Any, rows: int, n_features: int) -> tuple[list[int], bool]:
        """The logits' shape on `rows` random rows, and whether every value is finite."""

    def footprint(self, spec: ModelSpec, input_spec: InputSpec, precision: str) -> ModelFootprint:
        """The model's memory per worker in `precision`, for the planner (tasks/core/models/memory.py)."""

    def mlp(self, spec: InputSpec, options: Options) -> Any: ...

    def cnn(self, spec: InputSpec, options: Options) -> Any: ...


class ModelError(ValueError):
    """A model reference that cannot be resolved, built or run; the message names the reference."""


class TrainingDiverged(ValueError):
    """The training loss became NaN or infinite: both loops stop rather than report or save a model
    trained on it. Built with `at`; the message alone is the exception's argument, so it pickles."""

    @classmethod
    def at(cls, epoch: int, step: int, loss: float | None, learning_rate: float) -> TrainingDiverged:
        """`epoch` and `step` counted from 1; `loss` None where only another rank saw it."""
        seen = f"is {loss}" if loss is not None else "is not finite on another rank"
        return cls(
            f"training diverged at epoch {epoch}, step {step}: the training loss {seen}; lower "
            f"learning_rate (now {learning_rate:g}) or train with precision 'fp32'"
        )


@dataclass
class ModelSpec:
    """Which model to train: the workflow input, and what an artifact records with the weights."""

    builder: str = "mlp"  # a BUILTINS name or "package.module:function"
    input_shape: str = ""  # e.g. "1x8x8": the shape the feature columns form; "" for flat features
    options: dict[str, float | str] = field(default_factory=dict)


@dataclass(frozen=True)
class InputSpec:
    """What a builder is given about the data."""

    n_features: int
    n_classes: int  # the output width: 1 for a regression, whose one output is the predicted number
    input_shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.n_features < 1 or self.n_classes < 1:
            raise ModelError(
                f"need >= 1 feature and >= 2 classes (or 1 output for a regression), got "
                f"{self.n_features} and {self.n_classes}"
            )
        if self.input_shape is not None and math.prod(self.input_shape) != self.n_features:
            shape = "x".join(map(str, self.input_shape))
            raise ModelError(
                f"input_shape '{shape}' has {math.prod(self.input_shape)} values, "
                f"the data has {self.n_features} features"
            )

    @property
    def regression(self) -> bool:
        """A single output cannot choose among classes: it is a number."""
        return self.n_classes == 1

    @property
    def n_outputs(self) -> int:
        return self.n_classes

    @classmethod
    def parse(cls, n_features: int, n_classes: int, input_shape: str = "") -> InputSpec:
        """`input_shape` as written in a ModelSpec: dimensions joined by "x", or "" for flat rows."""
        return cls(n_features, n_classes, parse_shape(input_shape))


def parse_shape(text: str) -> tuple[int, ...] | None:
    if not text.strip():
        return None
    parts = text.strip().lower().split("x")
    if not all(part.strip().isdecimal() and int(part) > 0 for part in parts):
        raise ModelError(f"input_shape '{text}' is not positive dimensions joined by 'x', e.g. '1x8x8'")
    return tuple(int(part) for part in parts)


# ---- options: numbers arrive as floats (or strings) from a workflow input ----------------------------


def check_options(options: Options, known: Iterable[str]) -> None:
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")


def option_float(options: Options, name: str, default: float) -> float:
    value = options.get(name, default)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"option {name}={value!r} is not a number") from None


def option_int(options: Options, name: str, default: int) -> int:
    number = option_float(options, name, default)
    if not number.is_integer():
        raise ValueError(f"option {name}={options.get(name)!r} is not a whole number")
    return int(number)


def option_ints(options: Options, name: str, default: list[int]) -> list[int]:
    """A list of whole numbers: a list, a single number, or a string such as "256,128"."""
    value = options.get(name, default)
    items = value.split(",") if isinstance(value, str) else value
    items = items if isinstance(items, list | tuple) else [items]
    try:
        return [option_int({name: item}, name, 0) for item in items if str(item).strip()]
    except ValueError:
        raise ValueError(f"option {name}={value!r} is not a list of whole numbers, e.g. '256,128'") from None


# ---- what the built-ins share across frameworks ------------------------------------------------------


def mlp_problems(hidden_sizes: list[int], dropout: float) -> dict[str, str]:
    """What is wrong with an MLP's shape, by option name."""
    found = {}
    if not hidden_sizes or any(size < 1 for size in hidden_sizes):
        found["hidden_sizes"] = "needs at least one layer and positive widths"
    if not 0.0 <= dropout < 1.0:
        found["dropout"] = "must be in [0, 1)"
    return found


def mlp_options(options: Options) -> tuple[list[int], float]:
    """The mlp's hidden sizes and dropout from its options, checked."""
    check_options(options, MLP_DEFAULTS)
    hidden = option_ints(options, "hidden_sizes", MLP_DEFAULTS["hidden_sizes"])
    dropout = option_float(options, "dropout", MLP_DEFAULTS["dropout"])
    values = {"hidden_sizes": hidden, "dropout": dropout}
    if found := mlp_problems(hidden, dropout):
        raise ValueError("; ".join(f"{name}={values[name]!r}: {rule}" for name, rule in found.items()))
    return hidden, dropout


def cnn_options(options: Options) -> tuple[list[int], float]:
    """The cnn's channels and dropout from its options, checked."""
    check_options(options, CNN_DEFAULTS)
    channels = option_ints(options, "channels", CNN_DEFAULTS["channels"])
    dropout = option_float(options, "dropout", CNN_DEFAULTS["dropout"])
    if found := cnn_problems(channels, dropout):
        raise ValueError("; ".join(found))
    return channels, dropout


def mlp_spec(hidden_sizes: list[int], dropout: float = MLP_DEFAULTS["dropout"]) -> ModelSpec:
    """The built-in mlp with these layers, as a workflow input would name it."""
    return ModelSpec("mlp", options={"hidden_sizes": ",".join(map(str, hidden_sizes)), "dropout": dropout})


def image_shape(spec: InputSpec) -> tuple[int, int, int]:
    """(channels, height, width) for the cnn: input_shape CxHxW, or HxW for one channel."""
    shape = spec.input_shape
    if shape is None or len(shape) not in (2, 3):
        raise ValueError("the cnn needs input_shape CxHxW or HxW, e.g. '1x8x8'")
    return (1, *shape) if len(shape) == 2 else shape


def cnn_problems(channels: list[int], dropout: float) -> list[str]:
    found = []
    if not channels or min(channels) < 1:
        found.append("channels needs at least one positive entry")
    if not 0.0 <= dropout < 1.0:
        found.append("dropout must be in [0, 1)")
    return found


# ---- resolving and building --------------------------------------------------------------------------


def resolve(builder: str, framework: str) -> Callable[..., Any]:
    """The builder function `builder` names for `framework`; ModelError naming it if there is none."""
    if framework not in FRAMEWORKS:
        raise ModelError(f"model {builder!r}: unknown framework {framework!r}, not one of {FRAMEWORKS}")
    if builder in BUILTINS:
        return import_function(BUILTINS[builder][framework], builder)
    module, name = check_reference(builder)
    if framework == "tensorflow" and hasattr(import_module(module, builder), name + KERAS_SUFFIX):
        name += KERAS_SUFFIX
    return import_function(f"{module}:{name}", builder)


def check_reference(builder: str) -> tuple[str, str]:
    """The module and function a user's reference names; ModelError unless it has that form."""
    if ":" not in builder:
        raise ModelError(
            f"model {builder!r} is neither a built-in ({', '.join(BUILTINS)}) "
            "nor a 'package.module:builder' reference"
        )
    return split_reference(builder, builder)


def split_reference(reference: str, named: str) -> tuple[str, str]:
    module, _, name = reference.partition(":")
    if not module.strip() or not name.isidentifier():
        raise ModelError(f"model {named!r} is not a 'package.module:builder' reference")
    return module, name


def import_module(module: str, named: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name and (module == error.name or module.startswith(error.name + ".")):
            raise ModelError(f"model {named!r}: no module named {module!r} in this image") from None
        raise ModelError(f"model {named!r}: importing {module!r} failed: {error}") from error
    except Exception as error:
        raise ModelError(f"model {named!r}: importing {module!r} failed: {describe_error(error)}") from error


def import_function(reference: str, named: str) -> Callable[..., Any]:
    module, name = split_reference(reference, named)
    function = getattr(import_module(module, named), name, None)
    if function is None:
        raise ModelError(f"model {named!r}: module {module!r} has no function {name!r}")
    if not callable(function):
        raise ModelError(f"model {named!r}: {reference} is {article(function)}, not a callable builder")
    return function


def build(spec: ModelSpec, n_features: int, n_classes: int, framework: str):
    """Build the model `spec` names for `framework`, checking the type it returns."""
    input_spec = input_spec_for(spec, n_features, n_classes)
    builder = resolve(spec.builder, framework)
    try:
        model = builder(input_spec, dict(spec.options))
    except Exception as error:
        raise ModelError(
            f"model {spec.builder!r} failed to build for target framework {framework}: {describe_error(error)}"
        ) from error
    kit = framework_module(framework)
    if not kit.is_model(model):
        raise ModelError(
            f"model {spec.builder!r} returned {article(model)}, not a {kit.MODEL_TYPE} "
            f"for target framework {framework}"
        )
    return model


def check_model(spec: ModelSpec, n_features: int, n_classes: int, framework: str, rows: int = 4):
    """Build the model and run a forward pass on `rows` random CPU rows; ModelError unless the logits
    come out `[rows, n_classes]` and finite, and the model has parameters to train. Meant to run
    before any accelerator is requested (and before the memory probe). Returns the model."""
    model = build(spec, n_features, n_classes, framework)
    check_logits(spec, model, n_features, n_classes, framework, rows)
    check_trainable(spec, model, framework)
    return model


def check_trainable(spec: ModelSpec, model, framework: str) -> None:
    """ModelError unless the model has a parameter to train. Checked after a forward pass, which
    creates the weights of a Keras model whose layers build on first call."""
    if framework_module(framework).trainable_count(model) == 0:
        raise ModelError(
            f"model {spec.builder!r} has no trainable parameters, so training would change nothing; "
            "return a model with at least one trainable layer (none frozen by requires_grad=False "
            "or trainable=False)"
        )


def check_logits(spec: ModelSpec, model, n_features: int, n_classes: int, framework: str, rows: int = 4):
    """A forward pass of `rows` random rows, on the device the model's parameters are on: logits of
    shape `[rows, n_classes]`, all finite (not checkable on the meta device, where nothing is computed)."""
    try:
        shape, finite = framework_module(framework).probe_logits(model, rows, n_features)
    except Exception as error:
        raise ModelError(
            f"model {spec.builder!r} failed a forward pass on {rows} CPU rows of {n_features} features: "
            f"{describe_error(error)}"
        ) from error
    if shape != [rows, n_classes]:
        raise ModelError(f"model {spec.builder!r} gave logits of shape {shape}, expected {[rows, n_classes]}")
    if not finite:
        raise ModelError(
            f"model {spec.builder!r} gave NaN or infinite logits for {rows} random standardised rows; "
            "fix the builder's forward pass (or the weights it starts from)"
        )


def measure_footprint(spec: ModelSpec, n_features: int, n_classes: int, framework: str, precision: str):
    """The model checked (as `check_model`) and its training memory per worker, a
    `tasks.core.models.memory.ModelFootprint`: what the planner sizes accelerators by, for the `precision`
    the user asked for."""
    input_spec = input_spec_for(spec, n_features, n_classes)
    return framework_module(framework).footprint(spec, input_spec, precision)


def spec_problems(spec: ModelSpec) -> str:
    """What is wrong with a spec before the data is seen ("" if nothing): the reference's form and
    the input shape's. Whether it imports and builds is `check_model`'s to say, in the training image."""
    try:
        if spec.builder not in BUILTINS:
            check_reference(spec.builder)
        parse_shape(spec.input_shape)
    except ModelError as error:
        return str(error)
    return ""


def input_spec_for(spec: ModelSpec, n_features: int, n_classes: int) -> InputSpec:
    try:
        return InputSpec.parse(n_features, n_classes, spec.input_shape)
    except ModelError as error:
        raise ModelError(f"model {spec.builder!r}: {error}") from None


def framework_module(framework: str) -> FrameworkModels:
    if framework not in FRAMEWORK_MODULES:
        raise ModelError(f"unknown framework {framework!r}, not one of {FRAMEWORKS}")
    return importlib.import_module(FRAMEWORK_MODULES[framework])


def describe_spec(spec: ModelSpec) -> str:
    """One line naming the model, e.g. "cnn 1x8x8 (channels=32,64)"."""
    options = ", ".join(f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}"
                        for name, value in sorted(spec.options.items()))  # fmt: skip
    return " ".join(
        part for part in (spec.builder, spec.input_shape, f"({options})" if options else "") if part
    )


def artifact_record(spec: ModelSpec, input_spec: InputSpec) -> dict[str, Any]:
    """What an artifact keeps besides the weights, as plain primitives: enough to rebuild the model."""
    return {
        "model": {"builder": spec.builder, "input_shape": spec.input_shape, "options": dict(spec.options)},
        "input": {"n_features": input_spec.n_features, "n_classes": input_spec.n_classes},
    }


def rebuild(record: Mapping[str, Any], framework: str):
    """The model an `artifact_record` describes, built afresh through its builder, and its spec."""
    spec = ModelSpec(**record["model"])
    return build(spec, record["input"]["n_features"], record["input"]["n_classes"], framework), spec


@dataclass(frozen=True)
class BuilderTrust:
    """Which builders an artifact from elsewhere may name, so that loading it imports and calls them:
    the built-ins always; a user's `package.module:builder` only when listed in `references`, or any
    with `any_code`."""

    references: frozenset[str] = frozenset()
    any_code: bool = False

    def allows(self, builder: str) -> bool:
        return self.any_code or is_builtin(builder) or builder in self.references


def is_builtin(builder: str) -> bool:
    """A built-in's name, or the reference it resolves to for a framework."""
    return builder in BUILTINS or any(builder in references.values() for references in BUILTINS.values())


def article(value: object) -> str:
    name = type(value).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"


def describe_error(error: BaseException) -> str:
    return str(error) if isinstance(error, ModelError | ValueError) else f"{type(error).__name__}: {error}"
