"""Training progress, the same for both loops: where a run stands (what its checkpoint records), the
line logged per epoch, and a live bar on a terminal or plain log lines at a steady rate elsewhere."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import asdict, dataclass, field

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


def log_epoch(metrics: EpochMetrics, epochs: int) -> None:
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
