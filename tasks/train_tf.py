"""TensorFlow training: on a TPU slice (TPUStrategy) or on GPUs (MirroredStrategy).

Both tasks share one body; they differ in the hardware they ask for and check. Locally they run on
CPU with the default strategy and report that they did. On a cluster each first checks that its
accelerator is usable and otherwise fails, naming it, before it reads any data.
"""

from __future__ import annotations

import logging
from pathlib import Path

from flytekit import current_context, task
from flytekit.types.directory import FlyteDirectory
from flytekit.types.file import FlyteFile

import tasks.literal_types  # noqa: F401 - each boundary dataclass's Flyte type built once, before the tasks below
from tasks.checkpointing import flyte_checkpoint
from tasks.core.accelerators import on_flyte_cluster
from tasks.core.config import Hardware, TrainConfig, TrainingRun
from tasks.core.preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionNotice
from tasks.core.telemetry import UtilisationSampler
from tasks.core.tf_strategy import require_gpus, require_tpu, set_pjrt_defaults, tpu_target_strategy
from tasks.decks import DECKS, training_deck
from tasks.hardware import TF_GPU_IMAGE, TPU_IMAGE, TRAIN_GPU, TRAIN_TPU, Attempts, guaranteed
from tasks.logs import setup_logging
from tasks.types import PreparedData, TrainedModel

log = logging.getLogger(__name__)

# The declared hardware, in the words of a refusal on a cluster.
DECLARED_TPU = (
    f"a TPU {TRAIN_TPU.generation} {TRAIN_TPU.topology} slice ({TRAIN_TPU.chips} chips, "
    f"{TRAIN_TPU.gke_accelerator})"
)
DECLARED_GPUS = f"{TRAIN_GPU.gpus_per_node} x {TRAIN_GPU.device} GPU"


def declared_hardware(run: TrainingRun) -> Hardware:
    """What the task declares: the TPU slice's chips, the GPUs, or CPU replicas on a laptop."""
    if run.strategy == "tpu":
        return Hardware(TRAIN_TPU.gke_accelerator, TRAIN_TPU.chips, TRAIN_TPU.topology)
    if run.device != "cpu":
        return Hardware(TRAIN_GPU.device, run.world_size)
    return Hardware("cpu", 1)


def train_tensorflow(
    prepared: PreparedData, config: TrainConfig, attempts: Attempts, strategy: str
) -> TrainedModel:
    from tasks.core.tf_training import KerasRunOptions, train_keras

    splits = prepared.local_splits()
    artifact = Path(current_context().working_directory) / "model.npz"
    checkpoint = flyte_checkpoint()
    board = Path(current_context().working_directory) / "tensorboard"
    with UtilisationSampler() as sampler, PreemptionNotice(attempts.preemption_grace_s) as notice:
        try:
            options = KerasRunOptions(
                checkpoint_dir=str(checkpoint.directory) if checkpoint else None,
                on_checkpoint=checkpoint.on_save if checkpoint else None, log_dir=str(board),
                preemption=notice,
            )  # fmt: skip
            outcome = train_keras(config, splits, str(artifact), strategy=strategy, options=options)
        except Preempted:
            # A failed attempt that propeller retries as a system failure, as for the torch launcher.
            raise SystemExit(PREEMPTED_EXIT_CODE) from None
    run = outcome.run
    log.info(
        "trained with tf.distribute '%s' on %s, %d replicas, %s, %.0f samples/s",
        run.strategy, run.device, run.world_size, run.precision, run.samples_per_second,
    )  # fmt: skip
    trained = TrainedModel(
        artifact=FlyteFile(str(artifact)),
        run=run,
        declared=declared_hardware(run),
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
def train_tf_tpu(prepared: PreparedData, hyperparameters: TrainConfig) -> TrainedModel:
    setup_logging()
    on_cluster = on_flyte_cluster()
    strategy = tpu_target_strategy(hyperparameters.tf_strategy, on_cluster)
    set_pjrt_defaults()  # before TensorFlow is imported, which reads them once
    if on_cluster:
        require_tpu(DECLARED_TPU)
    return train_tensorflow(prepared, hyperparameters, TRAIN_TPU.attempts, strategy)


@task(
    container_image=TF_GPU_IMAGE,
    **TRAIN_GPU.attempts.task_options(),
    **DECKS,
    **guaranteed(TRAIN_GPU),
    accelerator=TRAIN_GPU.accelerator,
    shared_memory=TRAIN_GPU.shared_memory,
    pod_template=TRAIN_GPU.pod_template(),
)
def train_tf_gpu(prepared: PreparedData, hyperparameters: TrainConfig) -> TrainedModel:
    setup_logging()
    if on_flyte_cluster():
        require_gpus(DECLARED_GPUS, TRAIN_GPU.gpus_per_node)
    return train_tensorflow(prepared, hyperparameters, TRAIN_GPU.attempts, hyperparameters.tf_strategy)
