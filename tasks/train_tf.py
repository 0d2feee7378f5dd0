"""TensorFlow training: on a TPU slice (TPUStrategy) or on GPUs (MirroredStrategy).

Both tasks share one body; they differ only in the hardware they ask for. Locally they run on
CPU with the default strategy and report that they did.
"""

from __future__ import annotations

import logging
from pathlib import Path

from flytekit import current_context, task
from flytekit.types.directory import FlyteDirectory
from flytekit.types.file import FlyteFile

from tasks.checkpointing import flyte_checkpoint
from tasks.core.config import TrainConfig
from tasks.core.preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionNotice
from tasks.core.telemetry import UtilisationSampler
from tasks.decks import DECKS, training_deck
from tasks.hardware import TF_GPU_IMAGE, TPU_IMAGE, TRAIN_GPU, TRAIN_TPU, Attempts, guaranteed
from tasks.logs import setup_logging
from tasks.types import PreparedData, TrainedModel

log = logging.getLogger(__name__)


def accelerator_used(strategy: str, device: str, replicas: int) -> tuple[str, int]:
    """What to bill: the TPU slice's chips, the GPUs, or CPU worker processes."""
    if strategy == "tpu":
        return TRAIN_TPU.gke_accelerator, TRAIN_TPU.chips
    if device != "cpu":
        return TRAIN_GPU.device, replicas
    return "cpu", 1


def train_tensorflow(
    prepared: PreparedData, config: TrainConfig, strategy: str, attempts: Attempts
) -> TrainedModel:
    from tasks.core.tf_training import train_keras

    setup_logging()
    splits = prepared.local_splits()
    artifact = Path(current_context().working_directory) / "model.keras"
    checkpoint = flyte_checkpoint()
    board = Path(current_context().working_directory) / "tensorboard"
    with UtilisationSampler() as sampler, PreemptionNotice(attempts.preemption_grace_s) as notice:
        try:
            outcome = train_keras(
                config, splits, str(artifact), strategy=strategy,
                checkpoint_dir=str(checkpoint.directory) if checkpoint else None,
                on_checkpoint=checkpoint.on_save if checkpoint else None, log_dir=str(board),
                preemption=notice,
            )  # fmt: skip
        except Preempted:
            # A failed attempt that propeller retries as a system failure, as for the torch launcher.
            raise SystemExit(PREEMPTED_EXIT_CODE) from None
    log.info(
        "trained with tf.distribute '%s' on %s, %d replicas, %s, %.0f samples/s",
        outcome.strategy, outcome.device, outcome.replicas, outcome.precision, outcome.samples_per_second,
    )  # fmt: skip
    accelerator, count = accelerator_used(outcome.strategy, outcome.device, outcome.replicas)
    trained = TrainedModel(
        artifact=FlyteFile(str(artifact)),
        framework="tensorflow",
        device=outcome.device,
        world_size=outcome.replicas,
        backend="xla",
        precision=outcome.precision,
        strategy=outcome.strategy,
        accelerator=accelerator,
        accelerator_count=count,
        history=outcome.history,
        samples_per_second=outcome.samples_per_second,
        train_seconds=outcome.train_seconds,
        tensorboard=FlyteDirectory(str(board)),
    )
    training_deck(trained, sampler.samples)
    return trained


# No requests/limits here: the pod template carries cpu, memory and google.com/tpu together.
@task(
    container_image=TPU_IMAGE,
    **TRAIN_TPU.attempts.task_options(),
    **DECKS,
    accelerator=TRAIN_TPU.accelerator,
    pod_template=TRAIN_TPU.pod_template(),
)
def train_tf_tpu(
    prepared: PreparedData,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    weight_decay: float,
    grad_accum_steps: int,
    hidden_sizes: list[int],
    dropout: float,
    seed: int,
    precision: str,
    tf_strategy: str,
    checkpoint_every_steps: int = 0,
) -> TrainedModel:
    hyperparameters = {k: v for k, v in locals().items() if k not in ("prepared", "tf_strategy")}
    return train_tensorflow(prepared, TrainConfig(**hyperparameters), tf_strategy, TRAIN_TPU.attempts)


@task(
    container_image=TF_GPU_IMAGE,
    **TRAIN_GPU.attempts.task_options(),
    **DECKS,
    **guaranteed(TRAIN_GPU),
    accelerator=TRAIN_GPU.accelerator,
    shared_memory=TRAIN_GPU.shared_memory,
    pod_template=TRAIN_GPU.pod_template(),
)
def train_tf_gpu(
    prepared: PreparedData,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    weight_decay: float,
    grad_accum_steps: int,
    hidden_sizes: list[int],
    dropout: float,
    seed: int,
    precision: str,
    tf_strategy: str,
    checkpoint_every_steps: int = 0,
) -> TrainedModel:
    hyperparameters = {k: v for k, v in locals().items() if k not in ("prepared", "tf_strategy")}
    return train_tensorflow(prepared, TrainConfig(**hyperparameters), tf_strategy, TRAIN_GPU.attempts)
