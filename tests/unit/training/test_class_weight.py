"""Class weighting (`TrainConfig.class_weight`): the weights from the train split's counts, both loops
training with them, and the torch loss keeping a step's gradient whatever its micro-batch split."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import fsspec
import numpy as np
import pandas as pd
import pytest
import torch

from tasks.core.data.assignment import SplitConfig
from tasks.core.data.prepare import prepare_dataset
from tasks.core.data.splits import read_split
from tasks.core.messages import InputError
from tasks.core.models.plugins import mlp_spec
from tasks.core.training import torch_step, torch_training
from tasks.core.training.config import TrainConfig, class_weights, describe_class_weights
from tasks.core.training.torch_ddp import DistributedContext

pytestmark = pytest.mark.usefixtures("single_process")

# Few epochs of a small network: long enough that the unweighted loop has learnt to answer the majority.
COMMON = dict(epochs=4, batch_size=64, learning_rate=3e-3, model=mlp_spec([16], 0.0), seed=0)


@pytest.fixture(scope="module")
def imbalanced_splits(tmp_path_factory):
    """95:5 classes, overlapping: a loop that weighs rows alike answers the majority near the border."""
    rng = np.random.default_rng(0)
    labels = (rng.random(3000) < 0.05).astype(int)
    features = rng.normal(size=(3000, 2)) + np.array([[1.2, 1.2]]) * labels[:, None]
    frame = pd.DataFrame(features, columns=["a", "b"]).assign(label=np.array(["common", "rare"])[labels])
    root = tmp_path_factory.mktemp("imbalanced")
    frame.to_parquet(root / "data.parquet", index=False)
    prepared = prepare_dataset(str(root / "data.parquet"), "label", str(root / "out"), SplitConfig())
    return prepared.split_paths()


def rare_recall(predict, splits) -> float:
    features, labels = read_split(splits.val, splits.feature_names, splits.label_column)
    rare = labels == 1
    return float((predict(features)[rare] == 1).mean())


def torch_predict(model):
    return lambda features: model(torch.from_numpy(features)).argmax(1).numpy()


def test_balanced_weights_are_scikit_learns():
    from sklearn.utils.class_weight import compute_class_weight

    labels = np.array([0] * 95 + [1] * 5 + [2] * 20)
    expected = compute_class_weight("balanced", classes=np.arange(3), y=labels)
    weights = class_weights("balanced", np.bincount(labels))
    np.testing.assert_allclose(weights, expected)
    assert weights @ np.bincount(labels) == pytest.approx(len(labels))  # the weighted rows sum to the rows
    assert class_weights("none", np.bincount(labels)) is None


def test_a_class_without_train_rows_weighs_nothing():
    np.testing.assert_allclose(class_weights("balanced", np.array([3, 0, 1])), [4 / 9, 0.0, 4 / 3])


def test_the_weighting_is_described():
    assert describe_class_weights(None) == "class weights: none"
    line = describe_class_weights(np.array([0.5, 10.0]), ["common", "rare"])
    assert line == "class weights balanced: 0.5 ('common'), 10 ('rare')"
    assert (
        describe_class_weights(np.array([0.526, 10.0]))
        == "class weights balanced: 0.526 (class 0), 10 (class 1)"
    )


@pytest.mark.parametrize("value", ["Balanced", "inverse", ""])
def test_other_values_are_refused_naming_the_field(value):
    assert TrainConfig(class_weight=value).problems() == {"class_weight": "not one of none, balanced"}
    with pytest.raises(InputError, match=r"hyperparameters\.class_weight' = .*not one of none, balanced"):
        TrainConfig.from_json(json.dumps({"class_weight": value}))
    assert TrainConfig.from_json('{"class_weight": "balanced"}').class_weight == "balanced"


def test_the_weighted_loss_divides_by_the_rows_so_micro_batches_add_up():
    generator = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(12, 3, generator=generator), torch.tensor([0] * 8 + [1] * 3 + [2])
    weights = torch.tensor([0.5, 1.3, 4.0])
    whole = torch_step.mean_loss(logits, labels, weights)
    parts = sum(
        torch_step.mean_loss(logits[i : i + 4], labels[i : i + 4], weights) * 4 / 12 for i in (0, 4, 8)
    )
    torch.testing.assert_close(whole, parts)
    rows = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    torch.testing.assert_close(whole, (rows * weights[labels]).sum() / 12)
    torch.testing.assert_close(torch_step.mean_loss(logits, labels, None), rows.mean())


def test_torch_weighted_gradient_accumulation_matches_the_full_batch(imbalanced_splits):
    full = torch_training.train(TrainConfig(**COMMON, class_weight="balanced"), imbalanced_splits)
    accumulated = torch_training.train(
        TrainConfig(**COMMON, class_weight="balanced", grad_accum_steps=4), imbalanced_splits
    )
    for a, b in zip(full.model.parameters(), accumulated.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_torch_balanced_weights_raise_the_rare_class_recall(imbalanced_splits):
    plain = torch_training.train(TrainConfig(**COMMON), imbalanced_splits)
    weighted = torch_training.train(TrainConfig(**COMMON, class_weight="balanced"), imbalanced_splits)
    with torch.no_grad():
        before = rare_recall(torch_predict(plain.model.eval()), imbalanced_splits)
        after = rare_recall(torch_predict(weighted.model.eval()), imbalanced_splits)
    assert after >= before + 0.3, (before, after)


@pytest.mark.slow  # TensorFlow's start and a Keras fit: seconds
def test_keras_balanced_weights_raise_the_rare_class_recall(imbalanced_splits):
    from tasks.core.bundle.loading import keras_logits
    from tasks.core.training.tf_strategy import Environment
    from tasks.core.training.tf_training import train_keras

    plain = train_keras(TrainConfig(**COMMON), imbalanced_splits, env=Environment())
    weighted = train_keras(
        TrainConfig(**COMMON, class_weight="balanced"), imbalanced_splits, env=Environment()
    )
    before = rare_recall(
        lambda features: keras_logits(plain.model, features).argmax(axis=1), imbalanced_splits
    )
    after = rare_recall(
        lambda features: keras_logits(weighted.model, features).argmax(axis=1), imbalanced_splits
    )
    assert after >= before + 0.3, (before, after)
    # Accuracy stays unweighted (the loss alone takes the sample weights): the share of val rows right.
    features, labels = read_split(imbalanced_splits.val, imbalanced_splits.feature_names, "label")
    kept = weighted.run.history[weighted.run.kept_epoch - 1]
    assert kept.val_accuracy == pytest.approx(
        (keras_logits(weighted.model, features).argmax(axis=1) == labels).mean()
    )


def test_the_weights_read_a_train_split_in_object_storage_through_the_runs_filesystem(imbalanced_splits):
    """A DDP worker reads the splits where the run stored them; the class weights' read goes through
    fsspec as the rows' do (memory:// exists for fsspec only), so a store's settings reach it."""
    memory = fsspec.filesystem("memory")
    train = Path(imbalanced_splits.train)  # a part file of the split's folder
    memory.put_file(str(train), f"memory://run/train/{train.name}")
    stored = replace(imbalanced_splits, train=f"memory://run/train/{train.name}")
    ctx = DistributedContext(rank=0, world_size=1, device=torch.device("cpu"), backend="none")
    config = TrainConfig(**COMMON, class_weight="balanced")
    local = torch_training.loss_weights(config, imbalanced_splits, ctx)
    torch.testing.assert_close(torch_training.loss_weights(config, stored, ctx), local, rtol=0, atol=0)
    assert local[1] > 5 * local[0]  # the rare class weighs more
