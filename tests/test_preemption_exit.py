"""How a preempted attempt ends: the task process with 128 + the signal, a DDP worker with a recoverable
error. The tests that signal real attempts (test_preemption.py, test_tf_preemption.py,
test_launcher_signal.py, test_retries.py) check the exit status end to end."""

from __future__ import annotations

import signal

from flytekit.exceptions.user import FlyteRecoverableException

from tasks.core.preemption import PREEMPTED_EXIT_CODE, Preempted
from tasks.preemption_exit import preempted_exit, preempted_worker_error


def test_a_preempted_task_process_exits_as_a_shell_reports_the_signal():
    assert preempted_exit().code == PREEMPTED_EXIT_CODE == 143
    assert preempted_exit(signal.SIGINT).code == 130


def test_a_preempted_worker_raises_a_recoverable_error_that_says_where_it_stopped():
    error = preempted_worker_error(Preempted(epoch=2, step=40, seconds=1.5))
    assert isinstance(error, FlyteRecoverableException)
    assert "at epoch 3, step 40" in str(error) and "resumes from it" in str(error)
