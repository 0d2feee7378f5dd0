"""How a training attempt ends once the preemption notice (SIGTERM) stopped it and its checkpoint is
saved: as a failure that Flyte retries, so that the next attempt resumes from that checkpoint.

A task process exits with 128 + the signal, the status a shell reports for a process the signal
ended (the notice's watchdog in tasks/core/training/preemption.py exits with the same). Propeller classifies
a non-zero exit with no pod reason, or a node-shutdown reason, as a system error and retries it
(flyteplugins/go/tasks/pluginmachinery/flytek8s/pod_helper.go, `DemystifyFailure`). A DDP worker is
not the task's process: its `Preempted` is retried through the failure table (tasks/plumbing/failures.py).
"""

from __future__ import annotations

import signal


def preempted_exit(signum: int = signal.SIGTERM) -> SystemExit:
    """What the task process raises to end a preempted attempt."""
    return SystemExit(128 + signum)
