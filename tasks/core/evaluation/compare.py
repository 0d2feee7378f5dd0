"""Side-by-side comparison of training runs: quality, speed and estimated cost."""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from tasks.core.messages import raise_for
from tasks.core.training.records import Hardware, TrainingRun


@dataclass
class RunSummary:
    """What the comparison needs to know about one training + evaluation run."""

    name: str
    training: TrainingRun
    billed: Hardware  # its price_per_hour, where set, is the applied plan's per device
    accuracy: float
    macro_f1: float
    # A regression's test RMSE and R² (its accuracy and macro-F1 are 0): runs compare by R².
    rmse: float | None = None
    r2: float | None = None

    @property
    def regression(self) -> bool:
        return self.r2 is not None

    @property
    def score(self) -> float:
        """What "most accurate" ranks by: R² for a regression, else accuracy."""
        return self.r2 if self.r2 is not None else self.accuracy


@dataclass
class ComparisonRow:
    run: RunSummary
    accelerator_hours: float
    price_per_hour: float | None
    cost_usd: float | None

    def hardware(self) -> str:
        return f"{self.run.billed.describe()} ({self.run.training.strategy})"


@dataclass(repr=False)
class HardwareComparison:
    rows: list[ComparisonRow]
    most_accurate: str
    fastest: str
    cheapest: str
    notes: list[str] = field(default_factory=list)
    regression: bool = False  # the runs predict a number: compared by RMSE and R², the best by R²

    def table(self) -> str:
        quality = ("RMSE", "R²") if self.regression else ("accuracy", "macro-F1")
        header = (
            f"{'run':<18} {'hardware':<34} {quality[0]:>8} {quality[1]:>8} {'train s':>8} {'samples/s':>10} "
            f"{'cost $':>10}"
        )
        lines = [header]
        for row in self.rows:
            run, training = row.run, row.run.training
            cost = f"{row.cost_usd:.6f}" if row.cost_usd is not None else "n/a"
            first, second = (run.rmse, run.r2) if self.regression else (run.accuracy, run.macro_f1)
            lines.append(
                f"{run.name:<18} {row.hardware():<34} {first:>8.4g} {second:>8.4f} "
                f"{training.train_seconds:>8.1f} {training.samples_per_second:>10.0f} {cost:>10}"
            )
        best = "best R²" if self.regression else "most accurate"
        lines.append(f"{best}: {self.most_accurate}; fastest: {self.fastest}; cheapest: {self.cheapest}")
        return "\n".join(lines + self.notes)

    def __repr__(self) -> str:
        """What `pyflyte run` prints of the comparison: its table, not every run's record."""
        return f"\n{self.table()}\n"


def price_run(run: RunSummary, prices: dict[str, float]) -> ComparisonRow:
    billed = run.billed
    hours = run.training.train_seconds / 3600 * billed.count
    price = billed.price_per_hour if billed.price_per_hour is not None else prices.get(billed.accelerator)
    return ComparisonRow(run, hours, price, hours * price if price is not None else None)


def pricing_note(row: ComparisonRow) -> str:
    """Where a run's price came from, when not from an applied plan's catalog."""
    name, billed = row.run.name, row.run.billed
    if row.price_per_hour is None:
        return f"no price for '{billed.accelerator}' ({name}); add it to prices to estimate its cost"
    source = f"priced at prices['{billed.accelerator}']"
    if row.run.training.on_cpu:  # a local run: any plan was made for the cluster's hardware
        return f"{name}: ran on CPU worker processes here, not on the planned hardware; {source}"
    return f"{name}: no resource plan was applied, billed as declared; {source}"


def compare_runs(
    runs: list[RunSummary], prices: dict[str, float], known_prices: Collection[str] = ()
) -> HardwareComparison:
    """Cost = accelerator-hours of training x the price per accelerator-hour: the applied plan's catalog
    price where a plan put the run on its hardware (a MIG slice is not priced as its whole GPU), else the
    price from `prices` for the accelerator."""
    if not runs:
        raise ValueError("nothing to compare: no runs given")
    raise_for(price_problems(prices, known_prices))
    rows = [price_run(run, prices) for run in runs]
    priced = [row for row in rows if row.cost_usd is not None]
    notes = [pricing_note(row) for row in rows if row.run.billed.price_per_hour is None]
    return HardwareComparison(
        rows=rows,
        most_accurate=max(rows, key=lambda r: r.run.score).run.name,
        fastest=min(rows, key=lambda r: r.run.training.train_seconds).run.name,
        cheapest=min(priced, key=lambda r: r.cost_usd).run.name if priced else "unknown",
        notes=notes,
        regression=all(run.regression for run in runs),
    )


def price_problems(prices: Mapping[str, float], known: Collection[str] = ()) -> list[str]:
    """A price is USD per accelerator-hour: a finite number >= 0 (a whole number too), under one of the
    `known` accelerator names where they are given (a misspelt key would otherwise price nothing)."""
    unknown = [name for name in prices if known and name not in known]
    return [unknown_price_key(name, known) for name in unknown] + [
        f"input 'prices[{name!r}]' = {price!r}: must be a finite number >= 0 (USD per accelerator-hour); "
        f"pass e.g. --prices '{json.dumps({name: 1.5})}'"
        for name, price in prices.items()
        if isinstance(price, bool) or not isinstance(price, int | float) or not 0 <= price < math.inf
    ]


def unknown_price_key(name: str, known: Collection[str]) -> str:
    close = difflib.get_close_matches(name.strip().lower(), list(known), n=1)
    guess = f"did you mean {close[0]!r}? " if close else ""
    return f"input 'prices' has the key {name!r}, which prices nothing: {guess}known: {', '.join(known)}"
