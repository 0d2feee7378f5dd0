from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks.core.evaluation.metrics import classification_metrics
from tasks.core.models.plugins import InputSpec
from tasks.core.models.torch_models import build_mlp, load_torch_artifact, mlp, predict


def test_mlp_shape_follows_config():
    model = build_mlp(n_features=7, n_classes=4, hidden_sizes=[16, 8, 5], dropout=0.0)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(7, 16), (16, 8), (8, 5), (5, 4)]
    assert model(torch.zeros(3, 7)).shape == (3, 4)


@pytest.mark.parametrize(
    "options, match",
    [({"hidden_sizes": [0.0]}, "hidden_sizes"), ({"dropout": 1.0}, "dropout"), ({"width": 3.0}, "unknown")],
)
def test_the_mlp_builder_refuses_bad_options_by_name(options, match):
    with pytest.raises(ValueError, match=match):
        mlp(InputSpec(3, 2), options)


def test_torch_artifact_refuses_pickled_objects(tmp_path):
    path = str(tmp_path / "evil.pt")
    torch.save({"model": object(), "input": {}, "state_dict": {}}, path)
    with pytest.raises(Exception, match="[Ww]eights only"):
        load_torch_artifact(path)


def test_predict_in_batches_matches_one_pass():
    torch.manual_seed(1)
    model = build_mlp(n_features=5, n_classes=3, hidden_sizes=[8], dropout=0.2).eval()
    features = np.random.default_rng(0).normal(size=(50, 5)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(features)).argmax(1).numpy()
    np.testing.assert_array_equal(predict(model, features, batch_size=7), expected)


def test_classification_metrics():
    y_true = np.array([0, 0, 0, 1, 1, 2])
    y_pred = np.array([0, 0, 1, 1, 1, 1])
    metrics = classification_metrics(y_true, y_pred, ["a", "b", "c"])
    assert metrics.accuracy == pytest.approx(4 / 6)
    # per-class F1: a = 0.8, b = 2*0.5*1/(1.5) = 0.667, c = 0
    assert metrics.macro_f1 == pytest.approx((0.8 + 2 / 3 + 0.0) / 3)
    assert metrics.confusion_matrix == [[2, 1, 0], [0, 2, 0], [0, 1, 0]]
    assert [(c.label, c.support, c.predicted) for c in metrics.per_class] == [
        ("a", 3, 2),
        ("b", 2, 4),
        ("c", 1, 0),
    ]
    assert metrics.n_test == 6
