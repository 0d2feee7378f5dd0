"""A regression bundle on raw rows: `predict` answers in the label's units and type, `predict_proba` is
refused, and the ONNX file's "prediction" agrees with the bundle. An integer label's answer is its
rounded number everywhere (bundle, written predictions, ONNX, SavedModel, MLflow), and every metric is
of that answer; a float label's is not rounded."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tasks.core.bundle.loading import load_bundle
from tasks.core.bundle.manifest import BundleRecord
from tasks.core.bundle.table_input import BundleError
from tasks.core.bundle.writing import write_bundle
from tasks.core.data.target import REGRESSION, Target
from tasks.core.models.plugins import InputSpec, build, input_spec_for, mlp_spec
from tasks.core.training.config import TrainConfig
from tasks.core.training.records import Hardware, TrainingRun
from tests.floats import FLOAT32_TOLERANCE, assert_float32_close
from tests.unit.bundle.test_raw_row_exports import (
    WEIGHTS,
    client_feeds,
    onnx_session,
    prepared_table,
    scoring_rows,
    train_table,
)

pytestmark = pytest.mark.slow  # writes an ONNX export: seconds

TARGET = Target(REGRESSION, "problem_type='regression' was asked for", mean=250_000.0, std=40_000.0)
# A count: the untrained net's answers lie about 30 to 50, where float32 rounding (about 1e-6 here)
# cannot tip a number across a half unless it lies within HALF_MARGIN of one, which the tests rule out.
COUNT = Target(REGRESSION, "problem_type='regression' was asked for", mean=40.0, std=8.0)
HALF_MARGIN = 1e-4


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
    run = TrainingRun(
        framework, "cpu", "cpu", 1, "gloo", "fp32", "single-process", [], 0.0, 0.0, TrainConfig(model=spec)
    )
    return write_bundle(str(folder), artifact, BundleRecord.of(table, run, Hardware("cpu", 1), "0" * 32))


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("regression-bundles")
    made = {kind: regression_bundle(root / kind, kind) for kind in ("float", "integer")}
    return {**made, "tensorflow": regression_bundle(root / "keras", "float", "tensorflow")}


@pytest.fixture(scope="module")
def counts(tmp_path_factory) -> dict[str, str]:
    """Bundles of an integer label (a count), by framework."""
    root = tmp_path_factory.mktemp("count-bundles")
    return {
        framework: regression_bundle(root / framework, "integer", framework, COUNT) for framework in WEIGHTS
    }


def unrounded(bundle, rows) -> np.ndarray:
    """The bundle's numbers before an integer label's rounding: the model's output in the label's units."""
    inputs = bundle.model_inputs(bundle.checked(rows, "rows", 0), "rows", 0)
    return bundle.target.in_label_units(bundle.logits(inputs)[:, 0])


def assert_away_from_halves(numbers: np.ndarray) -> None:
    """The test data's premise: no number so near a half that float32 rounding could round it either way."""
    assert np.all(np.abs(numbers - np.floor(numbers) - 0.5) > HALF_MARGIN), "pick other test rows"


def saved_model_prediction(folder: str, rows) -> np.ndarray:
    import tensorflow as tf

    from tasks.core.bundle.raw_inputs import signature_names

    serving = tf.saved_model.load(f"{folder}/saved_model").signatures["serving_default"]
    names = signature_names(load_bundle(folder).encoding)
    outputs = serving(**{names[column]: tf.constant(values) for column, values in client_feeds(rows).items()})
    assert set(outputs) == {"prediction"}
    return outputs["prediction"].numpy()


def onnx_prediction(folder: str, rows) -> np.ndarray:
    (prediction,) = onnx_session(f"{folder}/model.onnx").run(["prediction"], client_feeds(rows))
    return prediction


def mlflow_prediction(folder: str, rows) -> np.ndarray:
    from tasks.core.bundle import mlflow_pyfunc

    return mlflow_pyfunc.OnnxModel(f"{folder}/mlflow/model").predict(rows)["prediction"].to_numpy()


def onnx_ops(folder: str) -> set[str]:
    import onnx

    return {node.op_type for node in onnx.load(f"{folder}/model.onnx").graph.node}


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
    folder = bundles["tensorflow"]
    rows = scoring_rows()
    prediction = saved_model_prediction(folder, rows)
    assert prediction.dtype == np.float64
    np.testing.assert_allclose(prediction, load_bundle(folder).predict(rows), rtol=1e-5)


@pytest.mark.parametrize("framework", list(WEIGHTS))
def test_an_integer_label_s_answer_is_its_rounded_number_in_the_bundle_and_every_export(counts, framework):
    folder = counts[framework]
    bundle = load_bundle(folder)
    rows = scoring_rows()
    numbers = unrounded(bundle, rows)
    assert_away_from_halves(numbers)
    answer = bundle.predict(rows)
    assert answer.dtype == np.int64 and len(np.unique(answer)) > 3
    np.testing.assert_array_equal(answer, np.round(numbers))
    np.testing.assert_array_equal(bundle.predict_numbers(rows), answer)  # what every metric reads
    assert "Round" in onnx_ops(folder)
    np.testing.assert_array_equal(onnx_prediction(folder, rows), answer)
    np.testing.assert_array_equal(mlflow_prediction(folder, rows), answer)
    if framework == "tensorflow":
        np.testing.assert_array_equal(saved_model_prediction(folder, rows), answer)
    manifest = json.loads((Path(folder) / "bundle.json").read_text())
    assert manifest["export_notes"] == [] and manifest["export_checks"]["onnx"]["max_scaled_difference"] == 0
    assert "rounded to a whole number" in json.loads(onnx_metadata(folder)["outputs"])["prediction"]


@pytest.mark.parametrize("framework", list(WEIGHTS))
def test_a_float_label_s_answer_is_not_rounded(bundles, framework):
    folder = bundles["float" if framework == "pytorch" else framework]
    rows = scoring_rows()
    answers = [
        load_bundle(folder).predict(rows),
        onnx_prediction(folder, rows),
        mlflow_prediction(folder, rows),
    ]
    if framework == "tensorflow":
        answers.append(saved_model_prediction(folder, rows))
    assert "Round" not in onnx_ops(folder)
    for answer in answers:
        assert answer.dtype == np.float64 and np.mean(answer != np.round(answer)) > 0.9
    assert "rounded" not in json.loads(onnx_metadata(folder)["outputs"])["prediction"]


def onnx_metadata(folder: str) -> dict[str, str]:
    import onnx

    return {prop.key: prop.value for prop in onnx.load(f"{folder}/model.onnx").metadata_props}


def test_batch_scoring_writes_the_prediction_and_the_figures_of_every_piece_merged(bundles, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tasks.core.evaluation.metrics import regression_metrics
    from tasks.core.scoring.run import score_dataset

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


def test_an_integer_label_s_metrics_are_those_of_its_written_answers(counts, tmp_path):
    """Batch scoring's report, evaluation's test figures and the promotion gate's RMSE are all the
    metrics of the whole numbers scoring writes, not of the model's unrounded outputs."""
    import pyarrow.parquet as pq

    from tasks.core.evaluation.metrics import regression_metrics
    from tasks.core.evaluation.split_metrics import regression_split_metrics, split_numbers
    from tasks.core.publish.promotion import CurrentVersion, PromotionPolicy, decide
    from tasks.core.scoring.run import score_dataset

    folder = counts["pytorch"]
    bundle = load_bundle(folder)
    rows = scoring_rows()
    truth = np.random.default_rng(5).integers(30, 51, rows.num_rows)
    split = tmp_path / "test"
    split.mkdir()
    labelled = rows.append_column("label", [truth])
    pq.write_table(labelled.slice(0, 30), split / "part-0.parquet")
    pq.write_table(labelled.slice(30), split / "part-1.parquet")
    report = score_dataset(folder, str(split), str(tmp_path / "out"), label_column="label", rows_per_piece=20)
    written = pq.read_table(tmp_path / "out").column("prediction")
    assert written.type == "int64"
    expected = regression_metrics(truth, written.to_numpy().astype(np.float64), COUNT.mean)
    assert regression_metrics(truth, unrounded(bundle, rows), COUNT.mean).mae != pytest.approx(expected.mae)
    evaluated = regression_split_metrics(bundle, *split_numbers(bundle, str(split), "label"))  # as evaluate's
    for figures in (report.regression, evaluated):
        assert figures.n_test == rows.num_rows
        for name in ("rmse", "mae", "r2", "baseline_rmse", "baseline_mae", "baseline_r2"):
            assert getattr(figures, name) == pytest.approx(getattr(expected, name), rel=1e-9), name
    gate = decide(bundle, CurrentVersion("models/v1", bundle), str(split), "label", [], PromotionPolicy())
    assert gate.new == gate.current == pytest.approx(expected.rmse, rel=1e-9)


def test_the_promotion_gate_compares_regressions_of_raw_rows_by_rmse(bundles, tmp_path):
    import pyarrow.parquet as pq

    from tasks.core.evaluation.metrics import regression_metrics
    from tasks.core.publish.promotion import CurrentVersion, PromotionPolicy, decide

    rows = scoring_rows()
    truth = np.random.default_rng(4).normal(TARGET.mean, TARGET.std, rows.num_rows)
    (tmp_path / "test").mkdir()
    pq.write_table(rows.append_column("label", [truth]), tmp_path / "test" / "part-0.parquet")
    new, current = load_bundle(bundles["float"]), load_bundle(bundles["integer"])  # the same weights
    policy = PromotionPolicy(rmse_tolerance=0.01)
    decision = decide(new, CurrentVersion("models/v1", current), str(tmp_path / "test"), "label", [], policy)
    # The integer label's bundle is judged by its whole numbers.
    assert decision.current == pytest.approx(regression_metrics(truth, current.predict(rows), 0.0).rmse)
    assert decision.new == pytest.approx(regression_metrics(truth, new.predict(rows), 0.0).rmse)
    assert decision.promote and decision.new != decision.current
    assert decision.reason.startswith(f"promoted: RMSE {decision.new:.6g} against {decision.current:.6g}")


def test_the_mlflow_model_answers_the_bundle_s_prediction(bundles):
    from tasks.core.bundle import mlflow_pyfunc

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
