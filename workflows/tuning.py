"""Tuning: prepare the data once (the same cached task), train trials in rungs of successive halving, each
planned onto its own hardware, then evaluate, bundle and publish the best trial as any run (docs/tuning.md)."""

from __future__ import annotations

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
    tuning: TuningSettings = TuningSettings(),  # noqa: B008 - Flyte needs the literal default
    publish_to: str = "",
    promotion: PromotionPolicy = ALWAYS,
    int8_export: bool = False,
) -> TuningOutputs:
    """Search the hyperparameters of training_pipeline's run (its inputs mean the same here), and
    evaluate, bundle and publish the best trial as training_pipeline does.

    Every trial is planned onto the cheapest hardware that holds it (training_pipeline's
    plan_resources, always on here).

    Args:
        hyperparameters: the trials' base config; each trial changes the searched keys alone.
        tuning: the study (tasks/core/tuning/study.py, TuningSettings; docs/tuning.md), as JSON, only the
            fields that differ from the defaults, e.g. '{"trials": 8, "concurrency": 2}'. trials: trials
            proposed (16); concurrency: trials training at a time, at most (4); search_space: JSON text, a
            range or choices per key and the epoch budget as "epochs": {"low", "high"}; empty: learning
            rate, batch size, MLP width and depth, dropout, weight decay, 3 to 27 epochs; metric: what
            ranks trials on the validation split: val_macro_f1 (default for classes), val_accuracy,
            val_rmse (default for numbers) or val_loss; seed: the sampler's (the same inputs propose the
            same trials); reduction_factor: 1 in this many trials of a rung goes on to the next, which
            trains this many times the epochs (3).
    """
    settings = check_tuning(settings=tuning, hyperparameters=hyperparameters, target=target, data=data)
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
