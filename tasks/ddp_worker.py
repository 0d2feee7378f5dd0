"""What each DDP worker of the torch training tasks runs (tasks/train_torch.py launches them).

A module apart from the tasks, so that a spawned worker loads only this: not the task definitions,
their typed interfaces, Decks or the launcher's utilisation sampling. The launcher sends the task
function to each worker by value (its module's attribute of that name is the task, not the
function), and that function refers to `train_with_ddp` here.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flytekit import current_context
from flytekit.types.directory import FlyteDirectory
from flytekit.types.file import FlyteFile

from tasks.core.training.config import TrainConfig
from tasks.core.training.preemption import PreemptionNotice
from tasks.core.training.records import Hardware
from tasks.plumbing.checkpointing import flyte_checkpoint, handed_back, seed_checkpoint
from tasks.plumbing.failures import retried_as_recoverable
from tasks.plumbing.process import begin_task
from tasks.types import PreparedData, TrainedModel

if TYPE_CHECKING:
    from tasks.hardware import GpuTrainingProfile

log = logging.getLogger(__name__)


@dataclass
class SetUpRefused:
    """What every worker returns, instead of raising, when the ranks agreed that their set-up failed
    (the model's build, say). The launcher raises it as `SetUpFailed`, a non-recoverable error that
    names the rank that failed first, rather than torch elastic's report of every worker."""

    message: str


def train_with_ddp(
    prepared: PreparedData,
    config: TrainConfig,
    profile: GpuTrainingProfile,
    resume_from: FlyteDirectory | None = None,
) -> TrainedModel | SetUpRefused:
    """Runs in every DDP worker; rank 0's return value becomes the task output. A failure that Flyte
    retries (tasks/plumbing/failures.py) is raised as `FlyteRecoverableException`: the kfpytorch plugin marks
    only that one recoverable for the launcher (flytekitplugins/kfpytorch/task.py, `spawn_helper`)."""
    from tasks.core.models.torch_startup import tensorboard_without_tensorflow
    from tasks.core.training.checkpoint import TrainingCheckpoint
    from tasks.core.training.nccl_pairing import checked_nccl
    from tasks.core.training.torch_ddp import SetUpFailed, shutdown_distributed
    from tasks.core.training.torch_training import train

    begin_task()
    # On GPUDirect, torch is imported by now and with it its NCCL: say which, or fail on the wrong one.
    if nccl := checked_nccl(os.environ):
        log.info("%s", nccl)
    tensorboard_without_tensorflow()  # a spawned worker process: TensorFlow never runs here
    splits = prepared.splits_in_place()  # each rank reads its own row groups, nothing downloaded whole
    workdir = Path(current_context().working_directory)
    artifact = workdir / "model.pt"
    try:
        with retried_as_recoverable():
            location = flyte_checkpoint()
            if location and resume_from is not None:
                seed_checkpoint(location.directory, resume_from)
            every = config.checkpoint_every_steps
            checkpoint = TrainingCheckpoint(location.directory, every, location.on_save) if location else None
            board = workdir / "tensorboard"
            with PreemptionNotice(profile.attempts.preemption_grace_s) as notice:
                outcome = train(config, splits, str(artifact), checkpoint, str(board), preemption=notice)
    except SetUpFailed as failed:
        log.error("%s", failed)
        return SetUpRefused(str(failed))
    finally:
        shutdown_distributed()
    run = outcome.run
    log.info(
        "rank %d: trained on %s x%d (%s, %s) at %.0f samples/s",
        outcome.rank, run.device_name, run.world_size, run.backend, run.precision, run.samples_per_second,
    )  # fmt: skip
    on_cpu = run.on_cpu
    return TrainedModel(
        artifact=FlyteFile(str(artifact)),
        run=run,
        declared=Hardware("cpu", run.world_size) if on_cpu else profile.declared(run.world_size),
        tensorboard=FlyteDirectory(str(board)) if outcome.rank == 0 else None,
        checkpoint=handed_back(location, config, outcome.rank),
    )
