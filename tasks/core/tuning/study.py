"""The study's records: its settings, and per trial its values, hardware, rungs, wall time and cost."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

COMPLETED, STOPPED, DIVERGED, RUNNING = "completed", "stopped", "diverged", "running"


@dataclass
class TuningSettings:
    """The study's inputs, checked (tasks/core/tuning/checks.py)."""

    trials: int = 16
    concurrency: int = 4
    search_space: str = ""  # JSON (tasks/core/tuning/space.py); empty: the default space
    metric: str = ""  # empty: val_macro_f1 for classes, val_rmse for numbers
    seed: int = 0
    reduction_factor: int = 3


@dataclass
class TrialRecord:
    """One trial: its searched values (as JSON text), where and how long it trained, and how far it got."""

    number: int
    params: dict[str, str]
    hardware: str = ""  # the planned option, e.g. "a100-mig-1g.5gb"
    price_per_hour: float = 0.0  # the option's, all its devices
    epochs_trained: int = 0
    rung_metrics: list[float] = field(default_factory=list)  # the study's metric after each rung reached
    val_losses: list[float] = field(default_factory=list)  # per epoch: the learning curve
    wall_seconds: float = 0.0
    cost_usd: float = 0.0
    state: str = RUNNING  # completed (trained the whole budget), stopped (not promoted) or diverged
    baseline: bool = False  # the base configuration itself: no searched values, trains every rung

    @property
    def diverged(self) -> bool:
        """Whether its last run diverged: its metric is not a number, and it is never promoted or chosen."""
        return bool(self.rung_metrics) and not math.isfinite(self.rung_metrics[-1])

    @property
    def label(self) -> str:
        return f"{self.number} (base)" if self.baseline else str(self.number)

    def values(self) -> dict:
        return {key: json.loads(value) for key, value in self.params.items()}

    def add_rung(self, metric: float, val_losses: list[float], seconds: float) -> None:
        """A rung trained: `val_losses` is the run's whole history, the rungs before this one included."""
        self.rung_metrics.append(metric)
        self.val_losses = list(val_losses)
        self.epochs_trained = len(val_losses)
        self.wall_seconds += seconds
        self.cost_usd += seconds / 3600 * self.price_per_hour


@dataclass
class Study:
    settings: TuningSettings
    metric: str  # the one measured, resolved for the problem type
    direction: str  # "maximize" or "minimize"
    budgets: list[int]  # epochs at the end of each rung
    trials: list[TrialRecord] = field(default_factory=list)
    val_rows: int = 0  # the validation split's, which the metric's standard error depends on
    best: int = -1  # the best trial's number, once the study is finished
    choice: str = ""  # why the best trial is the best
    wall_seconds: float = 0.0
    cost_usd: float = 0.0
    full_budget_cost_usd: float = 0.0  # had every trial trained all budgets[-1] epochs

    def trial(self, number: int) -> TrialRecord:
        return next(record for record in self.trials if record.number == number)

    @property
    def proposed(self) -> list[TrialRecord]:
        """The sampler's trials: all but the baseline."""
        return [record for record in self.trials if not record.baseline]

    def summary(self) -> str:
        lines = [
            f"study: {len(self.trials)} trials, rungs at {self.budgets} epochs, {self.metric} ({self.direction}); "
            f"best trial {self.best}: {self.choice}",
            f"{'trial':>8} {'state':>9} {'epochs':>6} {self.metric:>13} {'hardware':>18} {'seconds':>8} {'cost $':>9}",
        ]
        for t in self.trials:
            last = f"{t.rung_metrics[-1]:.4f}" if t.rung_metrics else "n/a"
            lines.append(
                f"{t.label:>8} {t.state:>9} {t.epochs_trained:>6} {last:>13} {t.hardware:>18} "
                f"{t.wall_seconds:>8.1f} {t.cost_usd:>9.6f}"
            )
        lines.append(
            f"total {self.wall_seconds:.1f} s, ${self.cost_usd:.6f}; every trial to the full budget: "
            f"${self.full_budget_cost_usd:.6f}"
        )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"\n{self.summary()}\n"


def new_study(
    settings: TuningSettings, metric: str, direction: str, budgets: list[int], val_rows: int = 0
) -> Study:
    """A study whose trial 0 is the base configuration: the run training_pipeline trains with it, its
    own epochs, stopped at the rungs on the way. It trains every rung beside the promoted trials, so the
    study's best is never a trial that the base configuration beats on the study's metric."""
    return Study(settings, metric, direction, budgets, [TrialRecord(0, {}, baseline=True)], val_rows)


def full_budget_cost(record: TrialRecord, epochs: int) -> float:
    """The trial's cost had it trained `epochs` epochs, at its measured seconds per epoch."""
    if not record.epochs_trained:
        return 0.0
    seconds = record.wall_seconds / record.epochs_trained * epochs
    return seconds / 3600 * record.price_per_hour


def sort_value(value: float, direction: str) -> float:
    """Smaller is better; a metric that is not finite ranks last."""
    if not math.isfinite(value):
        return math.inf
    return -value if direction == "maximize" else value
