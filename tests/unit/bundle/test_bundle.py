"""Model bundles: written from real torch and Keras training runs, loaded back without Flyte, and
scoring raw rows as the prepared test split scores them; raw rows of text, booleans, dates and missing
values through the bundle's encoding; and bundles written before encodings existed, as they scored."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.core.bundle import manifest as bundles
from tasks.core.bundle.digests import MANIFEST_DIGEST
from tasks.core.bundle.loading import load_bundle
from tasks.core.bundle.manifest import BundleRecord
from tasks.core.bundle.table_input import BundleError
from tasks.core.bundle.writing import add_metrics, write_bundle
from tasks.core.data.assignment import SplitConfig
from tasks.core.data.encoding import FittedEncoding
from tasks.core.data.files import DatasetError
from tasks.core.data.prepare import prepare_dataset
from tasks.core.data.scaling import standardise
from tasks.core.evaluation.metrics import classification_metrics
from tasks.core.models.plugins import ModelError, mlp_spec
from tasks.core.training.config import TrainConfig
from tasks.core.training.records import Hardware
from tests.conftest import blobs_frame
from tests.floats import assert_scored_alike
from tests.unit.publish.test_publish import (
    MESSY_COLUMNS,
    MESSY_READ,
    messy_prepared,
    messy_table,
    write_test_bundle,
)

REPO = Path(__file__).resolve().parents[3]
CONFIG = TrainConfig(epochs=5, batch_size=32, learning_rate=1e-2, model=mlp_spec([32]), seed=1)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The blobs prepared as the pipeline prepares them: standardised train/val, raw test split."""
    root = tmp_path_factory.mktemp("bundle-data")
    blobs_frame(n_rows=400).to_parquet(root / "blobs.parquet", index=False)
    return prepare_dataset(
        str(root / "blobs.parquet"), "species", str(root / "prepared"), SplitConfig(seed=0)
    )


def record_of(prepared, run) -> BundleRecord:
    return BundleRecord.of(prepared.table, run, Hardware("cpu", 1), data_fingerprint="0" * 32)


@pytest.fixture(scope="module")
def torch_bundle(prepared, tmp_path_factory):
    from tasks.core.training.torch_training import train

    root = tmp_path_factory.mktemp("torch-bundle")
    outcome = train(CONFIG, prepared.split_paths(), str(root / "model.pt"))
    folder = write_bundle(str(root / "bundle"), str(root / "model.pt"), record_of(prepared, outcome.run))
    return SimpleNamespace(
        folder=folder, artifact=str(root / "model.pt"), record=record_of(prepared, outcome.run)
    )


@pytest.fixture(scope="module")
def keras_bundle(prepared, tmp_path_factory):
    from tasks.core.training.tf_strategy import Environment
    from tasks.core.training.tf_training import train_keras

    root = tmp_path_factory.mktemp("keras-bundle")
    outcome = train_keras(CONFIG, prepared.split_paths(), str(root / "model.npz"), env=Environment())
    folder = write_bundle(str(root / "bundle"), str(root / "model.npz"), record_of(prepared, outcome.run))
    return SimpleNamespace(
        folder=folder, artifact=str(root / "model.npz"), record=record_of(prepared, outcome.run)
    )


@pytest.fixture(params=["torch_bundle", "keras_bundle"])
def written(request):
    return request.getfixturevalue(request.param)


def split_table(prepared) -> pa.Table:
    return pq.read_table(prepared.paths["test"])


def users_rows(prepared):
    """The test split's rows as a user holds them: columns shuffled, an id column and the text labels."""
    table = split_table(prepared)
    frame = table.to_pandas()
    frame["species"] = np.asarray(prepared.table.class_labels)[frame["species"]]
    frame.insert(0, "customer_id", [f"c{i}" for i in range(len(frame))])
    return frame[["f2", "customer_id", "f0", "species", "f3", "f1"]]


@pytest.mark.slow
def test_the_bundle_scores_the_raw_test_split_as_the_trained_model_scores_its_standardised_rows(
    written, prepared
):
    loaded = load_bundle(written.folder)
    table = split_table(prepared)
    codes = loaded.predict_codes(table)
    raw = np.column_stack([table.column(name).to_numpy() for name in prepared.table.feature_names])
    inputs = standardise(raw, prepared.table.scaler)
    if loaded.manifest.record.framework == "pytorch":
        from tasks.core.models.torch_models import predict

        expected = predict(loaded.model, inputs)
    else:
        from tasks.core.bundle.loading import keras_logits

        expected = keras_logits(loaded.model, inputs).argmax(axis=1)
    np.testing.assert_array_equal(codes, expected)
    assert (codes == table.column("species").to_numpy()).mean() >= 0.9


@pytest.mark.slow  # `written` is a trained bundle (its fixtures train: TRAINING_FIXTURES)
def test_shuffled_columns_and_extra_ids_predict_what_the_test_split_did(written, prepared):
    loaded = load_bundle(written.folder)
    expected = loaded.labels(loaded.predict_codes(split_table(prepared)))  # as evaluation scores it
    frame = users_rows(prepared)
    predicted = loaded.predict(frame)
    assert predicted.tolist() == expected.tolist()
    assert set(predicted) <= set(prepared.table.class_labels) and isinstance(predicted[0], str)
    probabilities = loaded.predict_proba(pa.Table.from_pandas(frame, preserve_index=False))
    assert probabilities.dtype == np.float32 and probabilities.shape == (len(frame), 3)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    batch = pa.RecordBatch.from_pandas(frame.iloc[:7], preserve_index=False)
    assert loaded.predict(batch).tolist() == expected[:7].tolist()


def test_the_manifest_records_the_run_and_what_the_folder_holds(torch_bundle, prepared):
    manifest = json.loads((Path(torch_bundle.folder) / bundles.MANIFEST).read_text())
    assert manifest["format_version"] == bundles.FORMAT_VERSION == 3
    assert manifest["framework"] == "pytorch"
    assert manifest["model"]["model"] == {
        "builder": "mlp",
        "input_shape": "",
        "options": CONFIG.model.options,
    }
    assert manifest["model"]["input"] == {"n_features": 4, "n_classes": 3}
    assert manifest["feature_names"] == ["f0", "f1", "f2", "f3"]
    assert manifest["scaler"] == {"mean": prepared.table.scaler.mean, "scale": prepared.table.scaler.scale}
    assert manifest["class_labels"] == ["setosa", "versicolor", "virginica"]
    assert manifest["run"]["history"][-1]["epoch"] == CONFIG.epochs
    assert manifest["billed"]["accelerator"] == "cpu" and manifest["metrics"] is None
    assert {"python", "numpy", "pyarrow", "torch"} <= set(manifest["packages"])
    assert manifest["files"]["weights"] == "model.pt"
    for path in manifest["files"].values():
        assert (Path(torch_bundle.folder) / path).exists()
    assert Path(torch_bundle.folder, "model.pt").read_bytes() == Path(torch_bundle.artifact).read_bytes()


def test_evaluation_metrics_are_added_to_the_manifest(torch_bundle, prepared, tmp_path):
    folder = shutil.copytree(torch_bundle.folder, tmp_path / "bundle")
    loaded = load_bundle(str(folder))
    truth = split_table(prepared).column("species").to_numpy()
    metrics = classification_metrics(
        truth, loaded.predict_codes(split_table(prepared)), prepared.table.class_labels
    )
    add_metrics(str(folder), metrics)
    assert load_bundle(str(folder)).manifest.record.metrics == metrics
    manifest = json.loads((folder / bundles.MANIFEST).read_text())
    assert manifest["metrics"]["accuracy"] == metrics.accuracy and manifest["metrics"]["n_test"] == len(truth)
    assert [path.name for path in folder.iterdir() if path.name.startswith(".")] == []


@pytest.mark.parametrize(
    "labels, kind, typed",
    [(["3", "7", "10"], "integer", [3, 7, 10]), (["0.5", "1.5", "2.0"], "float", [0.5, 1.5, 2.0])],
)
@pytest.mark.slow
def test_numeric_labels_come_back_as_numbers(torch_bundle, prepared, tmp_path, labels, kind, typed):
    record = replace(torch_bundle.record, class_labels=labels, label_kind=kind)
    folder = write_bundle(str(tmp_path / "bundle"), torch_bundle.artifact, record)
    assert json.loads((Path(folder) / bundles.MANIFEST).read_text())["class_labels"] == typed
    loaded = load_bundle(folder)
    assert loaded.class_labels == typed and loaded.manifest.record.class_labels == labels
    predicted = loaded.predict(users_rows(prepared))
    assert predicted.dtype.kind == ("i" if kind == "integer" else "f")
    codes = loaded.predict_codes(split_table(prepared))
    assert predicted.tolist() == [typed[code] for code in codes]


def test_a_record_that_does_not_fit_the_weights_is_refused(torch_bundle, tmp_path):
    record = replace(torch_bundle.record, class_labels=["a", "b"])  # the weights have 3 classes
    with pytest.raises(ModelError, match=r"expected \[4, 2\]"):
        write_bundle(str(tmp_path / "bundle"), torch_bundle.artifact, record)


def test_a_missing_feature_is_refused_by_name(torch_bundle, prepared):
    loaded = load_bundle(torch_bundle.folder)
    frame = users_rows(prepared).drop(columns=["f1"])
    for table in (frame, pa.Table.from_pandas(frame, preserve_index=False)):
        with pytest.raises(BundleError, match=r"scores\.csv: missing feature column 'f1'; the model reads 4"):
            loaded.predict(table, source="scores.csv")
    with pytest.raises(BundleError, match="missing feature 2 columns 'f1', 'f3'"):
        loaded.check_columns(pa.schema([("f0", pa.float64()), ("f2", pa.float64())]))


def strip_to_format_1(folder: Path) -> None:
    """The manifest as bundles were written before encodings existed: format 1, no raw columns, no
    encoding, no digest of its own."""
    path = folder / bundles.MANIFEST
    manifest = json.loads(path.read_text())
    del manifest["columns"], manifest["encoding"], manifest[MANIFEST_DIGEST]
    path.write_text(json.dumps({**manifest, "format_version": 1}))


@pytest.fixture(scope="module")
def format_1_bundle(torch_bundle, tmp_path_factory) -> str:
    """The trained bundle as it was written before encodings existed: its features are numbers."""
    folder = shutil.copytree(torch_bundle.folder, tmp_path_factory.mktemp("format-1") / "bundle")
    strip_to_format_1(folder)
    return str(folder)


def test_a_format_1_bundle_loads_and_scores_as_it_did(format_1_bundle, torch_bundle, prepared):
    """Upgraded as it is read: its features are numeric columns, each encoded as it is."""
    old, current = load_bundle(format_1_bundle), load_bundle(torch_bundle.folder)
    assert old.input_columns == old.feature_names == ["f0", "f1", "f2", "f3"]
    assert old.manifest.format_version == 1 and old.manifest.record.columns == old.feature_names
    assert [column.kind for column in old.encoding.columns] == ["numeric"] * 4
    table = split_table(prepared)
    raw = np.column_stack([table.column(name).to_numpy() for name in old.feature_names])
    np.testing.assert_array_equal(old.features(table), raw)
    np.testing.assert_array_equal(old.predict_proba(users_rows(prepared)), current.predict_proba(table))


def with_value(frame, column: str, rows: list[int], value):
    frame = frame.copy()
    frame[column] = frame[column].astype(object if isinstance(value, str) else float)
    frame.loc[rows, column] = value
    return frame


BAD_VALUES = {
    "infinite": lambda f: with_value(f, "f0", [2, 5], np.inf),
    "text among numbers": lambda f: with_value(f, "f1", [4], "n/a"),
    "a text column": lambda f: f.assign(f3="tall"),
}


def refusal(bundle, frame) -> str:
    with pytest.raises(DatasetError) as error:
        bundle.predict(frame, source="new.parquet")
    return str(error.value)


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_a_format_1_bundle_refuses_bad_values_as_a_current_one_does(
    format_1_bundle, torch_bundle, prepared, case
):
    frame = BAD_VALUES[case](users_rows(prepared))
    message = refusal(load_bundle(format_1_bundle), frame)
    assert message.startswith("new.parquet: ") and message == refusal(load_bundle(torch_bundle.folder), frame)


def test_a_format_1_bundle_answers_a_missing_value_as_a_current_one_does(
    format_1_bundle, torch_bundle, prepared
):
    """A missing number takes the train mean, as in any bundle whose train rows had none missing."""
    frame = with_value(users_rows(prepared), "f2", [3, 7], np.nan)
    np.testing.assert_array_equal(
        load_bundle(format_1_bundle).predict(frame), load_bundle(torch_bundle.folder).predict(frame)
    )


def rewrite_manifest(folder: Path, **changes) -> None:
    path = folder / bundles.MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("version", [4, "2", None])
def test_a_format_version_this_code_does_not_read_is_refused(torch_bundle, tmp_path, version):
    folder = shutil.copytree(torch_bundle.folder, tmp_path / "bundle")
    rewrite_manifest(folder, format_version=version)
    with pytest.raises(BundleError) as error:
        load_bundle(str(folder))
    message = str(error.value)
    assert str(folder / bundles.MANIFEST) in message
    assert f"format version {version!r}; this code reads formats 1, 2 and 3" in message


def test_a_folder_without_a_readable_manifest_is_refused(torch_bundle, tmp_path):
    with pytest.raises(
        BundleError, match=f"{tmp_path}/bundle.json: no such file.*a folder holding bundle.json"
    ):
        load_bundle(str(tmp_path))
    folder = shutil.copytree(torch_bundle.folder, tmp_path / "broken")
    (folder / bundles.MANIFEST).write_text("{not json")
    with pytest.raises(BundleError, match="broken/bundle.json: not valid JSON"):
        load_bundle(str(folder))
    (folder / bundles.MANIFEST).write_text(json.dumps({"format_version": 1, "framework": "pytorch"}))
    with pytest.raises(BundleError, match="not a bundle manifest this code reads: feature_names is missing"):
        load_bundle(str(folder))
    manifest = json.loads(Path(torch_bundle.folder, bundles.MANIFEST).read_text())
    rewrite_manifest(folder, **{**manifest, "run": {**manifest["run"], "world_size": "two"}})
    with pytest.raises(BundleError, match="reads: run.world_size: invalid value 'two'"):
        load_bundle(str(folder))
    with pytest.raises(BundleError, match="nosuchprotocol://x: cannot open this URI"):
        load_bundle("nosuchprotocol://x")


@pytest.mark.slow  # `written` is a trained bundle (its fixtures train: TRAINING_FIXTURES)
def test_a_bundle_is_read_through_an_fsspec_uri(written, prepared):
    memory = fsspec.filesystem("memory")
    target = f"/bundles/{Path(written.folder).parent.name}"
    memory.put(written.folder, target, recursive=True)
    expected = load_bundle(written.folder).predict(users_rows(prepared))
    for uri in (f"memory://{target}", f"file://{written.folder}"):
        assert load_bundle(uri).predict(users_rows(prepared)).tolist() == expected.tolist()
    memory.rm(f"{target}/{'model.pt' if 'torch' in target else 'model.npz'}")
    with pytest.raises(BundleError, match="no such file"):
        load_bundle(f"memory://{target}")
    memory.rm(target, recursive=True)


LOAD_WITHOUT_FLYTE = """
import json, sys
sys.modules["flytekit"] = None  # importing flytekit now fails
import pandas as pd
from tasks.core.bundle.loading import load_bundle
assert not {"torch", "tensorflow", "keras"} & set(sys.modules), "tasks.core.bundle.loading imports a framework"
rows = pd.read_parquet(sys.argv[1])
print(json.dumps([load_bundle(folder).predict(rows).tolist() for folder in sys.argv[2:]]))
"""


@pytest.mark.slow
def test_bundles_load_and_predict_where_flytekit_cannot_be_imported(
    torch_bundle, keras_bundle, prepared, tmp_path
):
    rows = tmp_path / "rows.parquet"
    users_rows(prepared).to_parquet(rows, index=False)
    folders = [torch_bundle.folder, keras_bundle.folder]
    result = subprocess.run(
        [sys.executable, "-c", LOAD_WITHOUT_FLYTE, str(rows), *folders],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    expected = [load_bundle(folder).predict(users_rows(prepared)).tolist() for folder in folders]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected


def test_a_value_beyond_float32_once_standardised_is_refused_naming_column_and_row(torch_bundle, prepared):
    rows = users_rows(prepared).reset_index(drop=True)
    rows.loc[3, "f1"] = 1e300  # finite in float64, as a user's file may hold it
    with pytest.raises(DatasetError, match=r"'f1' at row 3 holds 1e\+300.*beyond float32's range"):
        load_bundle(torch_bundle.folder).predict(rows)


# ---- raw rows through the bundle's encoding ------------------------------------------------------------


@pytest.fixture(scope="module")
def messy(tmp_path_factory):
    """An untrained MLP over a table of text, booleans, dates and missing values, as a bundle."""
    table = messy_table()
    prepared_table = messy_prepared(table)
    folder = write_test_bundle(tmp_path_factory.mktemp("messy") / "bundle", seed=3, table=prepared_table)
    encoding = FittedEncoding.from_dict(json.loads(prepared_table.encoding))
    return SimpleNamespace(folder=folder, table=table, prepared=prepared_table, encoding=encoding)


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_raw_rows_of_text_booleans_dates_and_nulls_are_encoded_standardised_and_scored(messy):
    from tasks.core.models.torch_models import predict

    loaded = load_bundle(messy.folder)
    table = messy.table
    assert all(table.column(name).null_count for name in MESSY_READ)
    assert (
        np.isnan(table.column("amount").to_numpy(zero_copy_only=False)).sum()
        > table.column("amount").null_count
    )
    encoded = messy.encoding.transform(table)
    np.testing.assert_array_equal(loaded.features(table), encoded)
    codes = loaded.predict_codes(table)
    np.testing.assert_array_equal(codes, predict(loaded.model, standardise(encoded, messy.prepared.scaler)))
    assert len(set(codes)) > 1, "an untrained model that predicts one class tests little"
    probabilities = loaded.predict_proba(table)
    assert probabilities.dtype == np.float32 and probabilities.shape == (table.num_rows, 3)
    assert loaded.predict(table).tolist() == np.asarray(loaded.class_labels)[codes].tolist()


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_messy_rows_in_any_order_with_extra_columns_from_pandas_or_arrow_score_alike(messy):
    loaded = load_bundle(messy.folder)
    expected = loaded.predict_proba(messy.table)
    order = ["joined", "species", "member", "customer_id", "city", "amount", "region"]
    shuffled = messy.table.select(order).append_column("note", pa.array(["x"] * messy.table.num_rows))
    np.testing.assert_array_equal(loaded.predict_proba(shuffled), expected)
    np.testing.assert_array_equal(loaded.predict_proba(shuffled.to_pandas()), expected)
    batch = shuffled.to_batches()[0].slice(40, 9)
    assert_scored_alike(loaded.predict_proba(batch, first_row=40), expected[40:49])  # 9 rows, not 270


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_a_missing_raw_column_is_named_and_a_column_left_out_may_be_absent(messy):
    loaded = load_bundle(messy.folder)
    assert loaded.input_columns == MESSY_READ and loaded.manifest.record.columns == MESSY_COLUMNS
    for table in (messy.table.drop_columns(["joined"]), messy.table.drop_columns(["joined"]).to_pandas()):
        with pytest.raises(
            BundleError, match=r"rows\.parquet: missing feature column 'joined'; the model reads 4 columns"
        ):
            loaded.predict(table, source="rows.parquet")
    without_left_out = messy.table.drop_columns(["customer_id", "region", "species"])
    np.testing.assert_array_equal(loaded.predict_proba(without_left_out), loaded.predict_proba(messy.table))


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_dates_as_iso_text_score_as_dates_and_a_value_not_of_its_kind_is_named(messy):
    loaded = load_bundle(messy.folder)
    rows = messy.table.slice(0, 8).to_pandas()
    rows["joined"] = [day.isoformat() if day else None for day in rows["joined"]]  # as a CSV holds them
    np.testing.assert_array_equal(loaded.predict_proba(rows), loaded.predict_proba(messy.table.slice(0, 8)))
    rows.loc[5, "joined"] = "soon"
    with pytest.raises(
        DatasetError, match=r"^new\.csv: feature column 'joined' is read as date but holds 'soon' at row 105"
    ):
        loaded.predict(rows, source="new.csv", first_row=100)
    as_numbers = messy.table.set_column(4, "joined", pa.array(range(messy.table.num_rows)))
    for check in (loaded.predict, lambda table: loaded.check_columns(table.schema)):
        with pytest.raises(DatasetError, match="'joined' has type int64, which cannot be read as date"):
            check(as_numbers)


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_the_manifest_holds_the_raw_columns_and_the_encoding_and_its_raw_row_export(messy):
    manifest = json.loads((Path(messy.folder) / bundles.MANIFEST).read_text())
    assert manifest["format_version"] == 3
    assert manifest["columns"] == MESSY_COLUMNS
    assert manifest["encoding"] == messy.encoding.to_dict() == json.loads(messy.prepared.encoding)
    assert manifest["feature_names"] == messy.encoding.encoded_names() == messy.prepared.feature_names
    assert manifest["model"]["input"] == {"n_features": len(messy.prepared.feature_names), "n_classes": 3}
    assert manifest["files"] == {"weights": "model.pt", "onnx": "model.onnx", "mlflow": "mlflow"}
    assert manifest["export_notes"] == []
    assert sorted(os.listdir(messy.folder)) == [bundles.MANIFEST, "mlflow", "model.onnx", "model.pt"]


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda encoding: {**encoding, "version": 99}, "the feature encoding cannot be read: ValueError: a feature encoding of version 99"),
        (lambda encoding: {**encoding, "columns": encoding["columns"][1:]}, "the encoding gives the features city=rome"),
        (lambda encoding: {**encoding, "columns": [{**encoding["columns"][0], "kind": "text"}]}, "the feature encoding cannot be read"),
    ],
)  # fmt: skip
@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_an_encoding_that_does_not_fit_the_bundle_is_refused(messy, tmp_path, change, words):
    folder = shutil.copytree(messy.folder, tmp_path / "bundle")
    manifest = json.loads((folder / bundles.MANIFEST).read_text())
    rewrite_manifest(folder, encoding=change(manifest["encoding"]))
    with pytest.raises(BundleError) as error:
        load_bundle(str(folder))
    assert str(folder / bundles.MANIFEST) in str(error.value) and words in str(error.value)


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_an_encoding_that_reads_a_column_the_input_did_not_have_is_refused(messy, tmp_path):
    folder = shutil.copytree(messy.folder, tmp_path / "bundle")
    rewrite_manifest(folder, columns=["customer_id", "amount"])
    with pytest.raises(
        BundleError, match="the encoding reads 'city', 'member', 'joined', which are not among"
    ):
        load_bundle(str(folder))
