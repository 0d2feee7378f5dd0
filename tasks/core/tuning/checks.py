"""The study's inputs, checked before anything runs; each message names the input at fault."""

from __future__ import annotations

from tasks.core.training.config import TrainConfig
from tasks.core.tuning.space import space_problems
from tasks.core.tuning.study import TuningSettings

# The metric each trial is ranked by: the problem type it fits ("" for both) and which way is better.
METRICS = {
    "val_macro_f1": ("classification", "maximize"),
    "val_accuracy": ("classification", "maximize"),
    "val_rmse": ("regression", "minimize"),
    "val_loss": ("", "minimize"),
}


def default_metric(regression: bool) -> str:
    return "val_rmse" if regression else "val_macro_f1"


def metric_problems(metric: str, problem_type: str) -> list[str]:
    """An unknown metric, or one that does not fit the problem type (when it is known)."""
    if not metric:
        return []
    if metric not in METRICS:
        return [
            f"input 'metric' = {metric!r}: not one of {', '.join(METRICS)}; pass e.g. --metric val_macro_f1"
        ]
    fits = METRICS[metric][0]
    if fits and problem_type in ("classification", "regression") and fits != problem_type:
        return [
            f"input 'metric' = {metric!r}: measures a {fits}, and this run is a {problem_type}; "
            f"pass e.g. --metric {default_metric(problem_type == 'regression')}"
        ]
    return []


def settings_problems(settings: TuningSettings) -> list[str]:
    found = []
    if settings.trials < 1:
        found.append(f"input 'trials' = {settings.trials}: must be at least 1")
    if settings.concurrency < 1:
        found.append(f"input 'concurrency' = {settings.concurrency}: must be at least 1")
    elif settings.concurrency > settings.trials >= 1:
        found.append(
            f"input 'concurrency' = {settings.concurrency}: more than the {settings.trials} trials; "
            f"pass e.g. --concurrency {settings.trials}"
        )
    if settings.reduction_factor < 2:
        found.append(f"input 'reduction_factor' = {settings.reduction_factor}: must be at least 2")
    if not 0 <= settings.seed < 2**32:
        found.append(f"input 'seed' = {settings.seed}: must be in [0, 2**32)")
    return found


def tuning_problems(settings: TuningSettings, base: TrainConfig, problem_type: str = "auto") -> list[str]:
    """Every bad tuning input: the settings, the search space against the base config, and the metric
    against the problem type where it is known ("auto": once the data is prepared)."""
    found = settings_problems(settings) + space_problems(settings.search_space, base)
    return found + metric_problems(settings.metric, problem_type)
