"""A table of text, booleans, dates and gaps trained on a TensorFlow target: the Keras loop reads the
encoded splits, and the bundle scores the raw test rows exactly as the Keras model scores the rows
preprocessing encoded (issue 44: both frameworks)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from tasks.core.bundle.loading import load_bundle
from tasks.core.bundle.manifest import BundleRecord
from tasks.core.bundle.writing import write_bundle
from tasks.core.data.assignment import SplitConfig
from tasks.core.data.prepare import prepare_dataset
from tasks.core.data.scaling import standardise
from tasks.core.evaluation.split_metrics import split_metrics
from tasks.core.training.config import TrainConfig
from tasks.core.training.records import Hardware
from tests.unit.data.tables import messy_frame


@pytest.mark.slow
def test_a_messy_table_trains_under_keras_and_its_bundle_scores_raw_rows_as_the_model_does(tmp_path):
    from tasks.core.bundle.loading import keras_logits
    from tasks.core.training.tf_strategy import Environment
    from tasks.core.training.tf_training import train_keras

    source = tmp_path / "messy.parquet"
    messy_frame(csv=False).to_parquet(source, index=False)
    before = source.read_bytes()
    prepared = prepare_dataset(str(source), "species", str(tmp_path / "prepared"), SplitConfig(seed=0))
    config = TrainConfig(epochs=6, batch_size=16, learning_rate=1e-2, seed=1)
    artifact = str(tmp_path / "model.npz")
    outcome = train_keras(config, prepared.split_paths(), artifact, env=Environment())
    record = BundleRecord.of(prepared.table, outcome.run, Hardware("cpu", 1), "0" * 32)
    bundle = load_bundle(write_bundle(str(tmp_path / "bundle"), artifact, record))

    test = pq.read_table(prepared.paths["test"])
    assert "colour" in test.column_names and "string" in str(test.schema.field("colour").type)
    encoded = prepared.table.fitted_encoding().transform(test)
    expected = keras_logits(outcome.model, standardise(encoded, prepared.table.scaler)).argmax(axis=1)
    labels = np.asarray(prepared.table.class_labels)
    assert np.array_equal(bundle.predict(test), labels[expected])
    metrics = split_metrics(bundle, prepared.paths["test"], "species", prepared.table.class_labels)
    codes = test.column("species").to_numpy()  # the raw split holds the class codes
    assert metrics.accuracy == pytest.approx(float((expected == codes).mean()))
    assert metrics.accuracy >= 0.8  # the blobs' features carry the classes
    assert source.read_bytes() == before
