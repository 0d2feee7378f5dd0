"""The Decks' parts: learning curves, the pages every Deck task leaves out, the TensorBoard event files
holding the logged scalars (the Decks of a local run, rendered: tests/integration/test_decks.py)."""

from __future__ import annotations

import sys

import pytest

pytestmark = pytest.mark.slow


def test_tensorboard_event_files_hold_the_scalars(tmp_path, blob_splits):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tasks.core.training.config import TrainConfig
    from tasks.core.training.torch_training import train

    outcome = train(TrainConfig(epochs=3, batch_size=32), blob_splits, log_dir=str(tmp_path / "board"))
    events = EventAccumulator(str(tmp_path / "board"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {
        "loss/train",
        "loss/val",
        "accuracy/train",
        "accuracy/val",
        "throughput/samples_per_second",
    } <= set(tags)
    logged = [event.value for event in events.Scalars("accuracy/val")]
    assert logged == pytest.approx([epoch.val_accuracy for epoch in outcome.run.history])


def test_one_epoch_gets_a_table_and_two_epochs_get_charts_too():
    from tasks.core.training.records import EpochMetrics
    from tasks.plumbing.decks import learning_curves

    epochs = [EpochMetrics(epoch=e, train_loss=1.0 / e, val_loss=1.1 / e, train_accuracy=0.5, val_accuracy=0.6)
              for e in (1, 2)]  # fmt: skip
    one, two = learning_curves(epochs[:1]), learning_curves(epochs)
    assert "<table" in one and "<svg" not in one, "one epoch is a point, not a curve"
    assert 'data-chart="loss"' in two and 'data-chart="accuracy"' in two and "<table" in two


NOTF = "tensorboard.compat.notf"


def test_tensorflow_free_switch_is_skipped_once_tensorflow_is_loaded(tmp_path):
    """In this process, where TensorFlow is loaded: the switch leaves TensorBoard's TensorFlow I/O in
    place, so Keras's callback and `tf.summary` still write."""
    import keras
    import tensorflow as tf

    from tasks.core.models.torch_startup import tensorboard_without_tensorflow

    saved = sys.modules.pop(NOTF, None)
    try:
        tensorboard_without_tensorflow()
        switched = NOTF in sys.modules
    finally:  # a wrong switch would stop this process's later TensorFlow summaries
        sys.modules.pop(NOTF, None)
        if saved is not None:
            sys.modules[NOTF] = saved
    assert not switched
    keras.callbacks.TensorBoard(str(tmp_path))
    with tf.summary.create_file_writer(str(tmp_path)).as_default():
        assert tf.summary.scalar("x", 1.0, step=0)


def test_every_deck_task_skips_the_pip_dependencies_page():
    from flytekit.deck import DeckField

    from tasks.compare import compare
    from tasks.evaluate import evaluate
    from tasks.preprocess import preprocess
    from tasks.right_sizing import train_on_target
    from tasks.train_tf import train_tf_gpu, train_tf_tpu
    from tasks.train_torch import train_torch, train_torch_multinode

    for task in (compare, evaluate, train_on_target, preprocess, train_tf_gpu, train_tf_tpu, train_torch,
                 train_torch_multinode):  # fmt: skip
        assert task.enable_deck, task.name
        assert DeckField.DEPENDENCIES not in task.deck_fields, task.name
        assert {DeckField.TIMELINE, DeckField.INPUT, DeckField.OUTPUT} <= set(task.deck_fields), task.name
