"""Benchmark GPU against TPU before moving: one preparation, two trainings in parallel, one table."""

from __future__ import annotations

from flytekit import workflow

from tasks.compare import compare
from tasks.core.compare import HardwareComparison
from tasks.evaluate import evaluate
from tasks.hardware import DEFAULT_PRICES_PER_HOUR
from tasks.planner import prepare_data
from tasks.train_tf import train_tf_tpu
from tasks.train_torch import train_torch


@workflow
def hardware_comparison(
    dataset: str = "",
    label_column: str = "label",
    epochs: int = 30,
    batch_size: int = 64,
    learning_rate: float = 3e-3,
    weight_decay: float = 1e-2,
    hidden_sizes: list[int] = [256, 128],  # noqa: B006 - Flyte needs the literal default
    dropout: float = 0.1,
    seed: int = 0,
    prices: dict[str, float] = DEFAULT_PRICES_PER_HOUR,  # noqa: B006
) -> HardwareComparison:
    """Train the PyTorch model on GPU and the TensorFlow model on TPU from the same prepared data.

    Args:
        dataset: parquet or CSV path/URI; empty means the embedded digits dataset.
        label_column: column holding the class.
        epochs: passes over the training split, for both runs.
        batch_size: global batch per optimizer step, for both runs.
        learning_rate: AdamW learning rate.
        weight_decay: AdamW weight decay.
        hidden_sizes: widths of the MLP's hidden layers.
        dropout: dropout after each hidden layer.
        seed: seeds the split, the initialisation and the shuffling.
        prices: USD per accelerator-hour by accelerator name (GPU, TPU chip, or "cpu" per worker).
    """
    # The pipeline's front door: every input checked before any accelerator is asked for, and the
    # preprocessing cache keyed on the data's fingerprint, so a file rewritten in place is prepared again.
    prepared, _ = prepare_data(
        dataset=dataset, label_column=label_column, val_fraction=0.15, test_fraction=0.15, seed=seed,
        plan_resources=True, target="gpu", epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
        grad_accum_steps=1, hidden_sizes=hidden_sizes, dropout=dropout, precision="auto", tf_strategy="auto",
    )  # fmt: skip
    hyper = dict(
        prepared=prepared, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
        weight_decay=weight_decay, grad_accum_steps=1, hidden_sizes=hidden_sizes, dropout=dropout, seed=seed,
        precision="auto",
    )  # fmt: skip
    on_gpu = train_torch(**hyper)
    on_tpu = train_tf_tpu(**hyper, tf_strategy="auto")
    return compare(
        gpu=evaluate(prepared=prepared, trained=on_gpu),
        tpu=evaluate(prepared=prepared, trained=on_tpu),
        prices=prices,
    )
