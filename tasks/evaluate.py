"""Evaluation on CPU: rebuild the trained model and score the held-out test split."""

from __future__ import annotations

import logging

from flytekit import task

from tasks.core.data import read_split
from tasks.core.metrics import classification_metrics
from tasks.hardware import EVALUATE_CPU
from tasks.logs import setup_logging
from tasks.storage import local_path
from tasks.types import EvaluationReport, PreparedData, TrainedModel

log = logging.getLogger(__name__)


def predict_test_split(trained: TrainedModel, features):
    """Class predictions from the artifact, with the framework that trained it."""
    if trained.framework != "pytorch":
        raise ValueError(f"cannot evaluate a model trained with '{trained.framework}'")
    from tasks.core.model import load_artifact, predict

    model, _ = load_artifact(trained.artifact.download())
    return predict(model, features)


@task(requests=EVALUATE_CPU.resources, limits=EVALUATE_CPU.resources)
def evaluate(prepared: PreparedData, trained: TrainedModel) -> EvaluationReport:
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
        samples_per_second=trained.samples_per_second,
        train_seconds=trained.train_seconds,
        dataset=prepared.source,
    )
    print(report.summary(), flush=True)
    return report
