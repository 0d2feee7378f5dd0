"""Benchmark GPU against TPU before moving: one preparation, two trainings in parallel, one table."""

from __future__ import annotations

from typing import NamedTuple

from flytekit import workflow
from flytekit.types.directory import FlyteDirectory

from tasks.catalog import DEFAULT_PRICES_PER_HOUR
from tasks.compare import check_prices, compare
from tasks.core.data.config import DataConfig
from tasks.core.evaluation.compare import HardwareComparison
from tasks.core.training.config import TrainConfig
from tasks.evaluate import evaluate
from tasks.right_sizing import prepare_data, train_on_target

# The comparison, and the model bundle each run produced (tasks/core/bundle/).
Compared = NamedTuple(  # noqa: UP014 - the functional form keeps the field types real classes for flytekit
    "Compared",
    [("comparison", HardwareComparison), ("gpu_model", FlyteDirectory), ("tpu_model", FlyteDirectory)],
)


@workflow
def hardware_comparison(
    data: DataConfig = DataConfig(),  # noqa: B008 - Flyte needs the literal default
    hyperparameters: TrainConfig = TrainConfig(),  # noqa: B008 - Flyte needs the literal default
    plan_resources: bool = True,
    prices: dict[str, float] = DEFAULT_PRICES_PER_HOUR,  # noqa: B006
) -> Compared:
    """Train the PyTorch model on GPU and the TensorFlow model on TPU from the same prepared data.

    Args:
        data: as training_pipeline's: the table, its label column, column kinds and split, e.g.
            '{"dataset": "data/iris.csv", "label_column": "species"}'; a regression's runs compare by
            RMSE and R² (the best by R²).
        hyperparameters: as training_pipeline's, for both runs.
        plan_resources: each run on the cheapest GPU or TPU option that holds the model, as
            training_pipeline plans it; off: the hardware declared in tasks/hardware.py.
        prices: USD per accelerator-hour by accelerator name (GPU, TPU chip, or "cpu" per worker), for
            runs without an applied plan; a planned run is priced at its catalog option's price.
    """
    # The prices first, then the pipeline's front door: every input checked before any accelerator is
    # asked for, and the preprocessing cache keyed on the data's fingerprint, so a file rewritten in
    # place is prepared again.
    prices_checked = check_prices(prices=prices)
    prepared, preprocess_plan = prepare_data(
        data=data, target="gpu", hyperparameters=hyperparameters, plan_resources=plan_resources
    )
    prices_checked >> prepared
    runs = dict(prepared=prepared, preprocess_plan=preprocess_plan, hyperparameters=hyperparameters,
                plan_resources=plan_resources)  # fmt: skip
    on_gpu, gpu_plan = train_on_target(target="gpu", **runs)
    on_tpu, tpu_plan = train_on_target(target="tpu", **runs)
    gpu = evaluate(prepared=prepared, trained=on_gpu, plan=gpu_plan)
    tpu = evaluate(prepared=prepared, trained=on_tpu, plan=tpu_plan)
    return compare(gpu=gpu.report, tpu=tpu.report, prices=prices), gpu.model, tpu.model
