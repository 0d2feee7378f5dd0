"""The optional int8 ONNX export: quantized weights that answer as the float file does, kept or dropped
by the accuracy and the speed it shows, and the manifest that records either, still verified on load."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tasks.core.bundle import int8, int8_quantize
from tasks.core.bundle.export_plan import onnx_session
from tasks.core.bundle.int8 import (
    EXPORT,
    INT8_FILE,
    PROBABILITY_SHIFT,
    TOLERANCE,
    BatchFigures,
    Int8Figures,
    add_int8_export,
    decide,
)
from tasks.core.bundle.loading import check_files, load_bundle
from tasks.core.bundle.manifest import MANIFEST, read_manifest, write_manifest
from tasks.core.bundle.raw_inputs import raw_feeds
from tasks.core.data.api import FittedEncoding, standardise
from tasks.core.data.files import filesystem_for
from tests.conftest import blobs_frame
from tests.unit.publish.test_publish import CLASSES, messy_table, write_messy_bundle, write_test_bundle


def coded(table: pa.Table) -> pa.Table:
    """The table with its text labels as class codes, as the prepared test split holds them."""
    codes = pc.index_in(table.column("species"), pa.array(CLASSES)).cast(pa.int64())
    return table.set_column(table.schema.get_field_index("species"), "species", codes)


def blob_rows() -> pa.Table:
    blobs = pa.Table.from_pandas(blobs_frame(n_rows=400), preserve_index=False)
    return coded(blobs.filter(pc.is_in(blobs.column("species"), pa.array(CLASSES))))


def train_rows(folder: str, rows: pa.Table) -> pa.Table:
    """`rows` as a prepared train split holds them (encoded and standardised, float32), for calibrating."""
    record = read_manifest(*filesystem_for(folder), folder).record
    if record.encoding:
        raw = FittedEncoding.from_dict(record.encoding).transform(rows)
    else:
        raw = np.column_stack([rows.column(name).to_numpy() for name in record.feature_names])
    scaled = standardise(raw.astype(np.float64), record.scaler)
    return pa.table({name: scaled[:, index] for index, name in enumerate(record.feature_names)})


def feature_names(folder: str) -> list[str]:
    return read_manifest(*filesystem_for(folder), folder).record.feature_names


def export(folder: str, rows: pa.Table, **options):
    """The int8 export asked for, calibrated on `rows` as train rows."""
    return add_int8_export(
        folder, rows, "species", train_rows=train_rows(folder, rows), enabled=True, **options
    )


WRITERS = {
    "torch": lambda folder: (write_test_bundle(folder), blob_rows()),
    "raw_columns": lambda folder: (write_messy_bundle(folder), coded(messy_table())),
    "keras": lambda folder: (write_test_bundle(folder, framework="tensorflow"), blob_rows()),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Untrained dense MLP bundles and their test rows, each written when first asked for: torch from
    "features", torch from raw columns of every kind (string ops in the graph), Keras through tf2onnx."""
    root, made = tmp_path_factory.mktemp("int8-bundles"), {}

    def get(name: str) -> tuple[str, pa.Table]:
        if name not in made:
            made[name] = WRITERS[name](root / name)
        return made[name]

    return get


# TensorFlow's import, the SavedModel and tf2onnx take most of a minute: the Keras cases are slow.
KINDS = ["torch", "raw_columns", pytest.param("keras", marks=pytest.mark.slow)]


@pytest.fixture(params=KINDS)
def bundle_copy(request, written, tmp_path) -> tuple[str, pa.Table]:
    """A copy of one of the bundles, for a test to change."""
    folder, rows = written(request.param)
    return str(shutil.copytree(folder, tmp_path / "bundle")), rows


@pytest.fixture
def torch_copy(written, tmp_path) -> tuple[str, pa.Table]:
    folder, rows = written("torch")
    return str(shutil.copytree(folder, tmp_path / "bundle")), rows


SAME_ANSWERS = BatchFigures(400, 0, 0.0)


def figures(
    fp32: float = 0.9,
    int8_accuracy: float = 0.9,
    fp32_rate: float = 1e5,
    int8_rate: float = 2e5,
    batch: BatchFigures = SAME_ANSWERS,
):
    return Int8Figures(fp32, int8_accuracy, fp32_rate, int8_rate, rows=400, agreement=0.99, batch=batch)


def manifest_of(folder: str) -> dict:
    return json.loads((Path(folder) / MANIFEST).read_text())


def test_kept_where_the_accuracy_is_within_the_tolerance_and_int8_is_faster():
    kept, why = decide(figures(int8_accuracy=0.9 - TOLERANCE / 2, int8_rate=2.5e5))
    assert kept
    assert "0.8975" in why and "250,000 rows/s" in why


def test_dropped_where_the_accuracy_falls_beyond_the_tolerance_however_fast():
    kept, why = decide(figures(int8_accuracy=0.89, int8_rate=1e7), tolerance=0.005)
    assert not kept
    assert "0.0100 lower" in why and "tolerance of 0.005" in why


def test_dropped_where_int8_is_not_faster_even_when_more_accurate():
    kept, why = decide(figures(int8_accuracy=0.95, fp32_rate=1e5, int8_rate=1e5))
    assert not kept
    assert why.startswith("not faster on CPU")


def test_the_tolerance_is_inclusive():
    assert decide(figures(fp32=0.9, int8_accuracy=0.895), tolerance=0.005)[0]


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_dropped_without_test_rows_to_compare_on(torch_copy):
    folder, rows = torch_copy
    outcome = add_int8_export(
        folder, rows.slice(0, 0), "species", train_rows=train_rows(folder, rows), enabled=True
    )
    assert (outcome.kept, outcome.why) == (False, "no test rows to compare the two files on")
    assert manifest_of(folder)["export_checks"][EXPORT]["rows"] == 0
    assert not (Path(folder) / INT8_FILE).exists()
    check_files(folder)


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_quantized_weights_are_int8_and_the_answers_agree_with_fp32(bundle_copy, tmp_path):
    folder, rows = bundle_copy
    source, target = Path(folder) / "model.onnx", tmp_path / INT8_FILE
    weights = int8_quantize.quantize(
        source, target, train_rows(folder, rows).to_pandas().to_numpy(np.float32)
    )
    quantized = onnx.load(target)
    ops = Counter(node.op_type for node in quantized.graph.node)
    assert ops["QuantizeLinear"] == 2 and ops["DynamicQuantizeLinear"] == 0  # both dense layers' inputs
    untouched = {
        (node.op_type, tuple(node.input), tuple(node.output))
        for node in onnx.load(source).graph.node
        if node.op_type not in int8_quantize.QUANTIZED_OPS
    }  # the preprocessing in front of the model, and all but the dense layers behind it, stay float
    assert untouched <= {
        (node.op_type, tuple(node.input), tuple(node.output)) for node in quantized.graph.node
    }
    int8_tensors = {t.name for t in quantized.graph.initializer if t.data_type == onnx.TensorProto.INT8}
    assert len(weights) == 2 and set(weights) <= int8_tensors
    labels = next(t for t in quantized.graph.initializer if t.name == "serving/class_labels")
    assert labels.data_type == onnx.TensorProto.STRING  # the label's Gather is left alone
    assert {p.key: p.value for p in quantized.metadata_props} == {
        p.key: p.value for p in onnx.load(source).metadata_props
    }
    manifest = read_manifest(*filesystem_for(folder), folder)
    measured = int8.compare(source, target, manifest, rows, "species")
    assert measured.rows == rows.num_rows
    assert measured.agreement >= 0.9
    loaded = load_bundle(folder)
    expected = np.mean(loaded.predict_codes(rows) == rows.column("species").to_numpy())
    assert measured.fp32_accuracy == pytest.approx(expected)  # the float file scores as the bundle does
    assert measured.fp32_rows_per_second > 0 and measured.int8_rows_per_second > 0


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_a_kept_file_is_listed_with_its_digest_and_the_bundle_still_loads(bundle_copy, monkeypatch):
    folder, rows = bundle_copy
    monkeypatch.setattr(int8, "compare", lambda *args: figures(int8_rate=3e5))
    outcome = export(folder, rows)
    assert outcome.kept
    manifest = manifest_of(folder)
    assert manifest["files"][EXPORT] == INT8_FILE and INT8_FILE in manifest["digests"]
    check = manifest["export_checks"][EXPORT]
    assert check["kept"] and (check["fp32"], check["int8"]) == (0.9, 0.9)
    assert (check["fp32_rows_per_second"], check["int8_rows_per_second"]) == (1e5, 3e5)
    assert check["onnxruntime"] and check["quantized_weights"]
    assert not [note for note in manifest["export_notes"] if note.startswith(EXPORT)]
    check_files(folder)
    load_bundle(folder)


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_dropped_with_a_note_where_the_accuracy_falls_outside_the_tolerance(bundle_copy, monkeypatch):
    folder, rows = bundle_copy
    monkeypatch.setattr(int8, "compare", lambda *args: figures(int8_accuracy=0.8, int8_rate=1e6))
    outcome = export(folder, rows)
    assert not outcome.kept
    assert not (Path(folder) / INT8_FILE).exists()
    manifest = manifest_of(folder)
    assert EXPORT not in manifest["files"] and INT8_FILE not in manifest["digests"]
    assert manifest["export_checks"][EXPORT]["int8"] == 0.8
    assert manifest["export_checks"][EXPORT]["kept"] is False
    assert [note for note in manifest["export_notes"] if note.startswith(EXPORT)] == [
        f"{EXPORT} not kept: {outcome.why}"
    ]
    check_files(folder)
    load_bundle(folder)


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_a_second_call_replaces_what_the_first_recorded(torch_copy, monkeypatch):
    folder, rows = torch_copy
    monkeypatch.setattr(int8, "compare", lambda *args: figures(int8_rate=3e5))
    export(folder, rows)
    monkeypatch.setattr(int8, "compare", lambda *args: figures(int8_rate=1e4))
    export(folder, rows)
    manifest = manifest_of(folder)
    assert EXPORT not in manifest["files"] and not (Path(folder) / INT8_FILE).exists()
    assert len([note for note in manifest["export_notes"] if note.startswith(EXPORT)]) == 1
    check_files(folder)


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_the_real_check_records_both_figures_and_the_bundle_verifies_whichever_way_it_goes(torch_copy):
    folder, rows = torch_copy
    outcome = export(folder, rows)
    check = manifest_of(folder)["export_checks"][EXPORT]
    assert check["rows"] == rows.num_rows
    assert check["fp32_rows_per_second"] > 0 and check["int8_rows_per_second"] > 0
    assert (Path(folder) / INT8_FILE).exists() == outcome.kept == check["kept"]
    check_files(folder)
    load_bundle(folder)


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_a_bundle_without_an_onnx_export_is_left_as_it_is(torch_copy):
    folder, rows = torch_copy
    manifest = read_manifest(*filesystem_for(folder), folder)
    onnx_file = manifest.files.pop("onnx")
    manifest.digests.pop(onnx_file)
    (Path(folder) / onnx_file).unlink()
    write_manifest(folder, manifest)
    before = sorted((path.name, path.read_bytes()) for path in Path(folder).rglob("*") if path.is_file())
    outcome = export(folder, rows)
    assert (outcome.kept, outcome.check) == (False, None)
    assert "no ONNX export" in outcome.why
    assert (
        sorted((path.name, path.read_bytes()) for path in Path(folder).rglob("*") if path.is_file()) == before
    )


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_nothing_happens_unless_asked(torch_copy):
    folder, rows = torch_copy
    before = (Path(folder) / MANIFEST).read_bytes()
    outcome = add_int8_export(folder, rows, "species")
    assert (outcome.kept, outcome.why) == (False, "not requested")
    assert (Path(folder) / MANIFEST).read_bytes() == before and not (Path(folder) / INT8_FILE).exists()


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_a_scoring_failure_is_a_note_naming_the_stage(torch_copy):
    folder, rows = torch_copy
    outcome = add_int8_export(
        folder, rows.drop_columns(["f1"]), "species", train_rows=train_rows(folder, rows), enabled=True
    )
    assert not outcome.kept and outcome.why.startswith("not compared: ")
    assert not (Path(folder) / INT8_FILE).exists()
    check_files(folder)


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_a_quantizer_failure_is_a_note_not_an_error(torch_copy, monkeypatch):
    folder, rows = torch_copy

    def fail(source, target, calibration):
        Path(target).write_bytes(b"half a file")
        raise ValueError("no weights\nand pages of advice")

    monkeypatch.setattr(int8, "quantize", fail)
    outcome = export(folder, rows)
    assert (outcome.kept, outcome.why) == (False, "not quantized: ValueError: no weights")
    assert not (Path(folder) / INT8_FILE).exists()
    assert f"{EXPORT} not kept: not quantized: ValueError: no weights" in manifest_of(folder)["export_notes"]
    check_files(folder)


def test_dropped_where_answers_depend_on_the_batch_however_accurate_and_fast():
    kept, why = decide(figures(int8_rate=1e7, batch=BatchFigures(500, 3, 0.2)))
    assert not kept
    assert why == (
        "answers depend on the batch: 3 of 500 rows change class or lose their answer beside an extreme "
        "and a non-finite row"
    )


@pytest.mark.parametrize("shift", [PROBABILITY_SHIFT * 2, float("nan")])
def test_dropped_where_probabilities_move_with_the_batch_beyond_the_tolerance(shift):
    kept, why = decide(figures(batch=BatchFigures(500, 0, shift)))
    assert not kept
    assert why.startswith("answers depend on the batch: probabilities move by up to")


def test_probabilities_within_the_tolerance_are_the_same_answer():
    assert decide(figures(batch=BatchFigures(500, 0, PROBABILITY_SHIFT)))[0]


def calibration_table(rows: int = 5000) -> pa.Table:
    values = np.random.default_rng(7).normal(size=(rows, 3)).astype(np.float32)
    return pa.table({f"f{index}": values[:, index] for index in range(3)} | {"label": np.arange(rows) % 2})


def test_calibration_takes_a_seeded_bounded_sample_of_the_train_rows(tmp_path):
    table, names = calibration_table(), ["f0", "f1", "f2"]
    sample = int8_quantize.calibration_rows(table, names)
    assert sample.shape == (int8_quantize.CALIBRATION_ROWS, 3) and sample.dtype == np.float32
    np.testing.assert_array_equal(sample, int8_quantize.calibration_rows(table, names))
    pq.write_table(table, tmp_path / "train.parquet", row_group_size=1000)
    np.testing.assert_array_equal(
        sample, int8_quantize.calibration_rows(str(tmp_path / "train.parquet"), names)
    )
    assert not np.array_equal(sample, int8_quantize.calibration_rows(table, names, seed=1))
    assert len(int8_quantize.calibration_rows(table.slice(0, 10), names)) == 10
    with pytest.raises(ValueError, match="no rows to calibrate"):
        int8_quantize.calibration_rows(table.slice(0, 0), names)


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_quantizing_twice_writes_the_same_file(torch_copy, tmp_path):
    folder, rows = torch_copy
    calibration = int8_quantize.calibration_rows(train_rows(folder, rows), feature_names(folder))
    for name in ("first.onnx", "second.onnx"):
        int8_quantize.quantize(Path(folder) / "model.onnx", tmp_path / name, calibration)
    assert (tmp_path / "first.onnx").read_bytes() == (tmp_path / "second.onnx").read_bytes()


def scored(session, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    probabilities, labels = session.run(["probabilities", "label"], feeds)
    return probabilities, labels


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_a_row_is_answered_alike_alone_and_beside_a_huge_amount_and_an_inf(written, tmp_path):
    folder, _ = written("raw_columns")
    rows = coded(messy_table(rows=500, seed=3))
    calibration = int8_quantize.calibration_rows(
        train_rows(folder, coded(messy_table())), feature_names(folder)
    )
    target = tmp_path / INT8_FILE
    int8.quantize(Path(folder) / "model.onnx", target, calibration)
    encoding = FittedEncoding.from_dict(read_manifest(*filesystem_for(folder), folder).record.encoding)
    feeds = raw_feeds(rows, encoding)
    odd = {name: np.repeat(values[:1], 2, axis=0) for name, values in feeds.items()}
    odd["amount"] = np.array([[1e12], [np.inf]])
    session = onnx_session(str(target))
    alone = [
        scored(session, {name: values[row : row + 1] for name, values in feeds.items()}) for row in range(500)
    ]
    together = scored(session, {name: np.concatenate([feeds[name], odd[name]]) for name in feeds})
    alone_probabilities = np.concatenate([probabilities for probabilities, _ in alone])
    assert np.isfinite(alone_probabilities).all() and np.isfinite(together[0][:500]).all()
    assert together[1][:500].tolist() == [label for _, labels in alone for label in labels.tolist()]
    np.testing.assert_allclose(together[0][:500], alone_probabilities, rtol=0, atol=PROBABILITY_SHIFT)
    # The inf row is answered as model.onnx answers it: no class, not a saturated one.
    full = scored(onnx_session(str(Path(folder) / "model.onnx")), odd)
    assert np.isnan(full[0][1]).all() and np.isnan(together[0][501]).all()
    assert together[1][501] == full[1][1]
    assert np.isfinite(together[0][500]).all()  # the extreme row saturates: a class, maybe not fp32's


def dynamically_quantized(source, target, calibration):
    """The int8 file as dynamic quantization wrote it: one activation scale per batch."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(source)
    int8_quantize.one_opset_per_domain(model)
    quantize_dynamic(model, target, op_types_to_quantize=["MatMul", "Gemm"], weight_type=QuantType.QInt8)
    return int8_quantize.int8_weights(onnx.load(target))


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_the_gate_refuses_a_file_whose_answers_depend_on_the_batch(torch_copy, monkeypatch):
    folder, rows = torch_copy
    monkeypatch.setattr(int8, "quantize", dynamically_quantized)
    outcome = export(folder, rows)
    assert not outcome.kept and outcome.why.startswith("answers depend on the batch: ")
    check = manifest_of(folder)["export_checks"][EXPORT]
    assert check["batch"]["rows"] == rows.num_rows and check["batch"]["changed"] > 0
    assert not (Path(folder) / INT8_FILE).exists()
    check_files(folder)


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_the_real_quantizer_passes_the_batch_check(bundle_copy):
    folder, rows = bundle_copy
    check = export(folder, rows).check
    assert check["batch"]["changed"] == 0 and check["batch"]["shift"] <= PROBABILITY_SHIFT
    assert check["calibration"] == {
        "rows": rows.num_rows,
        "seed": 0,
        "at_most": int8_quantize.CALIBRATION_ROWS,
    }
