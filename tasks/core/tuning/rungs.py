"""Successive halving in rungs: each rung trains the trials it holds for more epochs, and the best
1/reduction_factor of them go on to the next, each resumed from its own checkpoint."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tasks.core.tuning.study import (
    COMPLETED,
    DIVERGED,
    STOPPED,
    Study,
    TrialRecord,
    full_budget_cost,
    sort_value,
)


@dataclass
class Round:
    """What one round trains, at most `concurrency` runs: trials already in the study (the baseline at
    rung 0, promoted ones after it, each resumed from its checkpoint) and new ones to propose."""

    rung: int
    new: int = 0  # trials to propose
    existing: list[int] = field(default_factory=list)  # trials in the study trained to this rung's budget


def rung_budgets(min_epochs: int, max_epochs: int, reduction_factor: int) -> list[int]:
    """Epochs at the end of each rung: min_epochs x reduction_factor^k below max_epochs, then max_epochs."""
    budgets = [min_epochs]
    while budgets[-1] * reduction_factor < max_epochs:
        budgets.append(budgets[-1] * reduction_factor)
    if budgets[-1] != max_epochs:
        budgets.append(max_epochs)
    return budgets


def rung_sizes(trials: int, rungs: int, reduction_factor: int) -> list[int]:
    """Trials in each rung: all of them, then 1/reduction_factor of the rung before (at least one)."""
    sizes = [trials]
    for _ in range(rungs - 1):
        sizes.append(max(1, sizes[-1] // reduction_factor))
    return sizes


def ranked(records: list[TrialRecord], rung: int, direction: str) -> list[TrialRecord]:
    """Best first by the metric after `rung`; equal metrics by trial number, the earlier first."""
    return sorted(records, key=lambda r: (sort_value(r.rung_metrics[rung], direction), r.number))


def promoted(study: Study, rung: int) -> list[int]:
    """The trials that train in `rung` (> 0): the baseline, and the best proposed trials of those that
    finished the rung before; never one that diverged."""
    below = [record for record in study.trials if len(record.rung_metrics) >= rung]
    below = [record for record in below if math.isfinite(record.rung_metrics[rung - 1])]
    size = rung_sizes(study.settings.trials, len(study.budgets), study.settings.reduction_factor)[rung]
    best = ranked([record for record in below if not record.baseline], rung - 1, study.direction)[:size]
    return [record.number for record in below if record.baseline] + [record.number for record in best]


def next_round(study: Study) -> Round | None:
    """The next round's work, None when the study is done. Rung 0 fills first, a wave of trials at a
    time (the baseline in the first; the sampler learns from each wave); then each rung's promotions, a
    wave at a time."""
    settings = study.settings
    untrained = [record.number for record in study.trials if not record.rung_metrics][: settings.concurrency]
    to_propose = settings.trials - len(study.proposed)
    if untrained or to_propose:
        return Round(0, new=min(settings.concurrency - len(untrained), to_propose), existing=untrained)
    for rung in range(1, len(study.budgets)):
        pending = [n for n in promoted(study, rung) if len(study.trial(n).rung_metrics) <= rung]
        if pending:
            return Round(rung, existing=pending[: settings.concurrency])
    return None


def finish(study: Study) -> Study:
    """The trials' states, the best trial (`best_of`) and the totals. A trial that diverged would have
    diverged at the same step of its unbroken run, so in the full budget's cost it costs what it did."""
    for record in study.trials:
        record.state = state_of(record, len(study.budgets))
    study.best, study.choice = best_of(study)
    study.wall_seconds = sum(t.wall_seconds for t in study.trials)
    study.cost_usd = sum(t.cost_usd for t in study.trials)
    study.full_budget_cost_usd = sum(full_cost(t, study.budgets[-1]) for t in study.trials)
    return study


def full_cost(record: TrialRecord, last: int) -> float:
    """The trial's cost had it trained to the `last` rung's budget in one run."""
    if record.state == DIVERGED:
        return record.cost_usd
    return full_budget_cost(record, record.epochs_trained if record.state == COMPLETED else last)


def state_of(record: TrialRecord, rungs: int) -> str:
    if record.diverged:
        return DIVERGED
    return COMPLETED if len(record.rung_metrics) == rungs else STOPPED


def best_of(study: Study) -> tuple[int, str]:
    """The best of the trials that got furthest without diverging, and why. The baseline stays the
    best unless a trial beats it by more than one standard error of its metric over the validation
    rows (the one-standard-error rule): on a small validation split the best of many trials wins
    partly by chance, and the base configuration is the run a user gets without the study."""
    usable = [record for record in study.trials if record.rung_metrics and not record.diverged]
    if not usable:
        raise ValueError(
            f"all {len(study.trials)} trials of the study diverged (the training loss became NaN or "
            "infinite): lower the search space's learning_rate, or train with precision 'fp32'"
        )
    furthest = max(len(record.rung_metrics) for record in usable)
    finalists = [record for record in usable if len(record.rung_metrics) == furthest]
    top = ranked(finalists, furthest - 1, study.direction)[0]
    baseline = next((record for record in finalists if record.baseline), None)
    metric = lambda record: record.rung_metrics[-1]  # noqa: E731
    if baseline is None or top is baseline:
        return top.number, f"the best {study.metric}, {metric(top):.4g}"
    error = standard_error(study.metric, metric(baseline), study.val_rows)
    versus = f"{study.metric} {metric(top):.4g} against the base configuration's {metric(baseline):.4g}"
    margin = f"one standard error ({error:.2g} over {study.val_rows:,} validation rows)"
    if sort_value(metric(top), study.direction) < sort_value(metric(baseline), study.direction) - error:
        return top.number, f"{versus}: better by more than {margin}"
    return baseline.number, f"the base configuration kept: trial {top.number}'s {versus} is within {margin}"


def standard_error(metric: str, value: float, rows: int) -> float:
    """The standard error of `metric` at `value` over `rows` validation rows. Accuracy (and macro-F1, as
    an approximation) is a proportion: Agresti and Coull's sqrt(p(1 - p) / (n + 4)) with p = (x + 2) /
    (n + 4), which, unlike the plain sqrt(p(1 - p) / n), is not 0 at a perfect score; an RMSE's is
    value / sqrt(2n) (normal errors). 0 for val_loss, which has none in closed form, and where the rows
    are unknown."""
    if rows <= 0 or not math.isfinite(value) or metric == "val_loss":
        return 0.0
    if metric == "val_rmse":
        return value / math.sqrt(2 * rows)
    adjusted = (value * rows + 2) / (rows + 4)
    return math.sqrt(adjusted * (1 - adjusted) / (rows + 4))
