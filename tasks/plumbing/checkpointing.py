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
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flytekit import current_context
from flytekit.exceptions.user import FlyteDataNotFoundException
from flytekit.types.directory import FlyteDirectory

from tasks.core.training.config import TrainConfig

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


def seed_checkpoint(directory: str, resume_from: FlyteDirectory) -> None:
    """A run resumed from another run's checkpoint (a promoted tuning trial) starts from it, unless this
    task's own earlier attempt saved a newer state there."""
    local = Path(directory)
    if any(local.iterdir()):
        log.info("resuming from this task's previous attempt, not from resume_from")
        return
    shutil.copytree(resume_from.download(), local, dirs_exist_ok=True)
    log.info("resuming from the checkpoint passed in (resume_from)")


def handed_back(location, config: TrainConfig, rank: int) -> FlyteDirectory | None:
    """The run's checkpoint, for a run that stops at a rung (`train_until_epoch`) and may be resumed."""
    if location is None or rank != 0 or not config.train_until_epoch:
        return None
    return FlyteDirectory(location.directory)
