"""The MLP classifier shared by training and evaluation; its shape comes from ModelConfig."""

from __future__ import annotations

from dataclasses import asdict

import torch
from torch import nn

from tasks.core.config import ModelConfig


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
