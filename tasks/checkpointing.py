"""Training checkpoints through Flyte's task checkpoint, so a retried attempt continues the last one."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flytekit import current_context

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
    if flyte.restore(local) is not None:
        log.info("restored the previous attempt's checkpoint")
    uploads = int(os.environ.get("RANK", "0")) == 0
    return CheckpointLocation(str(local), flyte.save if uploads else None)
