"""Evaluation on CPU: rebuild the trained model and score the held-out test split."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from flytekit import task

from tasks.core.data import read_split
from tasks.core.metrics import classification_metrics
from tasks.decks import DECKS, evaluation_deck
from tasks.hardware import EVALUATE_CPU, ML_CPU_IMAGE, guaranteed
from tasks.logs import setup_logging
from tasks.storage import local_path
from tasks.types import EvaluationReport, PreparedData, ResourcePlan, TrainedModel

log = logging.getLogger(__name__)


def predict_test_split(trained: TrainedModel, features):
    """Class predictions from the artifact, with the framework that trained it."""
    path = trained.artifact.download()
    if trained.framework == "pytorch":
        from tasks.core.model import load_artifact, predict

        model, _ = load_artifact(path)
        return predict(model, features)
    if trained.framework == "tensorflow":
        from tasks.core.tf_training import predict_keras

        return predict_keras(with_suffix(path, ".keras"), features)
    raise ValueError(
        f"cannot evaluate a model trained with '{trained.framework}': expected pytorch or tensorflow"
    )


def with_suffix(path: str, suffix: str) -> str:
    """Keras picks the loader from the file name; a downloaded artifact may have lost it."""
    if path.endswith(suffix):
        return path
    linked = Path(tempfile.mkdtemp()) / f"model{suffix}"
    linked.symlink_to(Path(path).resolve())
    return str(linked)


def billed_hardware(trained: TrainedModel, plan: ResourcePlan | None) -> dict:
    """What the run is billed for. A training task reports its declared profile; where the planner put
    it on other hardware (a 1-chip TPU slice, a MIG slice), the applied plan says what ran. Local runs
    on CPU are billed as CPU worker processes."""
    as_declared = {"accelerator": trained.accelerator, "accelerator_count": trained.accelerator_count}
    if trained.device == "cpu":
        return {**as_declared, "notes": []}
    if plan is None or not plan.applied:
        return {
            **as_declared,
            "notes": ["no resource plan was applied: billed as declared in tasks/hardware.py"],
        }
    return {
        "accelerator": plan.device,
        "accelerator_count": plan.devices,
        "accelerator_partition": plan.partition,
        "planned_price_per_hour": plan.price_per_hour / plan.devices,
        "notes": [],
    }


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
    features, labels = read_split(local_path(prepared.test), prepared.feature_names, prepared.label_column)
    metrics = classification_metrics(labels, predict_test_split(trained, features), prepared.class_labels)
    report = EvaluationReport(
        accuracy=metrics.accuracy,
        macro_f1=metrics.macro_f1,
        confusion_matrix=metrics.confusion_matrix,
        per_class=metrics.per_class,
        class_labels=prepared.class_labels,
        n_test=metrics.n_test,
        framework=trained.framework,
        trained_on=trained.device,
        world_size=trained.world_size,
        strategy=trained.strategy,
        **billed_hardware(trained, plan),
        samples_per_second=trained.samples_per_second,
        train_seconds=trained.train_seconds,
        dataset=prepared.source,
        resource_plan=plan,
        peak_device_memory_bytes=trained.peak_device_memory_bytes,
    )
    evaluation_deck(report)
    print(report.summary(), flush=True)
    if plan is not None:
        print(plan.summary(), flush=True)
    return report
