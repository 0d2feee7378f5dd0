"""Evaluation on CPU: rebuild the trained model and score the held-out test split."""

from __future__ import annotations

import logging

from flytekit import task

import tasks.literal_types  # noqa: F401 - each boundary dataclass's Flyte type built once, before the tasks below
from tasks.core.config import Hardware
from tasks.core.data import read_split
from tasks.core.metrics import classification_metrics
from tasks.decks import DECKS, evaluation_deck
from tasks.hardware import EVALUATE_CPU, ML_CPU_IMAGE, guaranteed
from tasks.logs import setup_logging
from tasks.storage import local_path
from tasks.types import EvaluationReport, PreparedData, ResourcePlan, TrainedModel

log = logging.getLogger(__name__)


def predict_test_split(trained: TrainedModel, features):
    """Class predictions from the artifact, rebuilt through the builder it records."""
    path = trained.artifact.download()
    if trained.run.framework == "pytorch":
        from tasks.core.model import predict
        from tasks.core.torch_models import load_torch_artifact

        model, _ = load_torch_artifact(path)
        return predict(model, features)
    if trained.run.framework == "tensorflow":
        from tasks.core.keras_models import load_keras_artifact, predict_keras

        model, _ = load_keras_artifact(path)
        return predict_keras(model, features)
    raise ValueError(
        f"cannot evaluate a model trained with '{trained.run.framework}': expected pytorch or tensorflow"
    )


def billed_hardware(trained: TrainedModel, plan: ResourcePlan | None) -> tuple[Hardware, list[str]]:
    """What the run is billed for, and a note where that is only the declaration. A training task
    reports its declared hardware; where the planner put it on other hardware (a 1-chip TPU slice, a
    MIG slice), the applied plan says what ran. Local runs on CPU are billed as CPU worker processes."""
    if trained.run.device == "cpu":
        return trained.declared, []
    if plan is None or not plan.applied:
        return trained.declared, ["no resource plan was applied: billed as declared in tasks/hardware.py"]
    choice = plan.training.choice
    return Hardware(
        choice.device, choice.devices, choice.partition, choice.price_per_hour / choice.devices
    ), []


# The ml-cpu image has the CPU builds of both frameworks: a model from either is rebuilt without CUDA.
@task(
    container_image=ML_CPU_IMAGE,
    **guaranteed(EVALUATE_CPU),
    **DECKS,
)
def evaluate(
    prepared: PreparedData, trained: TrainedModel, plan: ResourcePlan | None = None
) -> EvaluationReport:
    setup_logging()
    features, labels = read_split(
        local_path(prepared.test, "test split"), prepared.feature_names, prepared.label_column
    )
    metrics = classification_metrics(labels, predict_test_split(trained, features), prepared.class_labels)
    billed, notes = billed_hardware(trained, plan)
    report = EvaluationReport(
        metrics=metrics,
        class_labels=prepared.class_labels,
        training=trained.run,
        billed=billed,
        dataset=prepared.source,
        resource_plan=plan,
        notes=notes + prepared.notes,
    )
    evaluation_deck(report)
    print(report.summary(), flush=True)
    if plan is not None:
        print(plan.summary(), flush=True)
    return report
