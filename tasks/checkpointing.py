"""Training checkpoints through Flyte's task checkpoint, so a retried attempt continues the last one."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from flytekit import current_context

from tasks.core.checkpoint import TrainingCheckpoint

log = logging.getLogger(__name__)


def flyte_checkpoint(every_steps: int) -> TrainingCheckpoint | None:
    """A checkpoint in this attempt's working directory, seeded from the previous attempt's, if any.

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
    if flyte.restore(local) is not None:
        log.info("restored the previous attempt's checkpoint")
    uploads = int(os.environ.get("RANK", "0")) == 0
    return TrainingCheckpoint(str(local), every_steps, on_save=flyte.save if uploads else None)
