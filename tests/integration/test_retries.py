"""Retries as a Flyte cluster runs them, with each attempt run from its serialized command.

Propeller hands attempt N >= 1 attempt N-1's checkpoint prefix, written or not
(flytepropeller/pkg/controller/nodes/task/taskexec_context.go, `ComputePreviousCheckpointPath`), and a
reclaimed node sends SIGTERM before the kill. Here the prefixes are local folders and the attempts
are fresh processes, signalled or killed as a node would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import torch

from tasks.core.training.checkpoint import STATE_FILE
from tasks.core.training.keras_callbacks import STATE_FILE as KERAS_STATE_FILE
from tasks.core.training.preemption import DEFAULT_GRACE_S, PREEMPTED_EXIT_CODE
from tasks.train_tf import train_tf_gpu
from tasks.types import TrainedModel
from tests.conftest import POD_HYPERPARAMETERS
from tests.flyte_package import REPO
from tests.pods import (
    literals,
    merged,
    model_parameters,
    output,
    pod_command,
    pod_environment,
    run_like_a_pod,
    running,
    workers_of,
)

pytestmark = pytest.mark.slow

HYPER = POD_HYPERPARAMETERS  # what the shared attempt trained with
SLOW_STEPS = {
    "PYTHONPATH": str(REPO / "tests" / "workers" / "slow_steps"),
    "MIXEDML_TEST_STEP_SECONDS": "0.05",
}


def start_attempt(spec, inputs, workdir: Path, previous_checkpoint: str = "", **env) -> subprocess.Popen:
    return subprocess.Popen(
        pod_command(spec, inputs, workdir, previous_checkpoint), cwd=REPO, env=pod_environment(**env),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip


def torch_state(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def wait_for_state(
    path: Path, attempt: subprocess.Popen, ready, load=torch_state, timeout_s: float = 180
) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert attempt.poll() is None, f"the attempt ended early:\n{attempt.stdout.read()[-3000:]}"
        if path.exists():
            try:
                state = load(path)
            # caught mid-write or mid-replace (torch's reader has raised EINVAL there): read it again next poll
            except (EOFError, OSError, RuntimeError, ValueError):
                state = None
            if state is not None and ready(state):
                return state
        time.sleep(0.01)
    raise AssertionError(f"no checkpoint state at {path} within {timeout_s} s")


def assert_stops_on_sigterm(attempt: subprocess.Popen, once, n_workers: int, repeats: int = 0) -> None:
    """Signals the attempt's main process alone, as the kubelet signals a container, once `once()`
    returns: the attempt must save and exit with the preempted code within the grace budget, leaving
    none of its `n_workers` worker processes running. `repeats` more notices follow the first, 0.2 s
    apart while the attempt runs: one that lands while the launcher shuts down must not end it by
    the signal instead."""
    try:
        once()
        workers = workers_of(psutil.Process(attempt.pid))
        assert len(workers) == n_workers, [worker.cmdline() for worker in workers]
        signalled = time.monotonic()
        attempt.send_signal(signal.SIGTERM)
        for _ in range(repeats):
            with contextlib.suppress(subprocess.TimeoutExpired):
                attempt.wait(timeout=0.2)
            attempt.send_signal(signal.SIGTERM)  # Popen sends nothing once the attempt has exited
        attempt.wait(timeout=DEFAULT_GRACE_S + 30)
        stopped_after = time.monotonic() - signalled
        left_running = running(workers)  # at once: no grace after the launcher's exit
    finally:
        if attempt.poll() is None:
            os.killpg(attempt.pid, signal.SIGKILL)
    log = attempt.stdout.read()
    assert attempt.returncode == PREEMPTED_EXIT_CODE, log[-3000:]
    assert stopped_after < DEFAULT_GRACE_S, log[-3000:]
    assert "stopped on the preemption notice (SIGTERM)" in log
    assert left_running == [], f"workers {left_running} outlived the launcher\n{log[-3000:]}"


def assert_same_model(first: TrainedModel, second: TrainedModel) -> None:
    assert second.run.history == first.run.history
    first_state, second_state = model_parameters(first), model_parameters(second)
    assert all(torch.equal(first_state[name], second_state[name]) for name in first_state)


def test_a_retry_whose_previous_attempt_saved_nothing_trains_from_scratch(completed_attempt):
    model = completed_attempt.model
    assert [epoch.epoch for epoch in model.run.history] == [1, 2, 3]
    assert model.run.samples_per_second > 0
    assert (completed_attempt.workdir / "checkpoint" / STATE_FILE).exists()


def test_a_chain_of_early_failures_keeps_the_last_good_checkpoint(
    train_spec, train_inputs, completed_attempt, tmp_path
):
    """An attempt that dies before any save of its own still hands the last good checkpoint on: its
    prefix holds the previous attempt's, file for file, for the next attempt to resume from (as the
    mid-epoch test's retry does)."""
    first = completed_attempt.workdir / "checkpoint"  # saved: every epoch done

    # The next attempt restores that state and dies (SIGKILL, as a lost node) before any save of its own.
    second = tmp_path / "attempt-2"
    attempt = start_attempt(train_spec, train_inputs, second, str(first))
    try:
        wait_for_state(second / "checkpoint" / STATE_FILE, attempt, ready=lambda state: True)
    finally:
        os.killpg(attempt.pid, signal.SIGKILL)
        attempt.wait(timeout=60)
    assert attempt.returncode == -signal.SIGKILL
    assert files_of(second / "checkpoint") == files_of(first)


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def test_sigterm_mid_epoch_saves_the_step_reached_and_the_retry_matches_an_uninterrupted_run(
    train_spec, train_inputs, completed_attempt, tmp_path
):
    """The notice comes ten times, 0.2 s apart, as it may while the launcher shuts down: the first
    stops the attempt, the repeats change nothing (test_launcher_signal pins how)."""
    first = tmp_path / "attempt-0"
    attempt = start_attempt(train_spec, train_inputs, first, **SLOW_STEPS)
    state_file = first / "checkpoint" / STATE_FILE

    def some_steps_into_the_second_epoch():
        wait_for_state(state_file, attempt, ready=lambda state: state["epoch"] >= 1)  # an epoch's save
        time.sleep(0.3)

    assert_stops_on_sigterm(attempt, once=some_steps_into_the_second_epoch, n_workers=2, repeats=9)
    assert not (first / "outputs" / "outputs.pb").exists()

    saved = torch.load(state_file, weights_only=True)
    assert saved["epoch"] >= 1 and saved["step"] > 0, "the checkpoint should hold the step reached, mid-epoch"

    retried = run_like_a_pod(train_spec, train_inputs, tmp_path / "attempt-1", str(first / "checkpoint"))
    assert_same_model(completed_attempt.model, output(retried, TrainedModel))


def test_a_keras_attempt_saves_and_exits_143_on_sigterm(flyte_package, train_inputs, tmp_path):
    """The TensorFlow task, run from its serialized command, turns the notice into a failed attempt."""
    spec = flyte_package.tasks["tasks.train_tf.train_tf_gpu"]
    inputs = merged(train_inputs, literals(train_tf_gpu, {"hyperparameters": replace(HYPER, epochs=500)}))
    attempt = start_attempt(spec, inputs, tmp_path / "attempt-0")
    state_file = tmp_path / "attempt-0" / "checkpoint" / KERAS_STATE_FILE

    def an_epoch_saved():
        wait_for_state(
            state_file, attempt, lambda state: state["epoch"] >= 1, load=lambda p: json.loads(p.read_text())
        )

    assert_stops_on_sigterm(attempt, once=an_epoch_saved, n_workers=0)  # Keras trains in the attempt
    assert 1 <= json.loads(state_file.read_text())["epoch"] < 500
