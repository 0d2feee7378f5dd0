"""The built-in MLP (its shape comes from ModelConfig) and batched prediction for any torch model."""

from __future__ import annotations

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


@torch.no_grad()
def predict(model: nn.Module, features, batch_size: int = 8192):
    """Class predictions for a float32 numpy array, in batches."""
    inputs = torch.from_numpy(features)
    return torch.cat([model(chunk).argmax(dim=1) for chunk in inputs.split(batch_size)]).numpy()
