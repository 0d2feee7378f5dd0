"""The launcher stops its workers before it exits, however often the notice comes: it acts on the
first notice and ignores repeats (an attempt run as a pod and signalled ten times: test_retries), and
its last line of defence, which waits for and then kills workers the agent's shutdown left behind, is
checked on its own with stand-in workers."""

from __future__ import annotations

import inspect
import multiprocessing
import os
import signal
import time

import pytest

from tasks.core.training.preemption import PREEMPTED_EXIT_CODE
from tasks.train_torch import notice_acted_on_once, stop_remaining_workers

pytestmark = pytest.mark.slow


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
