"""Tuning: prepare the data once (the same cached task), train trials in rungs of successive halving, each
planned onto its own hardware, then evaluate, bundle and publish the best trial as any run (docs/tuning.md).
The study's settings are flat inputs (`--trials 8 --concurrency 2`), their defaults TuningSettings'."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from flytekit import workflow
from flytekit.types.directory import FlyteDirectory

from tasks.core.data.config import DataConfig
from tasks.core.publish.promotion import ALWAYS, PromotionPolicy
from tasks.core.training.config import TrainConfig
from tasks.core.tuning.study import Study, TuningSettings
from tasks.evaluate import evaluate
from tasks.publish import publish_model
from tasks.right_sizing import prepare_data
from tasks.schedule import data_partition
from tasks.tune import best_trial, check_tuning, start_study, tuning_round
from tasks.types import EvaluationReport

# What training_pipeline hands back, and the study.
TuningOutputs = NamedTuple(  # noqa: UP014 - the functional form keeps the field types real classes for flytekit
    "TuningOutputs",
    [("report", EvaluationReport), ("model", FlyteDirectory), ("published", str), ("study", Study)],
)


@workflow
def tuning_pipeline(
    data: DataConfig = DataConfig(),  # noqa: B008 - Flyte needs the literal default
    target: str = "gpu",
    hyperparameters: TrainConfig = TrainConfig(),  # noqa: B008 - Flyte needs the literal default
    publish_to: str = "",
    promotion: PromotionPolicy = ALWAYS,
    int8_export: bool = False,
    trials: int = TuningSettings.trials,
    concurrency: int = TuningSettings.concurrency,
    search_space: str = TuningSettings.search_space,
    metric: str = TuningSettings.metric,
    seed: int = TuningSettings.seed,
    reduction_factor: int = TuningSettings.reduction_factor,
) -> TuningOutputs:
    """Search the hyperparameters of training_pipeline's run (its inputs mean the same here), and
    evaluate, bundle and publish the best trial as training_pipeline does.

    Every trial is planned onto the cheapest hardware that holds it (training_pipeline's
    plan_resources, always on here); every target tunes.

    Args:
        hyperparameters: the trials' base config; each trial changes the searched keys alone. Trial 0
            is this config itself, trained every rung: the best trial is never one it beats.
        trials: trials proposed (besides trial 0); each trains at least the first rung.
        concurrency: trials training at a time, at most (no more than trials).
        search_space: JSON, a range or choices per key and the epoch budget as "epochs": {"low", "high"},
            e.g. '{"learning_rate": {"low": 0.0001, "high": 0.1, "log": true}, "epochs": {"low": 3,
            "high": 27}}'; empty: learning rate, batch size, MLP width and depth, dropout, weight decay,
            3 to 27 epochs (docs/tuning.md).
        metric: what ranks trials on the validation split: val_macro_f1 (empty: the default for
            classes), val_accuracy, val_rmse (empty: the default for numbers) or val_loss.
        seed: the sampler's: the same inputs propose the same trials.
        reduction_factor: 1 in this many trials of a rung goes on to the next, which trains this many
            times the epochs.
    """
    settings = check_tuning(
        trials=trials, concurrency=concurrency, search_space=search_space, metric=metric, seed=seed,
        reduction_factor=reduction_factor, hyperparameters=hyperparameters,
    )  # fmt: skip
    prepared, preprocess_plan = prepare_data(
        data=data, target=target, hyperparameters=hyperparameters, plan_resources=True,
        publish_to=publish_to, promotion=promotion,
    )  # fmt: skip
    settings >> prepared
    state = start_study(settings=settings, hyperparameters=hyperparameters, prepared=prepared)
    state = tuning_round(
        state=state, prepared=prepared, preprocess_plan=preprocess_plan, target=target,
        hyperparameters=hyperparameters, plan_resources=True,
    )  # fmt: skip
    trained, plan, study = best_trial(state=state)
    evaluated = evaluate(prepared=prepared, trained=trained, plan=plan, int8_export=int8_export)
    published = publish_model(
        bundle=evaluated.model, prefix=publish_to, prepared=prepared, promotion=promotion
    )
    return evaluated.report, evaluated.model, published, study


@workflow
def scheduled_tuning(
    kickoff_time: datetime,
    dataset_template: str = "",
    data: DataConfig = DataConfig(),  # noqa: B008 - Flyte needs the literal default
    target: str = "gpu",
    hyperparameters: TrainConfig = TrainConfig(),  # noqa: B008 - Flyte needs the literal default
    publish_to: str = "",
    promotion: PromotionPolicy = PromotionPolicy(),  # noqa: B008 - Flyte needs the literal default
    int8_export: bool = False,
    trials: int = TuningSettings.trials,
    concurrency: int = TuningSettings.concurrency,
    search_space: str = TuningSettings.search_space,
    metric: str = TuningSettings.metric,
    seed: int = TuningSettings.seed,
    reduction_factor: int = TuningSettings.reduction_factor,
) -> TuningOutputs:
    """tuning_pipeline on the partition named by the kickoff time: what nightly_retrain runs when
    deploy/schedules.yaml gives it a `tuning` section (workflows/launch_plans.py). As a scheduled
    training run, the best trial's bundle becomes LATEST only past the promotion gate."""
    partition = data_partition(template=dataset_template, data=data, kickoff_time=kickoff_time)
    return tuning_pipeline(
        data=partition, target=target, hyperparameters=hyperparameters, publish_to=publish_to,
        promotion=promotion, int8_export=int8_export, trials=trials, concurrency=concurrency,
        search_space=search_space, metric=metric, seed=seed, reduction_factor=reduction_factor,
    )  # fmt: skip
