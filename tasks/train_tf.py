"""TensorFlow training: on a TPU slice (TPUStrategy) or on GPUs (MirroredStrategy).

Both tasks share one body; they differ in the hardware they ask for and check. Locally they run on
CPU with the default strategy and report that they did. On a cluster each first checks that its
accelerator is usable and otherwise fails, naming it, before it reads any data. With `resume_from` a
run continues the one whose checkpoint it is (a promoted tuning trial, docs/tuning.md).
"""

from __future__ import annotations

import logging
from pathlib import Path

from flytekit import current_context, task
from flytekit.types.directory import FlyteDirectory
from flytekit.types.file import FlyteFile

from tasks.core.accelerators.rule import on_flyte_cluster
from tasks.core.training.config import TrainConfig
from tasks.core.training.preemption import Preempted, PreemptionNotice
from tasks.core.training.records import Hardware, TrainingRun
from tasks.core.training.telemetry import UtilisationSampler
from tasks.core.training.tf_strategy import require_gpus, require_tpu, set_pjrt_defaults, tpu_target_strategy
from tasks.hardware import TRAIN_TF_GPU, TRAIN_TPU, TRIAL_CACHE, TrainingProfile
from tasks.plumbing.checkpointing import flyte_checkpoint, handed_back, seed_checkpoint
from tasks.plumbing.decks import DECKS, training_deck
from tasks.plumbing.failures import retried_as_recoverable
from tasks.plumbing.preemption_exit import preempted_exit
from tasks.plumbing.process import begin_task
from tasks.types import PreparedData, TrainedModel

log = logging.getLogger(__name__)


def declared_hardware(run: TrainingRun, profile: TrainingProfile) -> Hardware:
    """What the task declares: its profile's TPU slice or GPUs, or on a laptop its one CPU process."""
    return Hardware("cpu", 1) if run.on_cpu else profile.declared(run.world_size)


def train_tensorflow(
    prepared: PreparedData,
    config: TrainConfig,
    profile: TrainingProfile,
    strategy: str,
    resume_from: FlyteDirectory | None = None,
) -> TrainedModel:
    from tasks.core.training.tf_training import KerasRunOptions, train_keras

    splits = prepared.local_splits()
    artifact = Path(current_context().working_directory) / "model.npz"
    checkpoint = flyte_checkpoint()
    if checkpoint and resume_from is not None:
        seed_checkpoint(checkpoint.directory, resume_from)
    board = Path(current_context().working_directory) / "tensorboard"
    with UtilisationSampler() as sampler, PreemptionNotice(profile.attempts.preemption_grace_s) as notice:
        try:
            options = KerasRunOptions(
                checkpoint_dir=str(checkpoint.directory) if checkpoint else None,
                on_checkpoint=checkpoint.on_save if checkpoint else None, log_dir=str(board),
                preemption=notice,
            )  # fmt: skip
            outcome = train_keras(config, splits, str(artifact), strategy=strategy, options=options)
        except Preempted:
            raise preempted_exit() from None
    run = outcome.run
    log.info(
        "trained with tf.distribute '%s' on %s, %d replicas, %s, %.0f samples/s",
        run.strategy, run.device_name, run.world_size, run.precision, run.samples_per_second,
    )  # fmt: skip
    trained = TrainedModel(
        artifact=FlyteFile(str(artifact)),
        run=run,
        declared=declared_hardware(run, profile),
        tensorboard=FlyteDirectory(str(board)),
        checkpoint=handed_back(checkpoint, config, rank=0),
    )
    training_deck(trained, sampler.samples)
    return trained


def train_on_tpu(
    prepared: PreparedData, hyperparameters: TrainConfig, resume_from: FlyteDirectory | None = None
) -> TrainedModel:
    with retried_as_recoverable():  # which failures Flyte retries: tasks/plumbing/failures.py
        on_cluster = on_flyte_cluster()
        strategy = tpu_target_strategy(hyperparameters.tf_strategy, on_cluster)
        set_pjrt_defaults()  # before TensorFlow is imported, which reads them once
        if on_cluster:
            require_tpu(TRAIN_TPU.describe())
        return train_tensorflow(prepared, hyperparameters, TRAIN_TPU, strategy, resume_from)


def train_on_gpus(
    prepared: PreparedData, hyperparameters: TrainConfig, resume_from: FlyteDirectory | None = None
) -> TrainedModel:
    with retried_as_recoverable():
        if on_flyte_cluster():
            require_gpus(TRAIN_TF_GPU.describe(), TRAIN_TF_GPU.gpus_per_node)
        return train_tensorflow(
            prepared, hyperparameters, TRAIN_TF_GPU, hyperparameters.tf_strategy, resume_from
        )


@task(**TRAIN_TPU.task_options(), **DECKS)
def train_tf_tpu(
    prepared: PreparedData, hyperparameters: TrainConfig, resume_from: FlyteDirectory | None = None
) -> TrainedModel:
    """TensorFlow on a TPU slice (TPUStrategy); with `resume_from`, continuing that checkpoint's run."""
    begin_task()
    return train_on_tpu(prepared, hyperparameters, resume_from)


@task(**TRAIN_TF_GPU.task_options(), **DECKS)
def train_tf_gpu(
    prepared: PreparedData, hyperparameters: TrainConfig, resume_from: FlyteDirectory | None = None
) -> TrainedModel:
    """TensorFlow on GPUs (MirroredStrategy); with `resume_from`, continuing that checkpoint's run."""
    begin_task()
    return train_on_gpus(prepared, hyperparameters, resume_from)


@task(**TRAIN_TPU.task_options(), **DECKS, cache=TRIAL_CACHE)
def train_tf_tpu_trial(
    prepared: PreparedData, hyperparameters: TrainConfig, resume_from: FlyteDirectory | None = None
) -> TrainedModel:
    """`train_tf_tpu`, cached: a tuning trial (tasks/tune.py), which a rerun of its study reuses."""
    begin_task()
    return train_on_tpu(prepared, hyperparameters, resume_from)


@task(**TRAIN_TF_GPU.task_options(), **DECKS, cache=TRIAL_CACHE)
def train_tf_gpu_trial(
    prepared: PreparedData, hyperparameters: TrainConfig, resume_from: FlyteDirectory | None = None
) -> TrainedModel:
    """`train_tf_gpu`, cached: a tuning trial (tasks/tune.py), which a rerun of its study reuses."""
    begin_task()
    return train_on_gpus(prepared, hyperparameters, resume_from)
