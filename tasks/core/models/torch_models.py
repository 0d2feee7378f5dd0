"""The PyTorch half of the model plug-ins: built-in builders, the checks, and the weights-only artifact.

Imported only where torch is installed; `tasks.core.models.plugins` loads it for PyTorch targets.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch
from torch import nn

from tasks.core.models.memory import ModelFootprint
from tasks.core.models.plugins import (
    InputSpec,
    ModelSpec,
    Options,
    artifact_record,
    build,
    check_logits,
    check_model,
    check_trainable,
    cnn_options,
    cnn_problems,
    image_shape,
    mlp_options,
    rebuild,
)
from tasks.core.models.precision import for_planning
from tasks.core.models.probe import measure_state, probe_footprint

MODEL_TYPE = "torch.nn.Module"
# Above this many bytes of parameters, the planner counts the model without building it on CPU.
PROBE_LIMIT_BYTES = 2**30
log = logging.getLogger(__name__)


def build_mlp(n_features: int, n_classes: int, hidden_sizes: list[int], dropout: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = n_features
    for hidden in hidden_sizes:
        layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout)]
        width = hidden
    layers.append(nn.Linear(width, n_classes))
    return nn.Sequential(*layers)


@torch.no_grad()
def predict(model: nn.Module, features, batch_size: int = 8192):
    """Class predictions for a float32 numpy array, in batches."""
    inputs = torch.from_numpy(features)
    return torch.cat([model(chunk).argmax(dim=1) for chunk in inputs.split(batch_size)]).numpy()


def is_model(value: object) -> bool:
    return isinstance(value, nn.Module)


def trainable_count(model: nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)


@torch.no_grad()
def probe_logits(model: nn.Module, rows: int, n_features: int) -> tuple[list[int], bool]:
    """The logits' shape and whether they are all finite (always so on the meta device)."""
    generator = torch.Generator().manual_seed(0)
    device = next(model.parameters(), torch.empty(0)).device  # the meta device for a model too large to build
    model.eval()
    logits = model(torch.randn(rows, n_features, generator=generator).to(device))
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"forward returned {type(logits).__name__}, not a logits tensor")
    return list(logits.shape), logits.is_meta or bool(torch.isfinite(logits).all())


def footprint(spec: ModelSpec, input_spec: InputSpec, precision: str) -> ModelFootprint:
    """Counted on the meta device first, so a model too large for this pod allocates nothing; one
    within `PROBE_LIMIT_BYTES` is then built, checked on CPU rows and probed for its activations."""
    n_features, n_classes = input_spec.n_features, input_spec.n_classes
    meta_model = build_on_meta(spec, input_spec)
    state = measure_state(meta_model) if meta_model is not None else None
    if state is not None and state.state_bytes > PROBE_LIMIT_BYTES:
        check_logits(spec, meta_model, n_features, n_classes, "pytorch")
        check_trainable(spec, meta_model, "pytorch")
        log.warning("model %r: %.1f GiB of parameters, above the probe's limit; activations not probed",
                    spec.builder, state.state_bytes / 2**30)  # fmt: skip
        return replace(state, n_features=n_features, precision=for_planning(precision).name)
    model = check_model(spec, n_features, n_classes, "pytorch")
    return probe_footprint(model, input_spec, for_planning(precision).name)


def build_on_meta(spec: ModelSpec, input_spec: InputSpec) -> nn.Module | None:
    """The model with parameters that hold no memory, or None where its builder needs real tensors."""
    try:
        with torch.device("meta"):
            return build(spec, input_spec.n_features, input_spec.n_classes, "pytorch")
    except Exception:  # the real build that follows reports what is wrong
        return None


# ---- built-ins -----------------------------------------------------------------------------------------


def mlp(spec: InputSpec, options: Options) -> nn.Sequential:
    """Fully connected layers with ReLU and dropout. Options: hidden_sizes ("256,128"), dropout (0.1)."""
    hidden, dropout = mlp_options(options)
    return build_mlp(spec.n_features, spec.n_classes, hidden, dropout)


def cnn(spec: InputSpec, options: Options) -> SmallCNN:
    """A small CNN for image-shaped features. Needs input_shape CxHxW (or HxW: one channel).
    Options: channels ("32,64": one 3x3 convolution per entry), dropout (0.25)."""
    return SmallCNN(image_shape(spec), spec.n_classes, *cnn_options(options))


class SmallCNN(nn.Module):
    """3x3 convolutions (padding 1) with ReLU, one 2x2 max-pool, dropout and a linear layer to logits.
    Small images such as the 8x8 digits keep their detail through every convolution.

    Takes flat feature rows and reshapes them to (channels, height, width) itself, so the training
    loop's batches stay flat. No batch norm: nothing to keep in sync across DDP ranks."""

    def __init__(self, shape: tuple[int, int, int], n_classes: int, channels: list[int], dropout: float):
        super().__init__()
        if found := cnn_problems(channels, dropout):
            raise ValueError("; ".join(found))
        self.shape = shape
        layers: list[nn.Module] = []
        width = shape[0]
        for out in channels:
            layers += [nn.Conv2d(width, out, kernel_size=3, padding=1), nn.ReLU()]
            width = out
        layers.append(nn.MaxPool2d(2, ceil_mode=True))
        self.features = nn.Sequential(*layers)
        _, height, width_px = shape
        flat = channels[-1] * -(-height // 2) * -(-width_px // 2)
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(dropout), nn.Linear(flat, n_classes))

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(rows.view(-1, *self.shape)))


# ---- artifact: the spec as primitives plus the state dict; loaded with weights_only=True ----------------


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def save_torch_artifact(model: nn.Module, spec: ModelSpec, input_spec: InputSpec, path: str) -> None:
    """The builder reference, its options and the weights: plain primitives and tensors only."""
    state = {name: tensor.detach().cpu() for name, tensor in unwrap(model).state_dict().items()}
    torch.save({**artifact_record(spec, input_spec), "state_dict": state}, path)


def load_torch_artifact(path: str) -> tuple[nn.Module, ModelSpec]:
    """Rebuild the model through its builder and load the weights, unpickling no code."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    model, spec = rebuild(payload, "pytorch")
    model.load_state_dict(payload["state_dict"])
    model.eval()
    return model, spec
