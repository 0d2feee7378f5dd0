"""Training progress, the same for both loops: where a run stands (what its checkpoint records), the
line logged per epoch, and a live bar on a terminal or plain log lines at a steady rate elsewhere."""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import asdict, dataclass, field

from tasks.core.training.config import SELECTION_METRICS, TrainConfig
from tasks.core.training.records import EpochMetrics

log = logging.getLogger(__name__)


@dataclass
class TrainingProgress:
    """Where a run stands: the epoch in progress (from 0), the steps done in it (optimizer steps in
    the torch loop, batches in the Keras one), and the metrics of every completed epoch. A
    checkpoint holds it as `to_dict()`, a plain dict."""

    epoch: int = 0
    step: int = 0
    history: list[EpochMetrics] = field(default_factory=list)

    def finish_epoch(self, metrics: EpochMetrics) -> None:
        self.history.append(metrics)
        self.epoch, self.step = self.epoch + 1, 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, saved: dict) -> TrainingProgress:
        history = [EpochMetrics(**metrics) for metrics in saved["history"]]
        return cls(saved["epoch"], saved["step"], history)


@dataclass(frozen=True)
class EpochChoice:
    """Which epoch's weights a run hands back (`keep`: the best by `metric`, or the last), and whether
    it stops before its `epochs` (after `patience` epochs in a row without a better `metric`; 0:
    never). Every answer is a function of the history alone: the ranks of a DDP run, whose validation
    metrics are reduced over all of them, decide alike without a vote, and a resumed run, whose
    checkpoint holds the history, decides as the uninterrupted one did."""

    keep: str = "best"
    metric: str = "val_loss"
    patience: int = 0
    epochs: int = 1

    @classmethod
    def of(cls, config: TrainConfig) -> EpochChoice:
        return cls(config.keep, config.selection_metric, config.patience, config.epochs)

    def best_epoch(self, history: list[EpochMetrics]) -> int:
        """The epoch (from 1) with the best finite `metric`, the earliest of equals; 0 if none is finite."""
        lowest = SELECTION_METRICS[self.metric] == "lowest"
        best, best_value = 0, math.nan
        for metrics in history:
            value = getattr(metrics, self.metric)
            if math.isfinite(value) and (best == 0 or (value < best_value if lowest else value > best_value)):
                best, best_value = metrics.epoch, value
        return best

    def stops_early(self, history: list[EpochMetrics]) -> bool:
        """Whether the run ends after its last completed epoch although epochs remain."""
        if self.patience == 0 or not history or history[-1].epoch >= self.epochs:
            return False
        return history[-1].epoch - self.best_epoch(history) >= self.patience

    def keeps_copy(self, history: list[EpochMetrics]) -> bool:
        """Whether the epoch just completed is the best so far, whose weights the loop copies aside."""
        return self.keep == "best" and bool(history) and self.best_epoch(history) == history[-1].epoch

    def restores_copy(self, history: list[EpochMetrics]) -> bool:
        """Whether the run ends on other weights than the best epoch's copy, which it then takes back."""
        best = self.best_epoch(history)
        return self.keep == "best" and 0 < best < history[-1].epoch

    def kept(self, history: list[EpochMetrics]) -> tuple[int, str]:
        """The epoch whose weights the run hands back, and why: e.g. (9, "best val_loss 0.1161 at
        epoch 9 of 30")."""
        if not history:
            return 0, ""
        last, best = history[-1].epoch, self.best_epoch(history)
        if self.keep == "last":
            epoch, reason = last, "the last epoch (keep: last)"
        elif best == 0:
            epoch, reason = last, f"the last epoch: no epoch had a finite {self.metric}"
        else:
            value = next(getattr(metrics, self.metric) for metrics in history if metrics.epoch == best)
            epoch, reason = best, f"best {self.metric} {value:.4f} at epoch {best} of {last}"
        if self.stops_early(history):
            reason += (
                f"; early stopping after epoch {last} of {self.epochs}: "
                f"no better {self.metric} for {self.patience} epochs"
            )
        return epoch, reason


def log_epoch(metrics: EpochMetrics, epochs: int, regression: bool = False) -> None:
    """One line an epoch; a regression's has no accuracy, and its losses are squared errors of the
    standardised label."""
    if regression:
        log.info(
            "epoch %d/%d train_mse=%.4f val_mse=%.4f",
            metrics.epoch,
            epochs,
            metrics.train_loss,
            metrics.val_loss,
        )
        return
    log.info(
        "epoch %d/%d train_loss=%.4f train_acc=%.4f val_loss=%.4f val_acc=%.4f",
        metrics.epoch, epochs, metrics.train_loss, metrics.train_accuracy,
        metrics.val_loss, metrics.val_accuracy,
    )  # fmt: skip


class ProgressReporter:
    """Reports epoch/step/loss. On a terminal it redraws one line; in a pod's log (no TTY) it
    writes a line at most every `log_every_s` seconds, and one at the end of every epoch."""

    def __init__(self, epochs: int, enabled: bool = True, log_every_s: float = 30.0, stream=None):
        self.epochs, self.enabled, self.log_every_s = epochs, enabled, log_every_s
        self.stream = stream or sys.stderr
        self.interactive = enabled and self.stream.isatty()
        self._last = time.monotonic()

    def step(self, epoch: int, step: int, steps: int, mean_loss) -> None:
        """`mean_loss` is a callable, so the loss is only read (a device sync) when shown."""
        if not self.enabled:
            return
        now = time.monotonic()
        if self.interactive:
            if now - self._last >= 0.2 or step == steps:
                self.stream.write(
                    f"\repoch {epoch + 1}/{self.epochs} step {step}/{steps} loss {mean_loss():.4f}"
                )
                self.stream.flush()
                self._last = now
        elif now - self._last >= self.log_every_s:
            log.info("epoch %d/%d step %d/%d loss %.4f", epoch + 1, self.epochs, step, steps, mean_loss())
            self._last = now

    def epoch_end(self) -> None:
        if self.interactive:
            self.stream.write("\n")
            self.stream.flush()
