"""A trial's metric on the validation split, from the model it hands back (the epoch it keeps)."""

from __future__ import annotations

import math

import numpy as np

from tasks.core.data.splits import SplitPaths, read_split
from tasks.core.training.records import TrainingRun


def trial_metric(metric: str, artifact: str, splits: SplitPaths, run: TrainingRun, label_std: float) -> float:
    """`metric` of the model at `artifact`: val_loss is the kept epoch's, the others are scored here
    (a regression's RMSE in the label's units)."""
    if metric == "val_loss":
        kept = run.kept_epoch or len(run.history)
        return run.history[kept - 1].val_loss if run.history else math.nan
    import torch

    from tasks.core.models.torch_models import load_torch_artifact

    model, _ = load_torch_artifact(artifact)
    features, truth = read_split(splits.val, splits.feature_names, splits.label_column)
    with torch.no_grad():
        outputs = torch.cat([model(chunk) for chunk in torch.from_numpy(features).split(8192)]).numpy()
    return metric_of(metric, outputs, truth, splits.n_classes, label_std)


def metric_of(metric: str, outputs: np.ndarray, truth: np.ndarray, n_classes: int, label_std: float) -> float:
    if metric == "val_rmse":
        errors = outputs.reshape(-1).astype(np.float64) - truth.astype(np.float64)
        return float(np.sqrt(np.mean(errors**2)) * label_std)
    predicted = outputs.argmax(axis=1)
    if metric == "val_accuracy":
        return float(np.mean(predicted == truth))
    return macro_f1(truth, predicted, n_classes)


def macro_f1(truth: np.ndarray, predicted: np.ndarray, n_classes: int) -> float:
    """The mean F1 over the classes present in the truth or the predictions (scikit-learn's macro-F1)."""
    scores = []
    for code in range(n_classes):
        true_positive = int(np.sum((predicted == code) & (truth == code)))
        support, guessed = int(np.sum(truth == code)), int(np.sum(predicted == code))
        if support or guessed:
            scores.append(2 * true_positive / (support + guessed))
    return float(np.mean(scores)) if scores else math.nan
