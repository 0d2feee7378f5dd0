"""A trial's metric on the validation split, from the model it hands back (the epoch it keeps): a torch
or a Keras artifact, scored by scikit-learn's metrics."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tasks.core.data.splits import SplitPaths, read_split
from tasks.core.training.records import TrainingRun

CHUNK_ROWS = 8192  # rows scored at a time: a large validation split is never one tensor


def trial_metric(
    metric: str, artifact: Callable[[], str], splits: SplitPaths, run: TrainingRun, label_std: float
) -> float:
    """`metric` of the run's model, whose file `artifact` fetches (only where the model is scored):
    val_loss is the kept epoch's, the others are scored here (a regression's RMSE in the label's units);
    NaN for a run that diverged, whose model is no use."""
    if run.diverged:
        return math.nan
    if metric == "val_loss":
        kept = run.kept_epoch or len(run.history)
        return run.history[kept - 1].val_loss if run.history else math.nan
    features, truth = read_split(splits.val, splits.feature_names, splits.label_column)
    outputs = model_outputs(artifact(), run.framework, features)
    return metric_of(metric, outputs, truth, label_std)


def model_outputs(artifact: str, framework: str, features: np.ndarray) -> np.ndarray:
    """The model's raw outputs (logits, or a regression's standardised value) for `features`."""
    chunks = [features[start : start + CHUNK_ROWS] for start in range(0, len(features), CHUNK_ROWS)]
    if framework == "tensorflow":
        from tasks.core.models.keras_models import load_keras_artifact

        model, _ = load_keras_artifact(artifact)
        return np.concatenate(
            [np.asarray(model.predict_on_batch(chunk), dtype=np.float32) for chunk in chunks]
        )
    import torch

    from tasks.core.models.torch_models import load_torch_artifact

    model, _ = load_torch_artifact(artifact)
    with torch.no_grad():
        return np.concatenate([model(torch.from_numpy(chunk)).float().numpy() for chunk in chunks])


def metric_of(metric: str, outputs: np.ndarray, truth: np.ndarray, label_std: float) -> float:
    """val_rmse in the label's units (`outputs` and `truth` standardised), val_accuracy, or val_macro_f1:
    the mean F1 over the classes present in the truth or the predictions."""
    from sklearn.metrics import accuracy_score, f1_score, root_mean_squared_error

    if metric == "val_rmse":
        predicted = outputs.reshape(-1).astype(np.float64)
        return float(root_mean_squared_error(truth.astype(np.float64), predicted) * label_std)
    predicted = outputs.argmax(axis=1)
    if metric == "val_accuracy":
        return float(accuracy_score(truth, predicted))
    present = np.union1d(truth, predicted)
    return float(f1_score(truth, predicted, labels=present, average="macro", zero_division=0))
