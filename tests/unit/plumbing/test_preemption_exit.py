"""How a preempted attempt ends: the task process with 128 + the signal (a DDP worker's `Preempted` is
retried through tasks/plumbing/failures.py, tested in test_failures.py). The tests that signal real attempts (test_preemption.py, test_tf_preemption.py,
test_launcher_signal.py, test_retries.py) check the exit status end to end."""

from __future__ import annotations

import signal

from tasks.core.training.preemption import PREEMPTED_EXIT_CODE
from tasks.plumbing.preemption_exit import preempted_exit


def test_a_preempted_task_process_exits_as_a_shell_reports_the_signal():
    assert preempted_exit().code == PREEMPTED_EXIT_CODE == 143
    assert preempted_exit(signal.SIGINT).code == 130
