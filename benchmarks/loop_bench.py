"""Training-loop efficiency: the project's loops against minimal bare loops, in one process."""

from __future__ import annotations

import time

import numpy as np

from tasks.core.data.splits import SplitPaths, read_split
from tasks.core.training.config import TrainConfig


def bare_torch_samples_per_second(
    splits: SplitPaths, config: TrainConfig, device: str = "cpu", amp: bool = False
):
    """A minimal loop: the same MLP, AdamW and batch, data already in memory, no validation."""
    import torch
    import torch.nn.functional as F

    from tasks.core.models.plugins import build

    x, y = (
        torch.from_numpy(a).to(device)
        for a in read_split(splits.train, splits.feature_names, splits.label_column)
    )
    torch.manual_seed(config.seed)
    model = build(config.model, x.shape[1], splits.n_classes, "pytorch").to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    steps = len(y) // config.batch_size
    start = time.perf_counter()
    for _ in range(config.epochs):
        order = torch.randperm(len(y), device=device)
        for step in range(steps):
            rows = order[step * config.batch_size : (step + 1) * config.batch_size]
            with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp):
                loss = F.cross_entropy(model(x[rows]).float(), y[rows])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
    return steps * config.batch_size * config.epochs / (time.perf_counter() - start)


def project_torch_samples_per_second(splits: SplitPaths, config: TrainConfig) -> float:
    from tasks.core.training.torch_training import train

    return train(config, splits).run.samples_per_second


def bare_keras_samples_per_second(splits: SplitPaths, config: TrainConfig) -> float:
    import keras
    import tensorflow as tf

    from tasks.core.models.plugins import build

    x, y = read_split(splits.train, splits.feature_names, splits.label_column)
    keras.backend.clear_session()
    keras.utils.set_random_seed(config.seed)
    tf.config.experimental.enable_op_determinism()  # as train_keras runs on CPU
    model = build(config.model, x.shape[1], splits.n_classes, "tensorflow")
    model.compile(optimizer=keras.optimizers.AdamW(config.learning_rate, weight_decay=config.weight_decay),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))  # fmt: skip
    start = time.perf_counter()
    model.fit(x, y, batch_size=config.batch_size, epochs=config.epochs, verbose=0)
    samples = (len(y) // config.batch_size + (len(y) % config.batch_size > 0)) * config.batch_size
    return min(samples, len(y)) * config.epochs / (time.perf_counter() - start)


def project_keras_samples_per_second(splits: SplitPaths, config: TrainConfig) -> float:
    import keras

    from tasks.core.training.tf_strategy import Environment
    from tasks.core.training.tf_training import train_keras

    keras.backend.clear_session()  # each run starts from the same state, as the bare run does
    return train_keras(config, splits, env=Environment()).run.samples_per_second


def model_flops_per_sample(n_features: int, hidden_sizes: list[int], n_classes: int) -> float:
    """Forward + backward of the MLP's matmuls: 6 x multiply-adds per sample."""
    widths = [n_features, *hidden_sizes, n_classes]
    return 6.0 * float(np.sum([a * b for a, b in zip(widths, widths[1:], strict=False)]))
