"""Training checkpoints through Flyte's task checkpoint, so a retried attempt continues the last one.

Which checkpoint an attempt gets is propeller's choice (flytepropeller/pkg/controller/nodes/task/
taskexec_context.go, `ComputePreviousCheckpointPath`): attempt N >= 1 always gets attempt N-1's
checkpoint prefix, whether or not that attempt wrote anything there. An attempt that died before
its first save (preempted while pulling the image, out of memory in epoch 1, a rendezvous timeout)
leaves an empty prefix, which flytekit's `SyncCheckpoint.restore` reports as
`FlyteDataNotFoundException`. So: a missing previous checkpoint is a fresh start, and a restored one
is saved to this attempt's prefix at once, so that every attempt's prefix holds the newest good state
however many attempts in a row die before saving.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flytekit import current_context
from flytekit.exceptions.user import FlyteDataNotFoundException

log = logging.getLogger(__name__)


@dataclass
class CheckpointLocation:
    directory: str  # local; holds the previous attempt's checkpoint when there was one
    on_save: Callable[[str], None] | None  # uploads the directory as this attempt's checkpoint


def flyte_checkpoint() -> CheckpointLocation | None:
    """A checkpoint directory in this attempt's working directory, seeded from the previous attempt.

    Every worker restores; only rank 0 uploads. None where the platform offers no checkpoint.
    """
    context = current_context()
    try:
        flyte = context.checkpoint
    except NotImplementedError:
        log.warning("this execution has no task checkpoint; training will not be resumable")
        return None
    local = Path(context.working_directory) / "checkpoint"
    local.mkdir(parents=True, exist_ok=True)
    uploads = int(os.environ.get("RANK", "0")) == 0
    if restore_previous(flyte, local) and uploads:
        flyte.save(local)
        log.info("saved the restored checkpoint to this attempt's prefix")
    return CheckpointLocation(str(local), flyte.save if uploads else None)


def restore_previous(flyte, local: Path) -> bool:
    """Download the previous attempt's checkpoint into `local`; False when there is none."""
    try:
        restored = flyte.restore(local) is not None
    except FlyteDataNotFoundException:
        log.info(
            "the previous attempt saved no checkpoint (it ended before its first save): training from scratch"
        )
        return False
    if restored and not any(local.iterdir()):
        log.info("the previous attempt's checkpoint is empty: training from scratch")
        return False
    if restored:
        log.info("restored the previous attempt's checkpoint")
    return restored
