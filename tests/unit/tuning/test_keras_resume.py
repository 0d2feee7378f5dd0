"""The Keras twin of tests/unit/tuning/test_resume.py: a trial stopped at a rung (`train_until_epoch`) and
resumed from its checkpoint ends exactly where the unbroken run does, its learning rate scheduled over the
whole budget from the start."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tasks.core.models.plugins import mlp_spec
from tasks.core.training.config import TrainConfig
from tasks.core.training.tf_strategy import Environment
from tasks.core.training.tf_training import KerasRunOptions, train_keras

pytestmark = pytest.mark.slow
# Dropout, so that the resumed run must restore the seed generators too; cosine over all 3 epochs.
CONFIG = TrainConfig(epochs=3, batch_size=32, seed=7, model=mlp_spec([16], 0.2))


def test_a_keras_trial_resumed_rung_after_rung_equals_it_trained_without_the_breaks(blob_splits, tmp_path):
    whole = train_keras(CONFIG, blob_splits, env=Environment())
    options = KerasRunOptions(checkpoint_dir=str(tmp_path / "trial"))
    rung = train_keras(replace(CONFIG, train_until_epoch=1), blob_splits, env=Environment(), options=options)
    assert [epoch.epoch for epoch in rung.run.history] == [1]
    # The rung trained one epoch's steps of the three; the rest is the resumed run's.
    assert rung.model.optimizer.iterations.numpy() * 3 == whole.model.optimizer.iterations.numpy()
    resumed = train_keras(
        replace(CONFIG, train_until_epoch=3), blob_splits, env=Environment(), options=options
    )
    assert resumed.run.history == whole.run.history
    assert resumed.model.optimizer.iterations.numpy() == whole.model.optimizer.iterations.numpy()
    for mine, theirs in zip(resumed.model.get_weights(), whole.model.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)
