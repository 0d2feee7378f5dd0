"""Successive halving in rungs: each rung trains the trials it holds for more epochs, and the best
1/reduction_factor of them go on to the next, each resumed from its own checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field

from tasks.core.tuning.study import Study, TrialRecord, sort_value


@dataclass
class Round:
    """What one round trains, at most `concurrency` runs: trials already in the study (the baseline at
    rung 0, promoted ones after it, each resumed from its checkpoint) and new ones to propose."""

    rung: int
    new: int = 0  # trials to propose
    promoted: list[int] = field(default_factory=list)  # trial numbers trained to this rung's budget


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
    finished the rung before."""
    below = [record for record in study.trials if len(record.rung_metrics) >= rung]
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
        return Round(0, new=min(settings.concurrency - len(untrained), to_propose), promoted=untrained)
    for rung in range(1, len(study.budgets)):
        pending = [n for n in promoted(study, rung) if len(study.trial(n).rung_metrics) <= rung]
        if pending:
            return Round(rung, promoted=pending[: settings.concurrency])
    return None


def order_for(study: Study):
    """`finish`'s ranking of the trials that got furthest."""
    return lambda records, rung: ranked(records, rung, study.direction)
