"""The pods of a multi-node PyTorchJob that do not hold rank 0 wait for rank 0's outputs before exiting.

An elastic PyTorchJob is marked Succeeded as soon as any worker pod succeeds (training-operator
v1.8.1, pkg/controller.v1/pytorch/pytorchjob_controller.go: `ElasticPolicy != nil && succeeded > 0`).
The pod without rank 0 has nothing to write (flytekitplugins-kfpytorch raises `IgnoreOutputs`
there); exiting at once would let the job succeed while rank 0 is still saving the model, and
propeller would find no outputs. Waiting here until rank 0's pod has written `outputs.pb` (or an
error document) to the task's output prefix, which every pod of the job shares, closes that gap.
Then it waits a little longer for rank 0's Deck, which flytekit uploads after the outputs
(flytekit/bin/entrypoint.py, `_dispatch_execute` then `_output_deck`): once this pod exits the job
is complete, and the operator deletes the pods still running (`cleanPodPolicy: Running`).

The prefix is Flyte's storage: the caller passes the filesystem flytekit's data persistence gives for
it, which carries the storage settings (an S3-compatible endpoint and keys) a bare fsspec one lacks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import fsspec

log = logging.getLogger(__name__)

OUTPUTS_FILE = "outputs.pb"  # flytekit's constants.OUTPUT_FILE_NAME
# flytekit's constants.ERROR_FILE_NAME, or error-<uuid>.pb under propeller's distributed error
# aggregation (FLYTE_INTERNAL_DIST_ERROR_STRATEGY), so that workers do not overwrite each other's.
ERROR_FILES = "error*.pb"
DECK_FILE = "deck.html"  # flytekit's deck.DECK_FILE_NAME


class RankZeroSilent(RuntimeError):
    """Rank 0's pod wrote neither outputs nor an error in the time allowed."""


def listed(filesystem: fsspec.AbstractFileSystem, prefix: str) -> str:
    """`prefix` as a path of `filesystem`, its listing cache dropped (object stores' listings are cached
    per filesystem instance)."""
    root = fsspec.core.split_protocol(prefix)[1].rstrip("/")
    filesystem.invalidate_cache(root)
    return root


def written_by_rank_zero(filesystem: fsspec.AbstractFileSystem, prefix: str) -> str | None:
    """The outputs or error document at `prefix`, or None while there is none."""
    root = listed(filesystem, prefix)
    if filesystem.exists(f"{root}/{OUTPUTS_FILE}"):
        return f"{root}/{OUTPUTS_FILE}"
    errors = filesystem.glob(f"{root}/{ERROR_FILES}")
    return errors[0] if errors else None


def deck_written(filesystem: fsspec.AbstractFileSystem, prefix: str) -> str | None:
    root = listed(filesystem, prefix)
    return f"{root}/{DECK_FILE}" if filesystem.exists(f"{root}/{DECK_FILE}") else None


def poll(
    found: Callable[[], str | None],
    timeout_s: float,
    poll_s: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> str | None:
    """`found()` once it is not None, or None after `timeout_s`."""
    start = clock()
    while (result := found()) is None and clock() - start < timeout_s:
        sleep(poll_s)
    return result


def wait_for_rank_zero(
    filesystem: fsspec.AbstractFileSystem,
    prefix: str,
    timeout_s: float,
    deck_timeout_s: float = 0.0,
    poll_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Blocks until rank 0's pod has written its outputs or error at `prefix`, then up to
    `deck_timeout_s` more for its Deck; returns the outputs or error file."""
    start = clock()
    log.info("training done on this node; waiting up to %g s for rank 0's outputs at %s", timeout_s, prefix)
    found = poll(lambda: written_by_rank_zero(filesystem, prefix), timeout_s, poll_s, clock, sleep)
    if found is None:
        raise RankZeroSilent(
            f"this node's workers finished, but in {timeout_s:g} s the pod holding rank 0 wrote neither "
            f"{OUTPUTS_FILE} nor an error document to {prefix}; it was probably lost while saving"
        )
    log.info("rank 0 wrote %s after %.1f s", found, clock() - start)
    if (
        deck_timeout_s > 0
        and poll(lambda: deck_written(filesystem, prefix), deck_timeout_s, poll_s, clock, sleep) is None
    ):
        log.warning(
            "rank 0 wrote no %s within %g s of its outputs; this pod exits anyway", DECK_FILE, deck_timeout_s
        )
    return found
