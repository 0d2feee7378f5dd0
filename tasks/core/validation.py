"""Checks on workflow inputs that run before any data is read or any accelerator is requested."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from tasks.core.config import PRECISIONS
from tasks.core.tf_strategy import STRATEGIES


class InputError(ValueError):
    """A workflow input that cannot work; the message names the input, the value and the fix."""


@dataclass
class RunInputs:
    target: str
    epochs: int
    batch_size: int
    learning_rate: float
    grad_accum_steps: int
    hidden_sizes: list[int]
    dropout: float
    val_fraction: float
    test_fraction: float
    precision: str
    tf_strategy: str


def problems(run: RunInputs, targets: Collection[str]) -> list[str]:
    """Every bad input; `targets` are the valid target names (the table in tasks/targets.py)."""
    found = []

    def check(ok: bool, name: str, rule: str, fix: str) -> None:
        if not ok:
            found.append(f"input '{name}' = {getattr(run, name)!r}: {rule}; {fix}")

    check(
        run.target in targets,
        "target",
        f"not one of {', '.join(targets)}",
        "pass --target gpu or --target tpu",
    )
    check(run.epochs >= 1, "epochs", "must be at least 1", "pass e.g. --epochs 10")
    check(run.batch_size >= 1, "batch_size", "must be at least 1", "pass e.g. --batch_size 64")
    check(run.learning_rate > 0, "learning_rate", "must be positive", "pass e.g. --learning_rate 0.001")
    check(run.grad_accum_steps >= 1, "grad_accum_steps", "must be at least 1", "pass --grad_accum_steps 1")
    check(
        bool(run.hidden_sizes) and all(size >= 1 for size in run.hidden_sizes),
        "hidden_sizes", "needs at least one layer and positive widths", "pass e.g. --hidden_sizes '[256, 128]'",
    )  # fmt: skip
    check(0 <= run.dropout < 1, "dropout", "must be in [0, 1)", "pass e.g. --dropout 0.1")
    for name in ("val_fraction", "test_fraction"):
        check(0 < getattr(run, name) < 0.5, name, "must be between 0 and 0.5", f"pass e.g. --{name} 0.15")
    check(
        run.precision in PRECISIONS,
        "precision",
        f"not one of {', '.join(PRECISIONS)}",
        "pass --precision auto",
    )
    check(
        run.tf_strategy in STRATEGIES,
        "tf_strategy",
        f"not one of {', '.join(STRATEGIES)}",
        "pass --tf_strategy auto",
    )
    return found


def validate_run(run: RunInputs, targets: Collection[str]) -> None:
    """Raise one InputError listing every bad input, so a user fixes them all at once."""
    found = problems(run, targets)
    if found:
        raise InputError("invalid workflow inputs:\n  " + "\n  ".join(found))
