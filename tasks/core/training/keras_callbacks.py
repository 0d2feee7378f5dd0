"""The Keras loop's callbacks: the clock, checkpoints and the kept weights, a stop on divergence, the
preemption notice heeded, TensorBoard."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np

from tasks.core.models.plugins import TrainingDiverged
from tasks.core.training.preemption import PreemptionNotice
from tasks.core.training.progress import EpochChoice, TrainingProgress, log_epoch
from tasks.core.training.records import EpochMetrics

log = logging.getLogger(__name__)


STATE_FILE = "training_state.json"


class TrainClock(keras.callbacks.Callback):
    """Seconds spent in training steps, without validation or checkpointing."""

    def __init__(self):
        super().__init__()
        self.seconds, self._start = 0.0, None

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_test_begin(self, logs=None):  # validation starts: this epoch's training is done
        if self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self._start = None


def batches_done(progress: TrainingProgress, steps_per_epoch: int) -> int:
    return progress.epoch * steps_per_epoch + progress.step


def random_states(model: keras.Model) -> list:
    """The variables `save_weights` leaves out: the seed generators' states (dropout's), without
    which a resumed run would draw other dropout masks than the uninterrupted one."""
    weights = {id(variable) for variable in model.weights}
    return [variable for variable in model.variables if id(variable) not in weights]


def write_checkpoint(
    model: keras.Model, directory: Path, progress: TrainingProgress, best: BestWeights | None = None
) -> None:
    """Weights (model and optimizer) and the best epoch's copy under names of their own, then the
    progress naming them: replacing the state file is the one step that commits a save, so a kill at
    any point leaves the previous checkpoint whole."""
    weights = f"epoch{progress.epoch}-step{progress.step}.weights.h5"
    model.save_weights(str(directory / weights))
    best_file = best.write(directory) if best is not None else None
    pending = directory / f"{STATE_FILE}.partial"
    seeds = [variable.numpy().tolist() for variable in random_states(model)]
    saved = {**progress.to_dict(), "weights": weights, "best_weights": best_file, "random_states": seeds}
    pending.write_text(json.dumps(saved))
    os.replace(pending, directory / STATE_FILE)
    for stale in (*directory.glob("*.weights.h5"), *directory.glob(f"*{BestWeights.SUFFIX}")):
        if stale.name not in (weights, best_file):
            stale.unlink()


@dataclass
class BestWeights:
    """A copy of the model's weights (`get_weights`: no optimizer state) at the best `epoch` so far."""

    epoch: int
    arrays: list[np.ndarray]
    SUFFIX = ".best.npz"

    @property
    def file_name(self) -> str:
        return f"epoch{self.epoch}{self.SUFFIX}"

    def write(self, directory: Path) -> str:
        """Writes the copy once per best epoch (a later save of the same best keeps the file)."""
        path = directory / self.file_name
        if not path.exists():
            pending = directory / f"{self.file_name}.partial"
            with pending.open("wb") as file:
                np.savez(file, *self.arrays)
            os.replace(pending, path)
        return self.file_name

    @classmethod
    def read(cls, directory: Path, name: str) -> BestWeights:
        with np.load(directory / name) as saved:
            arrays = [saved[f"arr_{index}"] for index in range(len(saved.files))]
        return cls(int(name.removeprefix("epoch").removesuffix(cls.SUFFIX)), arrays)


class Checkpointing(keras.callbacks.Callback):
    """Tracks the run's `TrainingProgress` across attempts and logs each epoch's line. Keeps a copy of
    the best epoch's weights as `choice` says (`best`). With a directory, saves the progress with the
    weights and that copy after every epoch, every `every_steps` batches and on the preemption notice,
    and hands the directory to `on_save` after each save.

    Ours rather than keras.callbacks.BackupAndRestore, which restores only the epoch (a mid-epoch
    backup re-trains the whole epoch) and, after a resume, records epoch 0 for a mid-epoch save made
    before the resumed run's first epoch end.
    """

    def __init__(self, directory: str | None, every_steps: int, steps_per_epoch: int,
                 on_save: Callable[[str], None] | None, preemption: PreemptionNotice | None,
                 choice: EpochChoice, regression: bool = False):  # fmt: skip
        super().__init__()
        self.regression = regression
        self.choice = choice
        self.best: BestWeights | None = None
        self.directory = Path(directory) if directory else None
        self.every_steps, self.steps_per_epoch = every_steps, steps_per_epoch
        self.on_save, self.preemption = on_save, preemption
        self.progress = TrainingProgress()
        self.first_step = self.saved_step = 0
        self.val_rows = 0  # the rows the validation metrics are measured on, as the epochs record them
        if self.directory:
            self.directory.mkdir(parents=True, exist_ok=True)

    def restore(self, model: keras.Model) -> TrainingProgress:
        """Loads the saved weights into the compiled `model`; returns the progress to resume from."""
        path = self.directory / STATE_FILE if self.directory else None
        if path is None or not path.exists():
            return self.progress
        saved = json.loads(path.read_text())
        model.optimizer.build(model.trainable_variables)  # so that load_weights restores its variables
        model.load_weights(str(self.directory / saved["weights"]))
        for variable, value in zip(random_states(model), saved["random_states"], strict=True):
            variable.assign(value)
        if saved.get("best_weights"):
            self.best = BestWeights.read(self.directory, saved["best_weights"])
        self.progress = TrainingProgress.from_dict(saved)
        log.info("resuming from checkpoint: epoch %d, step %d", self.progress.epoch + 1, self.progress.step)
        return self.progress

    def on_epoch_begin(self, epoch, logs=None):
        self.first_step = self.saved_step = self.progress.step  # > 0 in an epoch resumed mid-way

    def step_after(self, batch: int) -> int:
        """The epoch's batches done once `batch` ends: `batch` counts from this fit's first batch and,
        under steps_per_execution, is the last of several."""
        return min(self.first_step + batch + 1, self.steps_per_epoch)

    def on_train_batch_end(self, batch, logs=None):
        self.progress.step = self.step_after(batch)
        if self.progress.step == self.steps_per_epoch:
            return  # the epoch end saves, with the validation metrics
        if self.preemption is not None and self.preemption.received:
            self.stop()
        if self.every_steps and self.progress.step - self.saved_step >= self.every_steps:
            self.save()

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        keys = ("loss", "accuracy", "val_loss", "val_accuracy")
        # A regression has no accuracy: 0, as the torch loop counts it.
        metrics = EpochMetrics(
            epoch + 1,
            *(float(logs.get(key, 0.0 if "accuracy" in key else np.nan)) for key in keys),
            val_rows=self.val_rows,
        )
        self.progress.finish_epoch(metrics)
        if self.choice.keeps_copy(self.progress.history):
            self.best = BestWeights(metrics.epoch, self.model.get_weights())
        self.save()
        log_epoch(metrics, self.choice.epochs, self.regression)

    def take_kept_weights(self, model: keras.Model) -> None:
        """The best epoch's weights back in `model` where a later epoch ended the run."""
        if self.choice.restores_copy(self.progress.history):
            model.set_weights(self.best.arrays)

    def save(self) -> None:
        if self.directory is None:
            return
        write_checkpoint(self.model, self.directory, self.progress, self.best)
        self.saved_step = self.progress.step
        if self.on_save:
            self.on_save(str(self.directory))

    def stop(self) -> None:
        """Saves the step reached and raises out of `fit` (after `stop_training`, Keras would still
        validate the partial epoch and end it as if complete)."""
        if self.directory is None:
            log.warning("the preemption notice came with no checkpoint directory: stopping without a save")
        self.save()
        raise self.preemption.stopped(self.progress.epoch, self.progress.step)


class StopOnDivergence(keras.callbacks.Callback):
    """Raises `TrainingDiverged` at the first batch whose loss is not finite. Listed before the
    tracker (`train_keras`), so no checkpoint of the diverged model is saved. (Keras's own
    TerminateOnNaN ends training quietly, and the run would be reported as a result.)"""

    def __init__(self, tracker: Checkpointing, learning_rate: float):
        super().__init__()
        self.tracker, self.learning_rate = tracker, learning_rate

    def on_train_batch_end(self, batch, logs=None):
        loss = float((logs or {}).get("loss", 0.0))
        if not math.isfinite(loss):
            step = self.tracker.step_after(batch)
            raise TrainingDiverged.at(self.tracker.progress.epoch + 1, step, loss, self.learning_rate)


def notice_to_heed(preemption: PreemptionNotice | None, strategy_kind: str) -> PreemptionNotice | None:
    """MultiWorkerMirroredStrategy workers would have to agree to stop; one stopping alone hangs the rest."""
    if preemption is not None and strategy_kind == "multi_worker":
        log.warning(
            "the preemption notice is not acted on under MultiWorkerMirroredStrategy; "
            "checkpoints are saved on the usual schedule"
        )
        return None
    return preemption


def board(log_dir: str | None) -> list[keras.callbacks.Callback]:
    """TensorBoard scalars per epoch (loss and accuracy for train and validation)."""
    return [keras.callbacks.TensorBoard(log_dir, update_freq="epoch", write_graph=False)] if log_dir else []
