"""Raw-row exports: for a table of text, booleans, dates and missing values, the bundle, its ONNX file
(onnxruntime) and its SavedModel give the same rows the same probabilities and classes, from one named
input per raw column as a client sends them, and, described, the bundle's class as their "label";
also where flytekit cannot be imported."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import onnxruntime
import pyarrow as pa
import pytest

from tasks.core.bundle.export_plan import ExportDescription
from tasks.core.bundle.exports import export_model
from tasks.core.bundle.loading import load_bundle, load_model
from tasks.core.bundle.manifest import FORMAT_VERSION, BundleRecord
from tasks.core.bundle.raw_inputs import (
    onnx_encoding,
    onnx_input_names,
    raw_feeds,
    signature_names,
    tf_encoded,
)
from tasks.core.bundle.writing import write_bundle
from tasks.core.data.api import DatasetError
from tasks.core.data.column_kinds import propose_kinds
from tasks.core.data.encoding import FittedEncoding, batch_stats
from tasks.core.data.prepare import PreparedTable
from tasks.core.data.scaling import ScalerStats
from tasks.core.models.plugins import build, input_spec_for, mlp_spec
from tasks.core.training.config import TrainConfig
from tasks.core.training.records import Hardware, TrainingRun
from tests.unit.bundle.encodings import numeric_encoding

# Each test here writes a model export (torch.onnx, tf2onnx, a SavedModel): seconds, so not in make test-fast.
pytestmark = pytest.mark.slow

CLASSES = ["low", "mid", "high"]
COLUMNS = ["amount", "home city", "member", "joined", "last_seen"]
WEIGHTS = {"pytorch": "model.pt", "tensorflow": "model.npz"}


def train_table(rows: int = 240, seed: int = 0) -> pa.Table:
    """Every column has gaps: nulls, and NaN in the numbers too; the label follows the columns."""
    rng = np.random.default_rng(seed)
    missing = rng.random((5, rows)) < 0.1
    label = rng.integers(0, len(CLASSES), rows)
    amount = rng.normal(label * 3.0, 1.0) * 1e6
    amount[missing[0] & (np.arange(rows) % 2 == 0)] = np.nan
    cities = np.array(["paris", "oslo", "rome", "lima", "kyiv"])[(label + rng.integers(0, 3, rows)) % 5]
    joined = [date(1968, 6, 1) + timedelta(days=int(day)) for day in rng.integers(0, 20_000, rows)]
    seconds = rng.integers(1_600_000_000_000_000, 1_700_000_000_000_000, rows)  # microseconds
    return pa.table({
        "amount": pa.array(amount, mask=missing[0] & (np.arange(rows) % 2 == 1)),
        "home city": pa.array(cities.tolist(), mask=missing[1]),
        "member": pa.array((rng.random(rows) < 0.3 + 0.2 * label).tolist(), mask=missing[2]),
        "joined": pa.array(joined, pa.date32(), mask=missing[3]),
        "last_seen": pa.array(seconds, pa.timestamp("us", tz="UTC"), mask=missing[4]),
        "label": np.asarray(CLASSES)[label],
    })  # fmt: skip


def scoring_rows() -> pa.Table:
    """Train rows, then rows a client may send: an unseen city, an empty one, a null in every column,
    dates outside the train range (before 1970 too) and a timestamp with microseconds."""
    seen = train_table().slice(0, 60).drop_columns(["label"])
    new = pa.table({
        "amount": [np.nan, None, 2.5e7, -1e6, 123_456_789.125],
        "home city": ["tokyo", "", None, "oslo", "paris"],
        "member": [None, True, False, None, True],
        "joined": pa.array([None, date(1901, 3, 1), date(2099, 12, 31), date(1969, 12, 31), None], pa.date32()),
        "last_seen": pa.array(
            [None, datetime(2024, 2, 29, 23, 59, 59, 999_999, UTC), None, datetime(1970, 1, 1, tzinfo=UTC),
             datetime(2023, 7, 1, 12, 30, 0, 250_000, UTC)],
            pa.timestamp("us", tz="UTC"),
        ),
    })  # fmt: skip
    return pa.concat_tables([seen, new.cast(seen.schema)])


def prepared_table(table: pa.Table, columns: list[str] = COLUMNS, label: str = "label") -> PreparedTable:
    """What preprocessing makes of `table` (the feature `columns`, the `label` column), all rows taken
    as train rows."""
    raw = table.select(columns)
    encoding = batch_stats(propose_kinds(raw.schema, sample=raw), raw).fit()
    encoded = encoding.transform(raw)
    scale = encoded.std(axis=0)
    counts = Counter(table.column(label).to_pylist())
    return PreparedTable(
        feature_names=encoding.encoded_names(),
        label_column=label,
        class_labels=CLASSES,
        class_counts={label: counts[label] for label in CLASSES},
        rows={"train": table.num_rows, "val": 0, "test": 0},
        scaler=ScalerStats(encoded.mean(axis=0).tolist(), np.where(scale > 0, scale, 1.0).tolist()),
        source="raw.parquet",
        columns=columns,
        encoding=json.dumps(encoding.to_dict()),
    )


def write_raw_bundle(folder: Path, framework: str, table: PreparedTable, seed: int = 3) -> str:
    """An untrained, seeded MLP over the table's encoded features, as a bundle (which exports it)."""
    spec = mlp_spec([16])
    n_features = len(table.feature_names)
    input_spec = input_spec_for(spec, n_features, len(CLASSES))
    artifact = str(folder.parent / f"{folder.name}-{WEIGHTS[framework]}")
    if framework == "pytorch":
        import torch

        from tasks.core.models.torch_models import save_torch_artifact

        torch.manual_seed(seed)
        save_torch_artifact(build(spec, n_features, len(CLASSES), framework), spec, input_spec, artifact)
    else:
        import keras

        from tasks.core.models.keras_models import save_keras_artifact

        keras.utils.set_random_seed(seed)
        save_keras_artifact(build(spec, n_features, len(CLASSES), framework), spec, input_spec, artifact)
    run = TrainingRun(
        framework, "cpu", "cpu", 1, "gloo", "fp32", "single-process", [], 0.0, 0.0, TrainConfig(model=spec)
    )
    record = BundleRecord.of(table, run, Hardware("cpu", 1), data_fingerprint="0" * 32)
    return write_bundle(str(folder), artifact, record)


@pytest.fixture(scope="module")
def prepared() -> PreparedTable:
    return prepared_table(train_table())


@pytest.fixture(scope="module")
def bundles(raw_row_bundles) -> dict[str, str]:
    return raw_row_bundles  # tests/conftest.py: `prepared`'s table, read in a process of its own too


def client_feeds(rows: pa.Table) -> dict[str, np.ndarray]:
    """The inputs as a client builds them from plain Python values, without the project's code:
    numbers and booleans float64 with NaN, text with '' where missing, dates as Unix seconds."""

    def number(value) -> float:
        return math.nan if value is None else float(value)

    def seconds(value) -> float:
        if value is None:
            return math.nan
        instant = value if isinstance(value, datetime) else datetime(value.year, value.month, value.day)
        return instant.replace(tzinfo=UTC).timestamp() if instant.tzinfo is None else instant.timestamp()

    values = {name: rows.column(name).to_pylist() for name in COLUMNS}
    feeds = {
        "amount": [number(value) for value in values["amount"]],
        "home city": np.asarray(["" if value is None else value for value in values["home city"]], object),
        "member": [number(value) for value in values["member"]],
        "joined": [seconds(value) for value in values["joined"]],
        "last_seen": [seconds(value) for value in values["last_seen"]],
    }
    return {name: np.asarray(column)[:, None] for name, column in feeds.items()}


def onnx_session(path: str) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def onnx_probabilities(path: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    (probabilities,) = onnx_session(path).run(["probabilities"], feeds)
    return probabilities


def saved_model_probabilities(
    path: str, feeds: dict[str, np.ndarray], encoding: FittedEncoding
) -> np.ndarray:
    import tensorflow as tf

    serving = tf.saved_model.load(path).signatures["serving_default"]
    names = signature_names(encoding)
    outputs = serving(**{names[column]: tf.constant(values) for column, values in feeds.items()})
    return outputs["probabilities"].numpy()


def assert_same_answers(expected: np.ndarray, probabilities: np.ndarray) -> None:
    assert probabilities.dtype == np.float32 and probabilities.shape == expected.shape
    np.testing.assert_allclose(probabilities, expected, atol=1e-5)
    np.testing.assert_array_equal(probabilities.argmax(axis=1), expected.argmax(axis=1))


# ---- the encoding graph alone -----------------------------------------------------------------------


def many_dates_table(rows: int = 4000) -> pa.Table:
    """Instants over five centuries either side of 1970, leap days included, with gaps everywhere."""
    rng = np.random.default_rng(1)
    micros = rng.integers(-200_000, 200_000, rows) * 86_400_000_000 + rng.integers(0, 86_400_000_000, rows)
    micros[:3] = [
        int(datetime(2000, 2, 29, tzinfo=UTC).timestamp() * 1e6),
        int(datetime(1900, 3, 1, tzinfo=UTC).timestamp() * 1e6) - 1,
        -1,
    ]
    return pa.table({
        "amount": pa.array(rng.normal(size=rows), mask=rng.random(rows) < 0.1),
        "home city": pa.array(rng.choice(["a", "b", "c", ""], rows).tolist(), mask=rng.random(rows) < 0.1),
        "member": pa.array((rng.random(rows) < 0.5).tolist(), mask=rng.random(rows) < 0.1),
        "joined": pa.array(micros, pa.timestamp("us"), mask=rng.random(rows) < 0.1),
    })  # fmt: skip


def complete_rows(table: pa.Table) -> pa.Table:
    complete = np.ones(table.num_rows, bool)
    for column in table.columns:
        complete &= column.is_valid().to_numpy(zero_copy_only=False)
    complete &= ~np.isnan(table.column("amount").to_numpy(zero_copy_only=False))
    complete &= np.asarray(table.column("home city").to_pylist()) != ""
    return table.filter(pa.array(complete))


@pytest.mark.parametrize("indicators", [True, False])
def test_the_onnx_and_tensorflow_encodings_give_the_bundle_s_features(indicators):
    import tensorflow as tf

    table = many_dates_table()
    # Without a missing train value there is no indicator, and a value missing at scoring is filled.
    train = table if indicators else complete_rows(table)
    encoding = batch_stats(propose_kinds(train.schema, sample=train), train).fit(vocabulary_cap=2)
    assert any(name.endswith("<missing>") for name in encoding.encoded_names()) == indicators
    expected = encoding.transform(table)
    feeds = raw_feeds(table, encoding)
    session = onnxruntime.InferenceSession(
        onnx_encoding(encoding, 10, 18).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    (from_onnx,) = session.run(None, feeds)
    names = signature_names(encoding)
    from_tf = tf_encoded({names[column]: tf.constant(values) for column, values in feeds.items()}, encoding)
    days = np.array([name.endswith(":days") for name in encoding.encoded_names()])
    for encoded in (from_onnx, from_tf.numpy()):
        np.testing.assert_array_equal(encoded[:, ~days], expected[:, ~days])  # codes, months, weekdays
        # Days from float64 seconds rather than integer microseconds: equal to the last digits or so.
        np.testing.assert_allclose(encoded[:, days], expected[:, days], rtol=1e-13, atol=0)


def test_signature_names_are_the_columns_as_tensorflow_keeps_them():
    names = ("amount", "home city", "home_city", "_id", "a.b-c", "né", "1st", "a.b", "a b")
    assert signature_names(numeric_encoding(names)) == {
        "amount": "amount", "home city": "home_city", "home_city": "home_city_2", "_id": "arg__id",
        "a.b-c": "a_b_c", "né": "n_", "1st": "arg_1st", "a.b": "a_b", "a b": "a_b_2",
    }  # fmt: skip


def test_onnx_inputs_are_the_columns_unless_the_graph_uses_the_name():
    names = ("amount", "label", "logits", "probabilities", "prediction", "features", "", "serving/zero",
             "input/label", "labels")  # fmt: skip
    renamed = {
        "label",
        "logits",
        "probabilities",
        "prediction",
        "features",
        "",
        "serving/zero",
        "input/label",
    }
    assert onnx_input_names(numeric_encoding(names)) == {
        name: f"input/{name}" if name in renamed else name for name in names
    }


# ---- the bundle's exports --------------------------------------------------------------------------------


def test_the_exports_take_one_named_input_per_raw_column(bundles, prepared):
    import tensorflow as tf

    for framework, folder in bundles.items():
        manifest = json.loads((Path(folder) / "bundle.json").read_text())
        expected = {"onnx": "model.onnx"} if framework == "pytorch" else {
            "saved_model": "saved_model", "onnx": "model.onnx"}  # fmt: skip
        assert manifest["files"] == {"weights": WEIGHTS[framework], **expected, "mlflow": "mlflow"}
        assert manifest["export_notes"] == []
        session = onnx_session(os.path.join(folder, "model.onnx"))
        inputs = [(value.name, value.type, value.shape) for value in session.get_inputs()]
        assert inputs == [
            ("amount", "tensor(double)", ["rows", 1]),
            ("home city", "tensor(string)", ["rows", 1]),
            ("member", "tensor(double)", ["rows", 1]),
            ("joined", "tensor(double)", ["rows", 1]),
            ("last_seen", "tensor(double)", ["rows", 1]),
        ]
        outputs = [(value.name, value.type, value.shape) for value in session.get_outputs()]
        assert outputs == [
            *((name, "tensor(float)", ["rows", 3]) for name in ("logits", "probabilities")),
            ("label", "tensor(string)", ["rows"]),  # the bundle describes its exports: class names
        ]
    serving = tf.saved_model.load(os.path.join(bundles["tensorflow"], "saved_model")).signatures["serve"]
    _, named = serving.structured_input_signature
    assert {name: (spec.dtype, spec.shape.as_list()) for name, spec in named.items()} == {
        "amount": (tf.float64, [None, 1]), "home_city": (tf.string, [None, 1]), "member": (tf.float64, [None, 1]),
        "joined": (tf.float64, [None, 1]), "last_seen": (tf.float64, [None, 1]),
    }  # fmt: skip


@pytest.mark.parametrize("form", ["arrow", "pandas"])
def test_a_client_s_inputs_are_what_raw_feeds_gives(prepared, form):
    rows = scoring_rows()
    feeds = raw_feeds(rows if form == "arrow" else rows.to_pandas(), prepared.fitted_encoding())
    expected = client_feeds(rows)
    assert list(feeds) == list(expected)
    for name, values in expected.items():
        assert feeds[name].shape == values.shape == (rows.num_rows, 1)
        np.testing.assert_array_equal(feeds[name], values)


@pytest.mark.parametrize("form", ["arrow", "pandas"])
def test_raw_feeds_refuse_rows_missing_a_column_naming_it_as_the_bundle_does(prepared, form):
    rows = scoring_rows().drop_columns(["joined", "member"])
    with pytest.raises(
        DatasetError, match=r"missing feature 2 columns 'member', 'joined'; the model reads 5"
    ):
        raw_feeds(rows if form == "arrow" else rows.to_pandas(), prepared.fitted_encoding())


def test_raw_feeds_refuse_a_column_of_mixed_types_naming_it(prepared):
    frame = scoring_rows().to_pandas().astype({"amount": object})
    frame.loc[3, "amount"] = "lots"
    with pytest.raises(DatasetError, match="a feature column mixes types .*amount"):
        raw_feeds(frame, prepared.fitted_encoding())


@pytest.mark.parametrize("framework", list(WEIGHTS))
def test_the_bundle_onnx_and_saved_model_give_raw_rows_the_same_answers(bundles, prepared, framework):
    folder = bundles[framework]
    rows = scoring_rows()
    expected = load_bundle(folder).predict_proba(rows)
    assert len(set(expected.argmax(axis=1))) > 1, "an untrained model that predicts one class tests little"
    feeds = client_feeds(rows)
    assert_same_answers(expected, onnx_probabilities(os.path.join(folder, "model.onnx"), feeds))
    if framework == "tensorflow":
        saved_model = os.path.join(folder, "saved_model")
        assert_same_answers(
            expected, saved_model_probabilities(saved_model, feeds, prepared.fitted_encoding())
        )
    one_row = {name: values[-2:-1] for name, values in feeds.items()}  # the batch size is free
    assert_same_answers(expected[-2:-1], onnx_probabilities(os.path.join(folder, "model.onnx"), one_row))


@pytest.mark.parametrize("framework", list(WEIGHTS))
def test_described_exports_label_raw_rows_with_the_bundle_s_classes(bundles, prepared, framework, tmp_path):
    """The bundle's model exported with its description: "label" is the bundle's class of each row."""
    folder = bundles[framework]
    model, _ = load_model(framework, os.path.join(folder, WEIGHTS[framework]))
    model = model.eval() if framework == "pytorch" else model
    described = ExportDescription(prepared.feature_names, "label", CLASSES, FORMAT_VERSION)
    encoding = prepared.fitted_encoding()
    result = export_model(model, framework, prepared.scaler, str(tmp_path), encoding, description=described)
    assert result.notes == [] and result.checks["onnx"]["max_abs_difference"] <= 1e-4
    rows = scoring_rows()
    expected = [CLASSES[index] for index in load_bundle(folder).predict_proba(rows).argmax(axis=1)]
    feeds = client_feeds(rows)
    (labels,) = onnx_session(str(tmp_path / "model.onnx")).run(["label"], feeds)
    assert labels.tolist() == expected
    if framework == "tensorflow":
        import tensorflow as tf

        serving = tf.saved_model.load(str(tmp_path / "saved_model")).signatures["serving_default"]
        names = signature_names(encoding)
        labels = serving(**{names[column]: tf.constant(values) for column, values in feeds.items()})["label"]
        assert labels.numpy().astype(str).tolist() == expected


# A feature named as an output: its input is renamed, and the export answers as the bundle does.
OUTPUT_NAMED = {"amount": "logits", "home city": "probabilities", "member": "label", "label": "class"}


@pytest.fixture(scope="module")
def output_named_bundle(tmp_path_factory) -> str:
    table = train_table().rename_columns([OUTPUT_NAMED.get(name, name) for name in [*COLUMNS, "label"]])
    columns = [OUTPUT_NAMED.get(name, name) for name in COLUMNS]
    prepared = prepared_table(table, columns, label="class")
    return write_raw_bundle(tmp_path_factory.mktemp("output-named") / "bundle", "pytorch", prepared)


def test_columns_named_as_the_outputs_are_inputs_led_by_input(output_named_bundle):
    manifest = json.loads((Path(output_named_bundle) / "bundle.json").read_text())
    assert manifest["export_notes"] == [] and {"onnx", "mlflow"} <= set(manifest["files"])
    session = onnx_session(os.path.join(output_named_bundle, "model.onnx"))
    assert [value.name for value in session.get_inputs()] == [
        "input/logits", "input/probabilities", "input/label", "joined", "last_seen"
    ]  # fmt: skip
    assert [value.name for value in session.get_outputs()] == ["logits", "probabilities", "label"]
    rules = json.loads(session.get_modelmeta().custom_metadata_map["inputs"])
    assert [(rule["name"], rule["column"]) for rule in rules][:3] == [
        ("input/logits", "logits"), ("input/probabilities", "probabilities"), ("input/label", "label")
    ]  # fmt: skip


def test_columns_named_as_the_outputs_are_answered_as_the_bundle_answers(output_named_bundle):
    from tasks.core.bundle import mlflow_pyfunc
    from tests.floats import assert_scored_alike

    bundle = load_bundle(output_named_bundle)
    rows = scoring_rows().rename_columns([OUTPUT_NAMED.get(name, name) for name in COLUMNS])
    expected = bundle.predict_proba(rows)
    assert len(set(expected.argmax(axis=1))) > 1
    feeds = raw_feeds(rows, bundle.encoding)
    session = onnx_session(os.path.join(output_named_bundle, "model.onnx"))
    probabilities, labels = session.run(["probabilities", "label"], feeds)
    assert_scored_alike(probabilities, expected)
    assert labels.tolist() == [CLASSES[index] for index in expected.argmax(axis=1)]
    answer = mlflow_pyfunc.OnnxModel(os.path.join(output_named_bundle, "mlflow", "model")).predict(rows)
    assert answer["prediction"].tolist() == labels.tolist()
    assert_scored_alike(answer[[f"probability_{label}" for label in CLASSES]].to_numpy(), expected)


def test_keras_columns_tensorflow_would_rename_alike_get_a_saved_model(tmp_path):
    """`a.b` and `a b` are both `a_b` to TensorFlow's argument renaming, which refuses the pair."""
    import tensorflow as tf

    table = pa.table(
        {"a.b": [1.0, None, 3.0, 4.0], "a b": [2.0, 1.0, None, 0.0], "city": ["x", "y", "x", "y"]}
    )
    encoding = batch_stats(propose_kinds(table.schema, sample=table), table).fit()
    n_features = len(encoding.encoded_names())
    model = build(mlp_spec([4]), n_features, len(CLASSES), "tensorflow")
    scaler = ScalerStats([0.0] * n_features, [1.0] * n_features)
    described = ExportDescription(encoding.encoded_names(), "label", CLASSES, FORMAT_VERSION)
    result = export_model(model, "tensorflow", scaler, str(tmp_path), encoding, description=described)
    assert result.notes == [] and set(result.files) == {"saved_model", "onnx"}
    serving = tf.saved_model.load(str(tmp_path / "saved_model")).signatures["serving_default"]
    names = signature_names(encoding)
    assert set(serving.structured_input_signature[1]) == set(names.values()) == {"a_b", "a_b_2", "city"}
    feeds = raw_feeds(table, encoding)
    answers = serving(**{names[column]: tf.constant(values) for column, values in feeds.items()})
    (expected,) = onnx_session(str(tmp_path / "model.onnx")).run(["probabilities"], feeds)
    assert_same_answers(expected, answers["probabilities"].numpy())


def test_the_int8_batch_check_feeds_renamed_number_columns_by_their_input_names(output_named_bundle):
    from tasks.core.bundle.int8 import number_inputs

    session = onnx_session(os.path.join(output_named_bundle, "model.onnx"))
    inputs = [value.name for value in session.get_inputs()]
    numbers = number_inputs(load_bundle(output_named_bundle).manifest, inputs)
    assert "input/logits" in numbers and set(numbers) <= set(inputs)  # `amount`, named `logits` here
