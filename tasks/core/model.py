"""The MLP classifier shared by training and evaluation; its shape comes from ModelConfig."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn


@dataclass
class ModelConfig:
    n_features: int
    n_classes: int
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 128])
    dropout: float = 0.1

    def __post_init__(self) -> None:
        if self.n_features < 1 or self.n_classes < 2:
            raise ValueError(
                f"need >= 1 feature and >= 2 classes, got {self.n_features} and {self.n_classes}"
            )
        if any(size < 1 for size in self.hidden_sizes):
            raise ValueError(f"hidden_sizes must be positive, got {self.hidden_sizes}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


def build_mlp(config: ModelConfig) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = config.n_features
    for hidden in config.hidden_sizes:
        layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(config.dropout)]
        width = hidden
    layers.append(nn.Linear(width, config.n_classes))
    return nn.Sequential(*layers)


def save_artifact(model: nn.Module, config: ModelConfig, path: str) -> None:
    """State dict plus the config that rebuilds the model: plain tensors and primitives only."""
    state = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    torch.save({"model_config": asdict(config), "state_dict": state}, path)


def load_artifact(path: str) -> tuple[nn.Sequential, ModelConfig]:
    """Rebuild the model from an artifact without unpickling arbitrary objects."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    config = ModelConfig(**payload["model_config"])
    model = build_mlp(config)
    model.load_state_dict(payload["state_dict"])
    model.eval()
    return model, config


@torch.no_grad()
def predict(model: nn.Module, features, batch_size: int = 8192):
    """Class predictions for a float32 numpy array, in batches."""
    inputs = torch.from_numpy(features)
    return torch.cat([model(chunk).argmax(dim=1) for chunk in inputs.split(batch_size)]).numpy()
