"""The serving exports: ONNX (run by onnxruntime) and the SavedModel's serving signature, given raw
rows, agree with the framework's model given the standardised rows, for any batch size; where the
table's encoding is more than its numeric columns as they are, they take the raw columns by name
(test_raw_row_exports.py checks their answers against the bundle's). The ONNX files are IR 8 and
opset 18, for onnxruntime 1.15 and later, and their agreement with the model is checked as they are written
(test_export_metadata.py: the label output and the metadata)."""

from __future__ import annotations

import os

import keras
import numpy as np
import onnx
import onnxruntime
import pyarrow as pa
import pytest
import tensorflow as tf
import torch
from torch import nn

from tasks.core.bundle.export_parity import PARITY_TOLERANCE, rounded_expectation, scaled_difference
from tasks.core.bundle.export_plan import ONNX_IR_VERSION, ONNX_OPSET, ExportResult
from tasks.core.bundle.exports import encoded_columns, export_model
from tasks.core.data.column_kinds import NUMERIC, propose_kinds
from tasks.core.data.encoding import FittedEncoding, batch_stats
from tasks.core.data.scaling import ScalerStats
from tasks.core.models.plugins import ModelSpec, build
from tests.unit.bundle.encodings import numbered_encoding

N_FEATURES, N_CLASSES = 64, 3
RNG = np.random.default_rng(7)
SCALER = ScalerStats(
    mean=RNG.normal(loc=3.0, size=N_FEATURES).tolist(), scale=RNG.uniform(0.5, 4.0, N_FEATURES).tolist()
)
SPECS = {
    "mlp": ModelSpec("mlp", options={"hidden_sizes": "32,16"}),
    "cnn": ModelSpec("cnn", "1x8x8", {"channels": "4,8"}),
    "residual": ModelSpec("examples.residual:build", options={"width": 32, "blocks": 2}),
}
BATCHES = (1, 7)  # the exports were traced with neither
EXPORT_PATHS = {"onnx": "model.onnx", "saved_model": "saved_model"}


def raw_rows(count: int) -> np.ndarray:
    rng = np.random.default_rng(count)
    return rng.normal(loc=SCALER.mean, scale=SCALER.scale, size=(count, N_FEATURES))


def standardised(raw: np.ndarray) -> np.ndarray:
    return ((raw.astype(np.float64) - SCALER.mean) / SCALER.scale).astype(np.float32)


def export(model, framework: str, directory, encoding: FittedEncoding | None = None) -> ExportResult:
    """The exports of `model`, taking "features" unless `encoding` reads raw columns."""
    return export_model(model, framework, SCALER, str(directory), encoding or numbered_encoding(N_FEATURES))


def onnx_outputs(path: str, raw: np.ndarray) -> dict[str, np.ndarray]:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    assert [value.name for value in session.get_inputs()] == ["features"]
    assert session.get_inputs()[0].shape == ["rows", N_FEATURES]
    names = [value.name for value in session.get_outputs()]
    return dict(zip(names, session.run(None, {"features": raw}), strict=True))


def assert_exported(result: ExportResult, names: list[str]) -> None:
    """Exactly `names` exported, none left out; the ONNX file checked in onnxruntime as it was written."""
    assert result.files == {name: EXPORT_PATHS[name] for name in names}
    assert result.notes == []
    assert list(result.checks) == ["onnx"]
    check = result.checks["onnx"]
    assert check["onnxruntime"] == onnxruntime.__version__ and check["rows"] == 8
    assert 0 <= check["max_abs_difference"] <= check["tolerance"] == PARITY_TOLERANCE


def assert_loads_in_the_onnxruntime_floor(path: str) -> None:
    """IR 8 and opset 18 (ai.onnx.ml 3 at most), each domain imported once, without the IR 10 nodes'
    metadata; checked as such."""
    exported = onnx.load(path)
    assert exported.ir_version == ONNX_IR_VERSION <= 9
    opsets = {opset.domain: opset.version for opset in exported.opset_import}
    assert len(exported.opset_import) == len(opsets), [(o.domain, o.version) for o in exported.opset_import]
    assert opsets[""] == ONNX_OPSET == 18 and opsets.get("ai.onnx.ml", 3) <= 3
    assert not any(node.metadata_props for node in exported.graph.node)
    onnx.checker.check_model(exported, full_check=True)


def assert_agree(outputs: dict[str, np.ndarray], logits: np.ndarray) -> None:
    """The export's logits match the model's; its probabilities are their softmax and sum to 1."""
    assert set(outputs) == {"logits", "probabilities"}
    assert outputs["logits"].dtype == outputs["probabilities"].dtype == np.float32
    assert outputs["logits"].shape == outputs["probabilities"].shape == logits.shape
    np.testing.assert_allclose(outputs["logits"], logits, atol=1e-5, rtol=1e-5)
    expected = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(
        outputs["probabilities"], expected / expected.sum(axis=1, keepdims=True), atol=1e-6
    )
    np.testing.assert_allclose(outputs["probabilities"].sum(axis=1), 1.0, atol=1e-6)


# ---- PyTorch -> ONNX ------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=list(SPECS))
def torch_export(request, tmp_path_factory):
    torch.manual_seed(0)
    model = build(SPECS[request.param], N_FEATURES, N_CLASSES, "pytorch").eval()
    directory = tmp_path_factory.mktemp(f"torch-{request.param}")
    return model, directory, export(model, "pytorch", directory)


@pytest.mark.slow
def test_a_torch_model_is_exported_to_onnx(torch_export):
    _, directory, result = torch_export
    assert_exported(result, ["onnx"])
    assert sorted(os.listdir(directory)) == ["model.onnx"]  # one self-contained file, no external data


def test_torch_onnx_loads_in_the_onnxruntime_floor(torch_export):
    _, directory, _ = torch_export
    assert_loads_in_the_onnxruntime_floor(str(directory / "model.onnx"))


@pytest.mark.parametrize("rows", BATCHES)
def test_torch_onnx_takes_raw_rows_and_gives_the_model_s_logits(torch_export, rows):
    model, directory, _ = torch_export
    raw = raw_rows(rows)
    with torch.no_grad():
        logits = model(torch.from_numpy(standardised(raw))).numpy()
    assert_agree(onnx_outputs(str(directory / "model.onnx"), raw), logits)


class FixedBatch(nn.Module):
    """Treats the batch size it was traced with as a constant."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(N_FEATURES, N_CLASSES)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.linear(rows).reshape(2, N_CLASSES)


@pytest.mark.slow  # writes model exports: seconds
def test_an_export_the_model_cannot_give_is_left_out_with_the_reason(tmp_path):
    result = export(FixedBatch().eval(), "pytorch", tmp_path)
    assert result.files == {}
    (note,) = result.notes
    assert note.startswith("onnx not exported") and "has a fixed batch of 2 rows" in note
    assert os.listdir(tmp_path) == []


def test_an_unknown_framework_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="'jax'"):
        export(None, "jax", tmp_path)


# ---- Keras -> SavedModel and ONNX ----------------------------------------------------------------------


@pytest.fixture(scope="module", params=["mlp", "cnn"])
def keras_export(request, tmp_path_factory):
    keras.utils.set_random_seed(0)
    model = build(SPECS[request.param], N_FEATURES, N_CLASSES, "tensorflow")
    directory = tmp_path_factory.mktemp(f"keras-{request.param}")
    return model, directory, export(model, "tensorflow", directory)


def keras_logits(model, raw: np.ndarray) -> np.ndarray:
    return np.asarray(model(standardised(raw), training=False))


def test_a_keras_model_is_exported_to_a_saved_model_and_onnx(keras_export):
    _, directory, result = keras_export
    assert_exported(result, ["saved_model", "onnx"])
    assert sorted(os.listdir(directory)) == ["model.onnx", "saved_model"]


def test_keras_onnx_loads_in_the_onnxruntime_floor(keras_export):
    _, directory, _ = keras_export
    assert_loads_in_the_onnxruntime_floor(str(directory / "model.onnx"))


@pytest.mark.parametrize("rows", BATCHES)
def test_the_saved_model_serving_signature_takes_raw_rows(keras_export, rows):
    model, directory, _ = keras_export
    loaded = tf.saved_model.load(str(directory / "saved_model"))
    assert {"serve", "serving_default"} <= set(loaded.signatures)
    serving = loaded.signatures["serving_default"]
    raw = raw_rows(rows)
    outputs = {name: value.numpy() for name, value in serving(features=tf.constant(raw)).items()}
    assert_agree(outputs, keras_logits(model, raw))


@pytest.mark.parametrize("rows", BATCHES)
def test_keras_onnx_takes_raw_rows_and_gives_the_model_s_logits(keras_export, rows):
    model, directory, _ = keras_export
    exported = onnx.load(str(directory / "model.onnx"))
    assert [value.type.tensor_type.shape.dim[0].dim_param for value in exported.graph.output] == ["rows"] * 2
    raw = raw_rows(rows)
    assert_agree(onnx_outputs(str(directory / "model.onnx"), raw), keras_logits(model, raw))


# ---- tables whose encoding is more than their numbers ---------------------------------------------------


def fitted(table: pa.Table, overrides: dict[str, str] | None = None) -> FittedEncoding:
    return batch_stats(propose_kinds(table.schema, overrides=overrides, sample=table), table).fit()


NUMBERS = {f"f{index}": [float(index + row) for row in range(4)] for index in range(N_FEATURES)}
NOT_AS_THEY_ARE = {
    "text": ({"city": ["a", "b", "a", "b"]}, None),
    "boolean": ({"member": [True, False, True, True]}, None),
    "date": ({"joined": pa.array([0, 1, 2, 3], pa.date32())}, None),
    "missing number": ({"amount": [1.0, None, 2.0, 3.0]}, None),
    "codes marked categorical": ({"code": [1, 2, 1, 3]}, {"code": "categorical"}),
}


@pytest.mark.parametrize("case", list(NOT_AS_THEY_ARE))
def test_a_column_that_is_not_a_number_as_it_is_is_encoded(case):
    columns, overrides = NOT_AS_THEY_ARE[case]
    encoding = fitted(pa.table({**NUMBERS, **columns}), overrides)
    assert encoded_columns(encoding) == list(columns)


@pytest.mark.slow  # writes model exports: seconds
@pytest.mark.parametrize("framework, names", [("pytorch", ["onnx"]), ("tensorflow", ["saved_model", "onnx"])])
def test_where_a_column_is_encoded_the_exports_take_the_raw_columns_by_name(framework, names, tmp_path):
    columns = {name: values for case in NOT_AS_THEY_ARE.values() for name, values in case[0].items()}
    overrides = {"code": "categorical"}
    encoding = fitted(pa.table({**NUMBERS, **columns}), overrides)
    model = build(SPECS["mlp"], len(encoding.encoded_names()), N_CLASSES, framework)
    model = model.eval() if framework == "pytorch" else model
    scaler = ScalerStats([0.0] * len(encoding.encoded_names()), [1.0] * len(encoding.encoded_names()))
    result = export_model(model, framework, scaler, str(tmp_path), encoding)
    assert_exported(result, names)
    assert_loads_in_the_onnxruntime_floor(str(tmp_path / "model.onnx"))
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    text = {"city", "code"}
    assert [(value.name, value.type, value.shape) for value in session.get_inputs()] == [
        (name, "tensor(string)" if name in text else "tensor(double)", ["rows", 1])
        for name in [*NUMBERS, *columns]
    ]


@pytest.mark.slow  # writes model exports: seconds
def test_a_model_that_cannot_export_still_leaves_a_note_where_a_column_is_encoded(tmp_path):
    encoding = fitted(pa.table({**NUMBERS, "city": ["a", "b", "a", "b"]}))
    assert len(encoding.encoded_names()) == N_FEATURES + 3  # city=a, city=b, city=<other>

    class Wider(FixedBatch):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(N_FEATURES + 3, N_CLASSES)

    scaler = ScalerStats([0.0] * (N_FEATURES + 3), [1.0] * (N_FEATURES + 3))
    result = export_model(Wider().eval(), "pytorch", scaler, str(tmp_path), encoding)
    assert result.files == {}
    (note,) = result.notes
    assert note.startswith("onnx not exported") and "has a fixed batch of 2 rows" in note
    assert os.listdir(tmp_path) == []


def test_numbers_as_they_are_are_the_identity_even_with_a_column_left_out():
    encoding = fitted(pa.table({**NUMBERS, "city": ["a", "b", "a", "b"]}), {"city": "drop"})
    assert [column.kind for column in encoding.columns] == [NUMERIC] * N_FEATURES
    assert encoded_columns(encoding) == [] and encoding.encoded_names() == list(NUMBERS)
    assert "city" in encoding.left_out


@pytest.mark.slow
@pytest.mark.parametrize("rows", BATCHES)
def test_an_identity_encoding_exports_as_a_bundle_without_one(tmp_path, rows):
    torch.manual_seed(0)
    model = build(SPECS["mlp"], N_FEATURES, N_CLASSES, "pytorch").eval()
    result = export(model, "pytorch", tmp_path, fitted(pa.table(NUMBERS)))
    assert_exported(result, ["onnx"])
    raw = raw_rows(rows)
    with torch.no_grad():
        logits = model(torch.from_numpy(standardised(raw))).numpy()
    assert_agree(onnx_outputs(str(tmp_path / "model.onnx"), raw), logits)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_a_gap_in_a_number_is_filled_in_the_export_as_the_bundle_fills_it(tmp_path, framework):
    """The identity encoding fills a missing number with its train mean (f_i: i + 1.5 here); the
    exported graph does the same, so a raw row with a gap gets the bundle's answer, not NaN."""
    encoding = fitted(pa.table(NUMBERS))
    torch.manual_seed(0)
    keras.utils.set_random_seed(0)
    model = build(SPECS["mlp"], N_FEATURES, N_CLASSES, framework)
    model = model.eval() if framework == "pytorch" else model
    export(model, framework, tmp_path, encoding)
    raw = raw_rows(5)
    raw[0, 3] = raw[2, 10] = raw[4, 63] = np.nan
    filled = raw.copy()
    for row, column in ((0, 3), (2, 10), (4, 63)):
        filled[row, column] = column + 1.5
    if framework == "pytorch":
        with torch.no_grad():
            logits = model(torch.from_numpy(standardised(filled))).numpy()
    else:
        logits = keras_logits(model, filled)
    assert_agree(onnx_outputs(str(tmp_path / "model.onnx"), raw), logits)


def test_a_regression_s_difference_counts_in_the_label_s_standard_deviations():
    """A prediction off by a label's mean of 1e-9 (a fifth of its spread) is far beyond the tolerance
    in the label's units, where in absolute terms it would pass."""
    mean, std = 1e-9, 5e-9
    expected = mean + std * np.array([0.5, -1.0, 30.0])
    assert scaled_difference(expected - mean, expected) < PARITY_TOLERANCE
    assert scaled_difference(expected - mean, expected, mean, std) == pytest.approx(0.2)
    assert scaled_difference(expected * (1 + 1e-7), expected, mean, std) < PARITY_TOLERANCE  # float32 bits


def test_a_rounded_prediction_is_held_to_the_model_s_numbers_rounded_half_to_even():
    """Either whole number beside a half is the model's answer where float32 rounding could tip it;
    elsewhere only the number numpy rounds it to (half to even, as ONNX's Round and tf.round)."""
    unrounded = np.array([2.5, 2.5, 7.49999999, 7.2, 7.2, np.nan])
    got = np.array([3.0, 5.0, 8.0, 7.0, 8.0, np.nan])
    expected = rounded_expectation(got, unrounded, mean=5.0, std=2.0)
    np.testing.assert_array_equal(expected, [3.0, 2.0, 8.0, 7.0, 7.0, np.nan])
    assert scaled_difference(got, expected, 5.0, 2.0) == pytest.approx(1.0)  # 5 for 2.5 (2): 3 off, over 3


@pytest.mark.slow
def test_raw_feeds_of_an_export_that_takes_features_are_its_one_input(tmp_path):
    """The embedded digits as read from their parquet file: 64 numeric columns as they are, so the export
    takes "features", which raw_feeds gives, in the encoding's order, as onnxruntime takes it."""
    import pandas as pd

    from tasks.core.bundle.raw_inputs import raw_feeds
    from tasks.core.data.prepare import EMBEDDED_DIGITS_LABEL, write_embedded_digits
    from tasks.core.data.scaling import standardise
    from tests.floats import assert_scored_alike

    frame = pd.read_parquet(write_embedded_digits(str(tmp_path))).drop(columns=[EMBEDDED_DIGITS_LABEL])
    frame = frame.sample(frac=1.0, axis="columns", random_state=0).head(50)  # columns in another order
    encoding = fitted(pa.Table.from_pandas(frame))
    assert encoded_columns(encoding) == [] and len(encoding.columns) == N_FEATURES
    encoded = encoding.transform(pa.Table.from_pandas(frame))
    scaler = ScalerStats(encoded.mean(axis=0).tolist(), np.maximum(encoded.std(axis=0), 1.0).tolist())
    torch.manual_seed(0)
    model = build(SPECS["mlp"], N_FEATURES, N_CLASSES, "pytorch").eval()
    (tmp_path / "export").mkdir()
    assert_exported(export_model(model, "pytorch", scaler, str(tmp_path / "export"), encoding), ["onnx"])
    feeds = raw_feeds(frame, encoding)
    assert list(feeds) == ["features"] and feeds["features"].dtype == np.float64
    session = onnxruntime.InferenceSession(
        str(tmp_path / "export" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    (probabilities,) = session.run(["probabilities"], feeds)
    with torch.no_grad():
        logits = model(torch.from_numpy(standardise(encoded, scaler))).numpy()
    assert_scored_alike(probabilities, torch.softmax(torch.from_numpy(logits), dim=1).numpy())


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_numbers_far_from_zero_reach_the_export_as_the_bundle_scales_them(tmp_path, framework):
    """17-digit ids a few hundred apart (docs/inputs.md) standardise by their spread: float32 "features"
    would round every one of them to one number before the scaler, so the export took "features" in
    float64, as raw_feeds gives them and the bundle scales them."""
    from tasks.core.bundle.raw_inputs import raw_feeds
    from tasks.core.data.scaling import standardise
    from tests.floats import assert_scored_alike

    rng = np.random.default_rng(0)
    table = pa.table(
        {"customer_id": 10**16 + 100 * rng.integers(0, 10, 40), "seconds": 1.7e9 + rng.normal(size=40)}
    )
    encoding = fitted(table)
    encoded = encoding.transform(table)
    scaler = ScalerStats(encoded.mean(axis=0).tolist(), encoded.std(axis=0).tolist())
    model = build(SPECS["mlp"], 2, N_CLASSES, framework)
    result = export_model(
        model.eval() if framework == "pytorch" else model, framework, scaler, str(tmp_path), encoding
    )
    assert "onnx" in result.files, result.notes
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    (probabilities,) = session.run(["probabilities"], raw_feeds(table, encoding))
    standardised_rows = standardise(encoded, scaler)
    assert np.ptp(standardised_rows, axis=0).min() > 1  # the ids, and the seconds, apart once scaled
    if framework == "pytorch":
        with torch.no_grad():
            logits = model(torch.from_numpy(standardised_rows)).numpy()
    else:
        logits = np.asarray(model(standardised_rows, training=False))
    assert_scored_alike(probabilities, torch.softmax(torch.from_numpy(logits), dim=1).numpy())


def test_native_log_lines_of_a_conversion_are_held_and_shown_only_when_it_fails(capfd):
    import os

    from tasks.core.bundle.onnx_graph import native_log_held

    with native_log_held():
        os.write(2, b"I0000 Starting new session\n")
    assert "Starting new session" not in capfd.readouterr().err
    with pytest.raises(RuntimeError, match="conversion failed"), native_log_held():
        os.write(2, b"E0000 what went wrong\n")
        raise RuntimeError("conversion failed")
    assert "what went wrong" in capfd.readouterr().err
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n", "stderr is the process's own again"
