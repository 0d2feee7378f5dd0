"""Models as plug-ins: references resolved and checked, built-ins and the worked example, weights-only
artifacts, and the memory probe against measured peaks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from tasks.core.models.memory import ESTIMATE_HIGH, ESTIMATE_LOW
from tasks.core.models.plugins import (
    MLP_DEFAULTS,
    InputSpec,
    ModelError,
    ModelSpec,
    build,
    check_model,
    option_int,
    option_ints,
)
from tasks.core.models.probe import measure_state, probe_footprint
from tasks.core.models.torch_models import build_mlp, load_torch_artifact, save_torch_artifact
from tasks.core.training.config import TrainConfig
from tests.unit.planning.test_planner import measured_peak_bytes

HERE = "tests.unit.models.test_builders"
SPECS = {
    "mlp": (ModelSpec("mlp", options={"hidden_sizes": "32,16", "dropout": 0.2}), 64),
    "cnn": (ModelSpec("cnn", "1x8x8", {"channels": "8,16"}), 64),
    "residual": (ModelSpec("examples.residual:build", options={"width": 32, "blocks": 2}), 20),
}


# Builders that break the contract, referenced as tests.unit.models.test_builders:<name>.
def returns_list(spec: InputSpec, options) -> list:
    return [nn.Linear(spec.n_features, spec.n_classes)]


def wrong_logits(spec: InputSpec, options) -> nn.Module:
    return nn.Linear(spec.n_features, spec.n_classes - 3)


def raises(spec: InputSpec, options) -> nn.Module:
    raise RuntimeError("out of ideas")


def forward_fails(spec: InputSpec, options) -> nn.Module:
    return nn.Linear(spec.n_features + 1, spec.n_classes)


NOT_A_FUNCTION = 42


@pytest.mark.parametrize(
    "builder, input_shape, message",
    [
        ("no_such_package.models:build", "", "model 'no_such_package.models:build': no module named"),
        (f"{HERE}:no_such_builder", "", f"module '{HERE}' has no function 'no_such_builder'"),
        (f"{HERE}:NOT_A_FUNCTION", "", "is an int, not a callable builder"),
        ("resnet", "", r"'resnet' is neither a built-in \(mlp, cnn\) nor a 'package.module:builder'"),
        (f"{HERE}:", "", "is not a 'package.module:builder' reference"),
        (
            f"{HERE}:returns_list",
            "",
            f"model '{HERE}:returns_list' returned a list, not a torch.nn.Module for target framework pytorch",
        ),
        (f"{HERE}:wrong_logits", "", r"gave logits of shape \[4, 7\], expected \[4, 10\]"),
        (f"{HERE}:raises", "", "failed to build for target framework pytorch: RuntimeError: out of ideas"),
        (f"{HERE}:forward_fails", "", "failed a forward pass on 4 CPU rows of 64 features: RuntimeError"),
        ("cnn", "2x8x8", "model 'cnn': input_shape '2x8x8' has 128 values, the data has 64 features"),
        ("cnn", "8by8", "input_shape '8by8' is not positive dimensions joined by 'x'"),
        ("cnn", "", "the cnn needs input_shape CxHxW or HxW"),
    ],
)
def test_bad_models_are_refused_naming_the_reference(builder, input_shape, message):
    with pytest.raises(ModelError, match=message):
        check_model(ModelSpec(builder, input_shape), 64, 10, "pytorch")


def test_an_import_error_inside_the_users_module_is_told_apart(tmp_path, monkeypatch):
    (tmp_path / "needs_missing.py").write_text(
        "import not_installed_anywhere\n\ndef build(spec, options): ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModelError, match="importing 'needs_missing' failed: No module named 'not_installed"):
        check_model(ModelSpec("needs_missing:build"), 64, 10, "pytorch")


def test_unknown_and_malformed_options_are_refused():
    with pytest.raises(ModelError, match=r"model 'mlp' failed .* unknown option\(s\) hiden_sizes"):
        build(ModelSpec("mlp", options={"hiden_sizes": "64"}), 64, 10, "pytorch")
    with pytest.raises(ModelError, match=r"option hidden_sizes='64,x' is not a list of whole numbers"):
        build(ModelSpec("mlp", options={"hidden_sizes": "64,x"}), 64, 10, "pytorch")
    with pytest.raises(ModelError, match=r"dropout=1.5: must be in \[0, 1\)"):
        build(ModelSpec("mlp", options={"dropout": 1.5}), 64, 10, "pytorch")


def test_options_accept_numbers_strings_and_lists():
    assert option_ints({"h": "256, 128"}, "h", []) == [256, 128]
    assert option_ints({"h": [64.0, "32"]}, "h", []) == [64, 32]
    assert option_ints({"h": 16.0}, "h", []) == [16]
    assert option_int({"n": "3"}, "n", 0) == 3
    with pytest.raises(ValueError, match="not a whole number"):
        option_int({"n": 2.5}, "n", 0)


def test_the_default_model_is_the_mlp_with_its_defaults():
    assert TrainConfig().model == ModelSpec("mlp")
    model = build(ModelSpec(), 37, 5, "pytorch")
    defaults = build_mlp(37, 5, MLP_DEFAULTS["hidden_sizes"], MLP_DEFAULTS["dropout"])
    assert [p.shape for p in model.parameters()] == [p.shape for p in defaults.parameters()]


def test_model_spec_round_trips_through_flytes_type_engine():
    from flytekit.core.context_manager import FlyteContextManager
    from flytekit.core.type_engine import TypeEngine
    from flytekit.models.literals import Literal

    spec = ModelSpec("cnn", "1x8x8", {"channels": "32,64", "dropout": 0.25, "width": 3})
    ctx = FlyteContextManager.current_context()
    literal = TypeEngine.to_literal(ctx, spec, ModelSpec, TypeEngine.to_literal_type(ModelSpec))
    back = TypeEngine.to_python_value(ctx, Literal.from_flyte_idl(literal.to_flyte_idl()), ModelSpec)
    assert back == spec and back.options["channels"] == "32,64"
    assert isinstance(back.options["width"], float)  # numbers come back as floats: builders read them so


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_builtins_and_the_example_give_class_logits(name, framework):
    spec, n_features = SPECS[name]
    check_model(spec, n_features, 10, framework, rows=5)


@pytest.mark.parametrize("name", SPECS)
def test_keras_twins_have_the_torch_parameter_count(name):
    spec, n_features = SPECS[name]
    torch_model = build(spec, n_features, 10, "pytorch")
    keras_model = build(spec, n_features, 10, "tensorflow")
    assert keras_model.count_params() == sum(p.numel() for p in torch_model.parameters())


def test_a_torch_builder_named_for_tensorflow_is_refused():
    with pytest.raises(ModelError, match=f"'{HERE}:wrong_logits' returned a Linear, not a keras.Model"):
        check_model(ModelSpec(f"{HERE}:wrong_logits"), 64, 10, "tensorflow")


def test_torch_artifact_rebuilds_through_the_builder_with_identical_predictions(tmp_path):
    spec, n_features = SPECS["cnn"]
    torch.manual_seed(0)
    model = build(spec, n_features, 10, "pytorch").eval()
    path = str(tmp_path / "model.pt")
    save_torch_artifact(model, spec, InputSpec.parse(n_features, 10, spec.input_shape), path)

    payload = torch.load(path, weights_only=True)
    assert payload["model"] == {"builder": "cnn", "input_shape": "1x8x8", "options": spec.options}
    loaded, loaded_spec = load_torch_artifact(path)
    rows = torch.randn(16, n_features)
    with torch.no_grad():
        assert torch.equal(model(rows), loaded(rows))
    assert loaded_spec == spec


def test_keras_artifact_rebuilds_through_the_builder_with_identical_predictions(tmp_path):
    from tasks.core.models.keras_models import SPEC_KEY, load_keras_artifact, save_keras_artifact

    spec, n_features = SPECS["residual"]
    model = build(spec, n_features, 10, "tensorflow")
    path = str(tmp_path / "model.npz")
    save_keras_artifact(model, spec, InputSpec(n_features, 10), path)
    with np.load(path, allow_pickle=False) as archive:  # plain arrays: nothing to unpickle
        assert json.loads(str(archive[SPEC_KEY]))["model"]["builder"] == "examples.residual:build"

    loaded, loaded_spec = load_keras_artifact(path)
    rows = np.random.default_rng(0).standard_normal((16, n_features)).astype("float32")
    assert np.array_equal(model(rows, training=False).numpy(), loaded(rows, training=False).numpy())
    assert loaded_spec == spec


# ---- the memory probe ---------------------------------------------------------------------------------

# Against the band of tests/unit/planning/test_planner.py, measured as it measures.


def test_model_state_counts_fp32_parameters_gradients_and_two_adamw_moments():
    model = build(ModelSpec(options={"hidden_sizes": "64,32"}), 37, 5, "pytorch")
    parameters = (37 * 64 + 64) + (64 * 32 + 32) + (32 * 5 + 5)
    estimate = measure_state(model).estimate(micro_batch=0, on_accelerator=False)
    assert estimate.parameters + estimate.gradients + estimate.optimizer_state == 4 * 4 * parameters


@pytest.mark.slow  # measures a real allocation: two AdamW steps under the torch profiler
@pytest.mark.parametrize(
    "spec, n_features, micro_batch",
    [
        (ModelSpec("cnn", "3x16x16"), 768, 64),
        (ModelSpec("examples.residual:build", options={"width": 256, "blocks": 3}), 256, 1024),
    ],
    ids=["cnn", "residual"],
)
def test_probe_estimate_matches_measured_cpu_allocation(spec, n_features, micro_batch, tmp_path):
    input_spec = InputSpec.parse(n_features, 10, spec.input_shape)
    footprint = probe_footprint(build(spec, n_features, 10, "pytorch"), input_spec)
    estimate = footprint.estimate(micro_batch, on_accelerator=False)
    measured = measured_peak_bytes(
        lambda: build(spec, n_features, 10, "pytorch"), n_features, 10, micro_batch, tmp_path
    )
    assert ESTIMATE_LOW * measured <= estimate.tensor_bytes <= ESTIMATE_HIGH * measured, (
        estimate.tensor_bytes,
        measured,
    )


def test_the_probe_keeps_its_dispatch_unwrapped_so_torch_dynamo_is_not_imported():
    """torch wraps a dispatch mode's `__torch_dispatch__` in a guard that imports torch._dynamo (over a
    second of CPU on every planning pod) unless the mode's `_should_skip_dynamo` says no. A torch
    that renames that private hook fails here, not in a slower plan."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from tasks.core.models.probe import AllocationTimeline

    assert callable(getattr(TorchDispatchMode, "_should_skip_dynamo", None))
    assert AllocationTimeline._should_skip_dynamo() is False
    dispatch = vars(AllocationTimeline)["__torch_dispatch__"]
    assert dispatch.__module__ == "tasks.core.models.probe" and not hasattr(dispatch, "__wrapped__")
