"""A regression bundle on raw rows: `predict` answers in the label's units and type, `predict_proba` is
refused, and the ONNX file's "prediction" agrees with the bundle."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tasks.core.data.target import REGRESSION, Target
from tasks.core.models.plugins import InputSpec, build, input_spec_for, mlp_spec
from tasks.core.serving.bundle import BundleError, BundleRecord, load_bundle, write_bundle
from tasks.core.training.records import Hardware, TrainingRun
from tests.floats import FLOAT32_TOLERANCE, assert_float32_close
from tests.unit.serving.test_raw_row_exports import (
    WEIGHTS,
    client_feeds,
    onnx_session,
    prepared_table,
    scoring_rows,
    train_table,
)

pytestmark = pytest.mark.slow  # writes an ONNX export: seconds

TARGET = Target(REGRESSION, "problem_type='regression' was asked for", mean=250_000.0, std=40_000.0)


def regression_bundle(
    folder: Path, label_kind: str, framework: str = "pytorch", target: Target = TARGET
) -> str:
    """An untrained, seeded MLP with one output over the raw-row table's features, as a bundle."""
    table = replace(prepared_table(train_table()), class_labels=[], class_counts={}, target=target)
    table = replace(table, label_kind=label_kind)
    spec = mlp_spec([16])
    n_features = len(table.feature_names)
    artifact = str(folder.parent / f"{folder.name}-{WEIGHTS[framework]}")
    input_spec = input_spec_for(spec, n_features, 1)
    if framework == "pytorch":
        import torch

        from tasks.core.models.torch_models import save_torch_artifact

        torch.manual_seed(3)
        save_torch_artifact(build(spec, n_features, 1, framework), spec, input_spec, artifact)
    else:
        import keras

        from tasks.core.models.keras_models import save_keras_artifact

        keras.utils.set_random_seed(3)
        save_keras_artifact(build(spec, n_features, 1, framework), spec, input_spec, artifact)
    run = TrainingRun(framework, "cpu", 1, "gloo", "fp32", "single-process", [], 0.0, 0.0, model=spec)
    return write_bundle(str(folder), artifact, BundleRecord.of(table, run, Hardware("cpu", 1), "0" * 32))


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("regression-bundles")
    made = {kind: regression_bundle(root / kind, kind) for kind in ("float", "integer")}
    return {**made, "tensorflow": regression_bundle(root / "keras", "float", "tensorflow")}


def test_a_single_output_is_a_regression_to_a_builder():
    assert InputSpec(4, 1).regression and InputSpec(4, 1).n_outputs == 1 and not InputSpec(4, 3).regression


def test_predict_answers_in_the_label_s_units_and_type(bundles):
    rows = scoring_rows()
    floats = load_bundle(bundles["float"]).predict(rows)
    assert floats.dtype == np.float64 and len(floats) == rows.num_rows
    # An untrained net's outputs are about a standard deviation: in the label's units, about the mean.
    assert np.all(np.abs(floats - TARGET.mean) < 10 * TARGET.std) and floats.std() > 1.0
    whole = load_bundle(bundles["integer"]).predict(rows)
    assert whole.dtype == np.int64
    np.testing.assert_array_equal(whole, np.rint(floats))


def test_predict_proba_is_refused_saying_why(bundles):
    bundle = load_bundle(bundles["float"])
    with pytest.raises(BundleError, match="predicts a number.*no class probabilities; use predict"):
        bundle.predict_proba(scoring_rows())


def test_the_onnx_prediction_is_the_bundle_s_on_raw_rows(bundles):
    folder = Path(bundles["float"])
    manifest = json.loads((folder / "bundle.json").read_text())
    assert manifest["files"]["onnx"] == "model.onnx" and manifest["target"]["problem_type"] == "regression"
    assert manifest["export_checks"]["onnx"]["max_scaled_difference"] <= 1e-4
    rows = scoring_rows()
    session = onnx_session(str(folder / "model.onnx"))
    assert [output.name for output in session.get_outputs()] == ["prediction"]
    (prediction,) = session.run(["prediction"], client_feeds(rows))
    assert prediction.dtype == np.float64 and prediction.shape == (rows.num_rows,)
    np.testing.assert_allclose(prediction, load_bundle(str(folder)).predict(rows), rtol=1e-6)
    metadata = {
        prop.key: prop.value for prop in __import__("onnx").load(str(folder / "model.onnx")).metadata_props
    }
    assert metadata["problem_type"] == "regression" and "prediction" in json.loads(metadata["outputs"])


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_the_onnx_prediction_is_the_bundle_s_for_either_framework(bundles, framework):
    folder = bundles["float" if framework == "pytorch" else framework]
    rows = scoring_rows()
    (prediction,) = onnx_session(f"{folder}/model.onnx").run(["prediction"], client_feeds(rows))
    np.testing.assert_allclose(prediction, load_bundle(folder).predict(rows), rtol=1e-5)


def test_the_saved_model_serves_the_prediction(bundles):
    import tensorflow as tf

    from tasks.core.serving.raw_inputs import signature_names

    folder = bundles["tensorflow"]
    bundle = load_bundle(folder)
    rows = scoring_rows()
    serving = tf.saved_model.load(f"{folder}/saved_model").signatures["serving_default"]
    names = signature_names(bundle.encoding)
    outputs = serving(**{names[column]: tf.constant(values) for column, values in client_feeds(rows).items()})
    assert set(outputs) == {"prediction"}
    prediction = outputs["prediction"].numpy()
    assert prediction.dtype == np.float64
    np.testing.assert_allclose(prediction, bundle.predict(rows), rtol=1e-5)


def test_batch_scoring_writes_the_prediction_and_the_figures_of_every_piece_merged(bundles, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tasks.core.report.metrics import regression_metrics
    from tasks.core.serving.scoring import score_dataset

    bundle = load_bundle(bundles["float"])
    rows = scoring_rows()
    truth = np.random.default_rng(2).normal(TARGET.mean, TARGET.std, rows.num_rows)
    truth[[4, 9]] = np.nan  # no label: out of the figures
    labelled = rows.append_column("label", pa.array(truth, mask=np.arange(rows.num_rows) == 9))
    folder = tmp_path / "input"
    folder.mkdir()
    pq.write_table(labelled.slice(0, 30), folder / "part-0.parquet")
    pq.write_table(labelled.slice(30), folder / "part-1.parquet")
    report = score_dataset(
        bundles["float"], str(folder), str(tmp_path / "out"), label_column="label", rows_per_piece=20
    )
    assert report.pieces >= 2 and report.probability_columns == {} and report.metrics is None
    scored = pq.read_table(tmp_path / "out")
    assert "prediction" in scored.column_names and not any(
        n.startswith("probability_") for n in scored.column_names
    )
    predicted = bundle.predict_numbers(rows)
    assert_float32_close(scored.column("prediction").to_numpy(), predicted)  # pieces of 20 rows
    keep = np.isfinite(truth)
    expected = regression_metrics(truth[keep], predicted[keep], TARGET.mean)
    got = report.regression
    assert got.n_test == keep.sum() == rows.num_rows - 2
    for name in ("rmse", "mae", "r2", "baseline_rmse", "baseline_mae", "baseline_r2"):
        assert getattr(got, name) == pytest.approx(getattr(expected, name), rel=1e-6), name
    assert "2 rows have no number in 'label'" in " ".join(report.notes) and "RMSE" in report.summary()


def test_the_promotion_gate_compares_regressions_of_raw_rows_by_rmse(bundles, tmp_path):
    import pyarrow.parquet as pq

    from tasks.core.serving.promotion import CurrentVersion, PromotionPolicy, decide

    rows = scoring_rows()
    truth = np.random.default_rng(4).normal(TARGET.mean, TARGET.std, rows.num_rows)
    (tmp_path / "test").mkdir()
    pq.write_table(rows.append_column("label", [truth]), tmp_path / "test" / "part-0.parquet")
    new, current = load_bundle(bundles["float"]), load_bundle(bundles["integer"])  # the same weights
    decision = decide(
        new, CurrentVersion("models/v1", current), str(tmp_path / "test"), "label", [], PromotionPolicy()
    )
    assert decision.promote and decision.new == decision.current > 0
    assert decision.reason.startswith(f"promoted: RMSE {decision.new:.6g} against {decision.new:.6g}")


def test_the_mlflow_model_answers_the_bundle_s_prediction(bundles):
    from tasks.core.serving import mlflow_pyfunc

    folder = Path(bundles["float"])
    manifest = json.loads((folder / "bundle.json").read_text())
    assert manifest["files"]["mlflow"] == "mlflow"
    mlmodel = (folder / "mlflow" / "MLmodel").read_text()
    assert "prediction" in mlmodel and "probability_" not in mlmodel
    rows = scoring_rows()
    answer = mlflow_pyfunc.OnnxModel(str(folder / "mlflow" / "model")).predict(rows)
    assert list(answer.columns) == ["prediction"]
    np.testing.assert_allclose(
        answer["prediction"].to_numpy(), load_bundle(str(folder)).predict(rows), rtol=1e-6
    )


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_a_label_of_a_tiny_mean_keeps_it_in_the_onnx_prediction(tmp_path, framework):
    """A mean within 1e-8 of 0 is still added (an optimizer's no-op rule would drop it), and the check
    at export time counts the difference in the label's standard deviations, not in its units."""
    tiny = Target(REGRESSION, "problem_type='regression' was asked for", mean=1e-9, std=5e-9)
    folder = regression_bundle(tmp_path / "bundle", "float", framework, tiny)
    manifest = json.loads((Path(folder) / "bundle.json").read_text())
    assert manifest["export_notes"] == []
    assert manifest["export_checks"]["onnx"]["max_scaled_difference"] <= 1e-4
    rows = scoring_rows()
    (prediction,) = onnx_session(f"{folder}/model.onnx").run(["prediction"], client_feeds(rows))
    expected = load_bundle(folder).predict(rows)
    assert np.abs(expected - tiny.mean).max() < 100 * tiny.std  # in the label's units
    np.testing.assert_allclose(prediction, expected, rtol=0, atol=FLOAT32_TOLERANCE["rtol"] * tiny.std)
