"""The epoch a run keeps on a small validation split: each epoch ranked by its metric averaged over the last
few epochs, as many as the split's rows ask for, and the reason naming the rows it was chosen on."""

from __future__ import annotations

import math
import random

import pyarrow.parquet as pq
import pytest

from tasks.core.models.plugins import mlp_spec
from tasks.core.training.config import TrainConfig
from tasks.core.training.progress import EpochChoice, TrainingProgress, smoothing_window
from tasks.core.training.records import EpochMetrics
from tasks.core.training.torch_training import train


def history(values: list[float], rows: int, metric: str = "val_loss") -> list[EpochMetrics]:
    """Epochs whose `metric` follows `values`, measured on `rows` validation rows."""
    epochs = []
    for epoch, value in enumerate(values, start=1):
        loss, accuracy = (value, 0.5) if metric == "val_loss" else (1.0, value)
        epochs.append(EpochMetrics(epoch, 1.0, 0.5, loss, accuracy, rows))
    return epochs


# A 30-epoch run on scikit-learn's breast cancer table (86 validation rows, seed 0): epoch 4's loss is the
# lowest by a hair, one row's worth, while the model still moved at a high rate; the last epochs are
# steady. Epoch 4 scored 0.907 on the test split, epochs 21-30 0.953.
BREAST_CANCER = [0.1201, 0.0299, 0.0163, 0.012, 0.0193, 0.0176, 0.0214, 0.0188, 0.0194, 0.0199, 0.0192,
                 0.0192, 0.0196, 0.0196, 0.0192, 0.0195, 0.0201, 0.0203, 0.0167, 0.0156, 0.0152, 0.0153,
                 0.0153, 0.0153, 0.0154, 0.0155, 0.0155, 0.0155, 0.0155, 0.0155]  # fmt: skip


@pytest.mark.parametrize(
    "rows, epochs, window",
    [(0, 30, 1), (200, 30, 1), (5_000, 30, 1), (199, 30, 2), (100, 30, 2), (86, 30, 3), (67, 30, 3),
     (61, 30, 4), (40, 30, 5), (10, 30, 5), (86, 10, 2), (86, 9, 1), (10, 3, 1)],
)  # fmt: skip
def test_the_window_grows_as_the_validation_rows_shrink_within_a_fifth_of_the_run(rows, epochs, window):
    assert smoothing_window(rows, epochs) == window


def test_a_small_split_keeps_a_steady_late_epoch_over_an_early_dip():
    small = EpochChoice(epochs=30).kept(history(BREAST_CANCER, 86))
    assert small == (
        23,
        "lowest 3-epoch mean val_loss 0.0153 (epochs 21-23) at epoch 23 of 30, over 86 validation rows",
    )
    # The same losses measured on enough rows: the single best epoch, as before.
    assert EpochChoice(epochs=30).kept(history(BREAST_CANCER, 1_200)) == (
        4,
        "best val_loss 0.0120 at epoch 4 of 30, over 1,200 validation rows",
    )
    # A run that recorded no rows (a Keras run) ranks each epoch by its own loss.
    assert EpochChoice(epochs=30).kept(history(BREAST_CANCER, 0)) == (
        4,
        "best val_loss 0.0120 at epoch 4 of 30",
    )


def test_a_small_split_still_keeps_the_first_epoch_of_a_run_that_overfits_from_the_start():
    rising = [0.50 + 0.01 * epoch for epoch in range(30)]
    assert EpochChoice(epochs=30).kept(history(rising, 60)) == (
        1,
        "lowest 4-epoch mean val_loss 0.5000 (epoch 1 alone) at epoch 1 of 30, over 60 validation rows",
    )


def test_accuracy_is_averaged_too_and_the_highest_mean_wins():
    accuracies = [0.6, 0.9, 1.0, 0.9, 0.9] + [0.95] * 15  # epoch 3's 1.0 alone is a fluke of 40 rows
    choice = EpochChoice(metric="val_accuracy", epochs=20)
    assert choice.best_epoch(history(accuracies, 1_000, "val_accuracy")) == 3
    epoch, reason = choice.kept(history(accuracies, 40, "val_accuracy"))
    assert epoch == 9 and reason.startswith(
        "highest 4-epoch mean val_accuracy 0.9500 (epochs 6-9) at epoch 9"
    )


def test_an_epoch_whose_window_holds_a_loss_that_is_not_finite_is_never_kept():
    losses = [0.9, 0.5, math.nan, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9]
    choice = EpochChoice(epochs=10)  # a window of 2 epochs
    finite = [math.isfinite(value) for value in choice.ranked_values(history(losses, 100))]
    assert finite == [True, True, False, False] + [True] * 6
    assert choice.best_epoch(history(losses, 100)) == 5  # (0.4 + 0.45) / 2
    assert choice.kept(history([math.nan] * 10, 100)) == (
        10,
        "the last epoch: no epoch had a finite val_loss, over 100 validation rows",
    )


def test_patience_counts_the_epochs_since_the_best_mean():
    losses = [0.9, 0.8, 0.1, 0.95, 0.9, 0.9]  # 3-epoch means: epoch 3's 0.6 is the lowest
    choice = EpochChoice(patience=3, epochs=20)
    assert not choice.stops_early(history(losses[:5], 80))
    assert choice.stops_early(history(losses[:6], 80))
    assert choice.kept(history(losses[:6], 80))[1] == (
        "lowest 3-epoch mean val_loss 0.6000 (epochs 1-3) at epoch 3 of 6, over 80 validation rows; "
        "early stopping after epoch 6 of 20: no better 3-epoch mean val_loss for 3 epochs"
    )


@pytest.mark.parametrize("rows", [20, 86, 150, 5_000])
@pytest.mark.parametrize("metric", ["val_loss", "val_accuracy"])
def test_the_copy_the_loop_takes_as_each_epoch_ends_is_the_epoch_kept_at_the_end(rows, metric):
    """The loops copy an epoch's weights aside when `keeps_copy` says it is the best so far, and take the
    copy back at the end where `restores_copy` says so: the weights handed back must be the kept epoch's,
    so an epoch's ranked value may not depend on later epochs."""
    generator = random.Random(rows)
    choice = EpochChoice(metric=metric, epochs=30)
    for _ in range(200):
        runs = history([generator.choice([0.2, 0.3, 0.5, math.nan, generator.random()]) for _ in range(30)],
                       rows, metric)  # fmt: skip
        copied = None
        for end in range(1, len(runs) + 1):
            if choice.keeps_copy(runs[:end]):
                copied = end
        handed_back = copied if choice.restores_copy(runs) else runs[-1].epoch
        assert handed_back == choice.kept(runs)[0]


def test_a_checkpoint_saved_before_epochs_recorded_their_rows_resumes():
    saved = {"epoch": 1, "step": 0, "history": [{"epoch": 1, "train_loss": 1.0, "train_accuracy": 0.5,
                                                 "val_loss": 0.9, "val_accuracy": 0.6}]}  # fmt: skip
    progress = TrainingProgress.from_dict(saved)
    assert progress.history[0].val_rows == 0
    assert TrainingProgress.from_dict(progress.to_dict()).history == progress.history


@pytest.mark.usefixtures("single_process")
def test_a_torch_run_records_the_validation_rows_and_names_them_in_its_reason(blob_splits):
    rows = pq.ParquetFile(blob_splits.val).metadata.num_rows
    config = TrainConfig(epochs=10, batch_size=32, model=mlp_spec([8]))
    run = train(config, blob_splits).run
    assert [epoch.val_rows for epoch in run.history] == [rows] * 10
    window = smoothing_window(rows, 10)
    assert window == 2  # the blobs' few validation rows ask for more; a fifth of 10 epochs allows 2
    assert run.kept_reason.startswith(f"lowest {window}-epoch mean val_loss ")
    assert run.kept_reason.endswith(f" of 10, over {rows} validation rows")
