"""Non-finite outputs are never an answer: a row whose logits overflow gets NaN in every probability
column from `predict_proba` (`finite_rows` says which rows have an answer), and `predict` and
`predict_codes` refuse the table naming those rows, rather than answer a class."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.core.bundle.loading import finite_rows, load_bundle
from tasks.core.bundle.manifest import BundleRecord
from tasks.core.bundle.table_input import BundleError
from tasks.core.bundle.writing import write_bundle
from tasks.core.data.scaling import ScalerStats
from tasks.core.models.plugins import build, input_spec_for, mlp_spec
from tasks.core.training.config import TrainConfig
from tasks.core.training.records import Hardware, TrainingRun
from tests.conftest import blobs_frame
from tests.unit.bundle.encodings import numeric_encoding
from tests.unit.publish.test_publish import CLASSES, FEATURES, no_exports

WEIGHT_SCALE = 1e6  # logits of order 1e12 for standardised rows; beyond float32 for a row of 1e30
HUGE = 1e30  # finite in float32 once standardised, so the input checks let it through


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory):
    """A bundle of an MLP whose weights are scaled up: finite logits for ordinary rows, infinite for a
    row holding a huge value."""
    import torch

    from tasks.core.models.torch_models import save_torch_artifact

    spec = mlp_spec([16])
    torch.manual_seed(0)
    model = build(spec, len(FEATURES), len(CLASSES), "pytorch")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(WEIGHT_SCALE)
    root = tmp_path_factory.mktemp("overflow")
    save_torch_artifact(
        model, spec, input_spec_for(spec, len(FEATURES), len(CLASSES)), str(root / "model.pt")
    )
    run = TrainingRun(
        "pytorch", "cpu", "cpu", 1, "gloo", "fp32", "single-process", [], 0.0, 0.0, TrainConfig(model=spec)
    )
    record = BundleRecord(
        framework="pytorch", feature_names=FEATURES, scaler=ScalerStats([0.0] * 4, [1.0] * 4),
        class_labels=CLASSES, label_kind="string", label_column="species", source="blobs.parquet",
        data_fingerprint="0" * 32, run=run, billed=Hardware("cpu", 1),
    )  # fmt: skip
    with no_exports():
        return load_bundle(write_bundle(str(root / "bundle"), str(root / "model.pt"), record))


def rows_with_huge_values(rows: list[int]):
    frame = blobs_frame(n_rows=12)[FEATURES].reset_index(drop=True)
    for row in rows:
        frame.loc[row, FEATURES] = [HUGE, -HUGE, HUGE, -HUGE]
    return frame


@pytest.mark.parametrize(
    "rows, words",
    [
        ([4], "for a row, at row 104; no class is an answer for them"),
        ([1, 3], "for 2 rows, at rows 101, 103; no class is an answer for them"),
    ],
)
def test_rows_whose_outputs_overflow_get_no_answer(overflowing, rows, words):
    table = rows_with_huge_values(rows)
    probabilities = overflowing.predict_proba(table, first_row=100)
    answered = finite_rows(probabilities)
    assert answered.tolist() == [row not in rows for row in range(len(table))]
    assert np.isnan(probabilities[~answered]).all(), "every class of an unanswered row is NaN"
    np.testing.assert_allclose(probabilities[answered].sum(axis=1), 1.0, rtol=1e-5)
    for predict in (overflowing.predict, overflowing.predict_codes):
        with pytest.raises(BundleError) as error:
            predict(table, source="new.parquet", first_row=100)
        message = str(error.value)
        assert message.startswith("new.parquet: the model's outputs are not finite") and words in message


def test_rows_that_do_not_overflow_are_answered(overflowing):
    table = rows_with_huge_values([])
    assert finite_rows(overflowing.predict_proba(table)).all()
    assert set(overflowing.predict(table)) <= set(CLASSES)


@pytest.mark.slow  # writes model exports: seconds
@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_the_exports_label_is_empty_where_the_outputs_are_not_finite(tmp_path, framework):
    """As the bundle gives no answer for such a row, the exports' "label" gives none: an empty string."""
    import onnxruntime

    from tasks.core.bundle.export_plan import ExportDescription
    from tasks.core.bundle.exports import export_model

    model = build(mlp_spec([16]), len(FEATURES), len(CLASSES), framework)
    if framework == "pytorch":
        import torch

        with torch.no_grad():
            for parameter in model.parameters():
                parameter.mul_(WEIGHT_SCALE)
    else:
        model.set_weights([weights * WEIGHT_SCALE for weights in model.get_weights()])
    description = ExportDescription(FEATURES, "species", CLASSES, 2)
    scaler = ScalerStats([0.0] * 4, [1.0] * 4)
    result = export_model(
        model, framework, scaler, str(tmp_path), numeric_encoding(FEATURES), description=description
    )
    assert "onnx" in result.files, result.notes
    rows = rows_with_huge_values([1, 3]).to_numpy(np.float64)
    session = onnxruntime.InferenceSession(str(tmp_path / result.files["onnx"]))
    labels, probabilities = session.run(["label", "probabilities"], {"features": rows})
    unanswered = ~np.isfinite(probabilities).all(axis=1)
    assert unanswered.tolist() == [i in (1, 3) for i in range(len(rows))]
    assert [str(label) for label in labels[unanswered]] == ["", ""]
    assert all(str(label) in CLASSES for label in labels[~unanswered])
    if framework == "tensorflow":
        import tensorflow as tf

        serve = tf.saved_model.load(str(tmp_path / result.files["saved_model"])).signatures["serve"]
        saved = serve(tf.constant(rows))["label"].numpy()
        assert [label.decode() for label in saved[unanswered]] == ["", ""]
