"""The preemption notice: SIGTERM some seconds before a node is taken away, and a bounded save.

A reclaimed spot node first terminates its pods: the kubelet sends SIGTERM to each container's
main process, waits the pod's `terminationGracePeriodSeconds`, then sends SIGKILL (GKE spot: 30 s of
notice for the node, of which ordinary pods get the first 15 s by default; AWS spot: 120 s). The
signal handler here only records the notice. The training loop checks it after each optimizer step,
saves a checkpoint of the step it reached and raises `Preempted`; a watchdog ends the process if
that has not happened within the grace budget, so an attempt never outlives its pod's grace period
with a half-finished save.

DEFAULT_GRACE_S leaves room, within GKE's default 15 s for ordinary pods, for the launcher's exit
margin (tasks/hardware.py, LAUNCHER_EXIT_MARGIN_S); docs/reliability.md says why.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 10
# What a shell reports for a process ended by SIGTERM: a preempted attempt exits with it.
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM


class Preempted(Exception):
    """Training stopped on the preemption notice after saving its checkpoint; a retry resumes it."""

    def __init__(self, epoch: int, step: int, seconds: float):
        super().__init__(
            f"stopped on the preemption notice (SIGTERM) at epoch {epoch + 1}, step {step}; the checkpoint "
            f"was saved {seconds:.1f} s after the notice, and a retried attempt resumes from it"
        )
        self.epoch, self.step, self.seconds = epoch, step, seconds


class PreemptionNotice:
    """Records SIGTERM while active (a context manager); installs its handler only on the main thread."""

    def __init__(self, grace_s: float = DEFAULT_GRACE_S):
        if grace_s <= 0:
            raise ValueError(f"the preemption grace budget must be > 0 seconds, got {grace_s}")
        self.grace_s = grace_s
        self.received_at: float | None = None
        self._previous_handler = None
        self._watchdog: threading.Timer | None = None

    @property
    def received(self) -> bool:
        return self.received_at is not None

    def __enter__(self) -> PreemptionNotice:
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_signal)
        else:
            log.warning("not on the main thread: SIGTERM cannot be caught, a preemption loses unsaved steps")
        return self

    def __exit__(self, *exc_info) -> None:
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None
        if self._watchdog is not None:
            self._watchdog.cancel()

    def _on_signal(self, signum, frame) -> None:
        if self.received:
            return
        self.received_at = time.monotonic()
        log.warning(
            "SIGTERM (preemption notice): finishing the current step, then saving a checkpoint within %g s",
            self.grace_s,
        )
        self._watchdog = threading.Timer(self.grace_s, self._budget_exhausted)
        self._watchdog.daemon = True
        self._watchdog.start()

    def _budget_exhausted(self) -> None:
        log.error(
            "the %g s preemption grace budget ran out before the checkpoint was saved; exiting without it "
            "(the retry resumes from the last completed save)",
            self.grace_s,
        )
        logging.shutdown()
        os._exit(PREEMPTED_EXIT_CODE)

    def stopped(self, epoch: int, step: int) -> Preempted:
        """Call once the checkpoint is saved: disarms the watchdog and returns the exception to raise."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        seconds = time.monotonic() - (self.received_at or time.monotonic())
        error = Preempted(epoch, step, seconds)
        log.warning("%s", error)
        return error
