"""Benchmark GPU against TPU before moving: one preparation, two trainings in parallel, one table."""

from __future__ import annotations

from flytekit import workflow

from tasks.compare import compare
from tasks.core.compare import HardwareComparison
from tasks.evaluate import evaluate
from tasks.hardware import DEFAULT_PRICES_PER_HOUR
from tasks.planner import prepare_data, train_on_target


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
    plan_resources: bool = True,
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
        plan_resources: each run on the cheapest GPU or TPU option that holds the model, as
            training_pipeline plans it; off: the hardware declared in tasks/hardware.py.
        prices: USD per accelerator-hour by accelerator name (GPU, TPU chip, or "cpu" per worker), for
            runs without an applied plan; a planned run is priced at its catalog option's price.
    """
    # The pipeline's front door: every input checked before any accelerator is asked for, and the
    # preprocessing cache keyed on the data's fingerprint, so a file rewritten in place is prepared again.
    prepared, preprocess_plan = prepare_data(
        dataset=dataset, label_column=label_column, val_fraction=0.15, test_fraction=0.15, seed=seed,
        plan_resources=plan_resources, target="gpu", epochs=epochs, batch_size=batch_size,
        learning_rate=learning_rate, grad_accum_steps=1, hidden_sizes=hidden_sizes, dropout=dropout,
        precision="auto", tf_strategy="auto",
    )  # fmt: skip
    hyper = dict(
        prepared=prepared, preprocess_plan=preprocess_plan, epochs=epochs, batch_size=batch_size,
        learning_rate=learning_rate, weight_decay=weight_decay, grad_accum_steps=1, hidden_sizes=hidden_sizes,
        dropout=dropout, seed=seed, precision="auto", tf_strategy="auto", plan_resources=plan_resources,
    )  # fmt: skip
    on_gpu, gpu_plan = train_on_target(target="gpu", **hyper)
    on_tpu, tpu_plan = train_on_target(target="tpu", **hyper)
    return compare(
        gpu=evaluate(prepared=prepared, trained=on_gpu, plan=gpu_plan),
        tpu=evaluate(prepared=prepared, trained=on_tpu, plan=tpu_plan),
        prices=prices,
    )
