"""The launcher stops its workers before it exits: a training attempt run from its serialized command,
as a pod runs it, leaves none of its worker processes running once SIGTERM has ended it, and exits with
the preempted code however often the notice comes. The launcher's last line of defence, which waits for
and then kills workers the agent's shutdown left behind, is checked on its own with stand-in workers."""

from __future__ import annotations

import contextlib
import inspect
import multiprocessing
import os
import signal
import subprocess
import time
from dataclasses import replace

import psutil
import pytest

from tasks.core.checkpoint import STATE_FILE
from tasks.core.preemption import DEFAULT_GRACE_S, PREEMPTED_EXIT_CODE
from tasks.train_torch import notice_acted_on_once, stop_remaining_workers, train_torch
from tests.pods import literals, merged, running, workers_of
from tests.test_retries import HYPER, SLOW_STEPS, start_attempt, wait_for_state

pytestmark = pytest.mark.slow


def test_no_worker_outlives_the_launcher_stopped_by_repeated_notices(train_spec, train_inputs, tmp_path):
    """A repeated notice reaches the launcher while it shuts down; once CPython's finalization has put
    back the default action of torch's handler, one would end the launcher by the signal instead. (A
    single notice: test_retries, which checks the same of every attempt it stops.)"""
    inputs = merged(train_inputs, literals(train_torch, {"hyperparameters": replace(HYPER, epochs=100)}))
    attempt = start_attempt(train_spec, inputs, tmp_path / "attempt-0", **SLOW_STEPS)
    try:
        state_file = tmp_path / "attempt-0" / "checkpoint" / STATE_FILE
        wait_for_state(state_file, attempt, ready=lambda state: state["epoch"] >= 1)
        time.sleep(0.3)  # some steps into the second epoch
        workers = workers_of(psutil.Process(attempt.pid))
        assert len(workers) == 2, [worker.cmdline() for worker in workers]
        for _ in range(10):  # the notice again every 0.2 s while the launcher runs
            attempt.send_signal(signal.SIGTERM)  # Popen sends nothing once the launcher has exited
            with contextlib.suppress(subprocess.TimeoutExpired):
                attempt.wait(timeout=0.2)
        attempt.wait(timeout=DEFAULT_GRACE_S + 30)
        left_running = running(workers)  # at once: no grace after the launcher's exit
    finally:
        if attempt.poll() is None:
            attempt.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(attempt.pid, signal.SIGKILL)  # the launcher's session: whatever it left behind
        attempt.wait(timeout=60)
    log = attempt.stdout.read()
    assert attempt.returncode == PREEMPTED_EXIT_CODE, log[-3000:]
    assert left_running == [], f"workers {left_running} outlived the launcher\n{log[-3000:]}"


def test_the_agent_raises_on_the_first_notice_and_ignores_repeats():
    from torch.distributed.elastic.multiprocessing import api

    # What notice_acted_on_once relies on: the agent installs the handler by its module-level name.
    assert "signal.signal(sig, _terminate_process_handler)" in inspect.getsource(api.PContext.start)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with notice_acted_on_once():
            signal.signal(signal.SIGTERM, api._terminate_process_handler)  # as PContext.start does
            with pytest.raises(api.SignalException):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises here, at once
            os.kill(os.getpid(), signal.SIGTERM)  # a repeat: ignored
            assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        assert api._terminate_process_handler.__name__ == "_terminate_process_handler"  # put back
    finally:
        signal.signal(signal.SIGTERM, previous)


def stand_in_worker(ready, on_notice: str) -> None:
    """A worker that saves for 0.5 s on the notice and exits with the preempted code, or one that
    never reacts to it (stuck in a collective, say)."""
    if on_notice == "saves":
        signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.5), os._exit(PREEMPTED_EXIT_CODE)))
    else:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    time.sleep(60)


@pytest.mark.parametrize(
    "on_notice, exitcode",
    [("saves", PREEMPTED_EXIT_CODE), ("ignores", -signal.SIGKILL)],
    ids=["saves", "stuck"],
)
def test_the_launcher_waits_for_a_worker_left_running_then_kills_it(on_notice, exitcode, caplog):
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    worker = context.Process(target=stand_in_worker, args=(ready, on_notice))
    previous = signal.getsignal(signal.SIGTERM)
    worker.start()
    try:
        assert ready.wait(30)
        started = time.monotonic()
        stop_remaining_workers(signal.SIGTERM, budget_s=2)
        took = time.monotonic() - started
    finally:
        signal.signal(signal.SIGTERM, previous)
        if worker.is_alive():
            worker.kill()
        worker.join(10)
    assert worker.exitcode == exitcode
    assert 2 <= took < 2 + 5 if on_notice == "ignores" else took < 2  # the budget, then the kill; or its save
    assert "1 worker process(es) outlived the agent's shutdown" in caplog.text
