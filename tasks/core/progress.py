"""Training progress: a live bar on a terminal, plain log lines at a steady rate everywhere else."""

from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger(__name__)


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
