"""The torch network of `examples/residual.py`; kept apart so TensorFlow-only images never import torch."""

from __future__ import annotations

import torch
from torch import nn


class ResidualBlock(nn.Module):
    """x + Linear(Dropout(ReLU(Linear(LayerNorm(x))))): pre-norm, so the skip path stays an identity."""

    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.body = nn.Sequential(
            nn.LayerNorm(width),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(width, width),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class ResidualMLP(nn.Module):
    """A linear stem to `width`, `blocks` residual blocks, then a norm and a linear layer to logits."""

    def __init__(self, n_features: int, n_classes: int, width: int, blocks: int, dropout: float):
        super().__init__()
        self.stem = nn.Linear(n_features, width)
        self.blocks = nn.Sequential(*(ResidualBlock(width, dropout) for _ in range(blocks)))
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, n_classes))

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(rows)))
