"""The pods of a multi-node PyTorchJob that do not hold rank 0 wait for rank 0's outputs before exiting.

An elastic PyTorchJob is marked Succeeded as soon as any worker pod succeeds (training-operator
v1.8.1, pkg/controller.v1/pytorch/pytorchjob_controller.go: `ElasticPolicy != nil && succeeded > 0`).
The pod without rank 0 has nothing to write (flytekitplugins-kfpytorch raises `IgnoreOutputs`
there), so it used to exit at once, the job succeeded while rank 0 was still saving the model, and
propeller then found no outputs. Waiting here until rank 0's pod has written `outputs.pb` (or an
error document) to the task's output prefix, which every pod of the job shares, closes that gap.
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


class RankZeroSilent(RuntimeError):
    """Rank 0's pod wrote neither outputs nor an error in the time allowed."""


def written_by_rank_zero(prefix: str) -> str | None:
    """The outputs or error document at `prefix` (any fsspec URI), or None while there is none."""
    fs, root = fsspec.core.url_to_fs(prefix)
    fs.invalidate_cache(root)  # object stores' listings are cached per filesystem instance
    root = root.rstrip("/")
    if fs.exists(f"{root}/{OUTPUTS_FILE}"):
        return f"{root}/{OUTPUTS_FILE}"
    errors = fs.glob(f"{root}/{ERROR_FILES}")
    return errors[0] if errors else None


def wait_for_rank_zero(
    prefix: str,
    timeout_s: float,
    poll_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Blocks until rank 0's pod has written its outputs or error at `prefix`; returns that file."""
    start = clock()
    log.info("training done on this node; waiting up to %g s for rank 0's outputs at %s", timeout_s, prefix)
    while (found := written_by_rank_zero(prefix)) is None:
        if clock() - start >= timeout_s:
            raise RankZeroSilent(
                f"this node's workers finished, but in {timeout_s:g} s the pod holding rank 0 wrote neither "
                f"{OUTPUTS_FILE} nor an error document to {prefix}; it was probably lost while saving"
            )
        sleep(poll_s)
    log.info("rank 0 wrote %s after %.1f s; this node's pod exits", found, clock() - start)
    return found
