"""A bundle's MLflow model, checked without mlflow: the MLmodel file holds what MLflow's pyfunc flavor
reads, and the loader it names answers a DataFrame as the bundle does, in a process where this project's
code cannot be imported. `make serving-check` serves it with a real `mlflow models serve`."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import yaml

from tasks.core.bundle import mlflow_pyfunc
from tasks.core.bundle.loading import load_bundle
from tasks.core.bundle.mlflow_model import (
    KIND_VALUES_MODULE,
    KIND_VALUES_SOURCE,
    LOADER_MODULE,
    LOADER_SOURCE,
    write_mlflow_model,
)
from tasks.core.bundle.raw_inputs import raw_feeds
from tests.unit.bundle.encodings import numeric_encoding
from tests.unit.bundle.test_raw_row_exports import CLASSES, COLUMNS, scoring_rows

# Each test here writes a model export (torch.onnx, tf2onnx, a SavedModel): seconds, so not in make test-fast.
pytestmark = pytest.mark.slow

KINDS = {
    "amount": "numeric",
    "home city": "categorical",
    "member": "boolean",
    "joined": "date",
    "last_seen": "date",
}
MLFLOW_TYPES = {"amount": "double", "home city": "string", "member": "double", "joined": "datetime",
                "last_seen": "datetime"}  # fmt: skip


@pytest.fixture(scope="module")
def bundle_dir(mlflow_bundle) -> str:
    return mlflow_bundle  # tests/conftest.py: a process without the project reads it too


@pytest.fixture(scope="module")
def model_dir(mlflow_model_dir) -> Path:
    return mlflow_model_dir


def as_mlflow_casts(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows as the server hands them to the model after casting to the signature: numbers and
    booleans float64 with NaN, text as objects, dates naive datetime64[ns] in UTC."""
    return pd.DataFrame({
        "amount": frame["amount"].astype("float64"),
        "home city": frame["home city"].astype(object),
        "member": frame["member"].astype(object).astype("float64"),
        "joined": pd.to_datetime(frame["joined"]).astype("datetime64[ns]"),
        "last_seen": frame["last_seen"].dt.tz_convert("UTC").dt.tz_localize(None).astype("datetime64[ns]"),
    })  # fmt: skip


def test_the_mlmodel_holds_what_mlflow_s_pyfunc_flavor_reads(model_dir):
    mlmodel = yaml.safe_load((model_dir / "MLmodel").read_text())
    flavor = mlmodel["flavors"]["python_function"]
    assert flavor["loader_module"] == LOADER_MODULE
    assert (model_dir / flavor["code"] / f"{LOADER_MODULE}.py").read_text() == LOADER_SOURCE.read_text()
    code = model_dir / flavor["code"]
    assert (code / f"{KIND_VALUES_MODULE}.py").read_text() == KIND_VALUES_SOURCE.read_text()
    assert sorted(path.name for path in code.iterdir() if path.suffix == ".py") == sorted(
        [f"{KIND_VALUES_MODULE}.py", f"{LOADER_MODULE}.py"]
    )
    assert sorted(os.listdir(model_dir / flavor["data"])) == ["model.json", "model.onnx"]
    assert flavor["python_version"].count(".") == 2
    for environment in flavor["env"].values():
        assert (model_dir / environment).is_file()
    info = mlmodel["saved_input_example_info"]
    assert (info["type"], info["pandas_orient"]) == ("dataframe", "split")
    example = json.loads((model_dir / info["artifact_path"]).read_text())
    assert example["columns"] == COLUMNS and len(example["data"]) == 1
    assert json.loads((model_dir / info["serving_input_path"]).read_text()) == {"dataframe_split": example}


def test_the_signature_lists_every_raw_column_and_each_class(model_dir, bundle_dir):
    signature = yaml.safe_load((model_dir / "MLmodel").read_text())["signature"]
    inputs = json.loads(signature["inputs"])
    assert [spec["name"] for spec in inputs] == load_bundle(bundle_dir).input_columns == COLUMNS
    assert {spec["name"]: spec["type"] for spec in inputs} == MLFLOW_TYPES
    outputs = json.loads(signature["outputs"])
    assert [(spec["name"], spec["type"]) for spec in outputs] == [("prediction", "string")] + [
        (f"probability_{label}", "float") for label in CLASSES
    ]
    description = json.loads((model_dir / "model" / "model.json").read_text())
    assert description == {"columns": [{"name": name, "kind": KINDS[name]} for name in COLUMNS],
                           "class_labels": CLASSES}  # fmt: skip


def test_the_environment_pins_what_the_loader_imports(model_dir):
    requirements = (model_dir / "requirements.txt").read_text().split()
    pinned = {
        name: f"{name}=={importlib.metadata.version(name)}" for name in ("onnxruntime", "numpy", "pandas")
    }
    assert requirements == [*pinned.values(), "pyarrow>=16"]
    assert yaml.safe_load((model_dir / "python_env.yaml").read_text())["dependencies"] == [
        "-r requirements.txt"
    ]
    conda = yaml.safe_load((model_dir / "conda.yaml").read_text())
    assert conda["dependencies"][-1] == {"pip": requirements}
    assert imported(LOADER_SOURCE) == {
        "__future__", "json", "os", "numpy", "onnxruntime", "pandas", "pyarrow", KIND_VALUES_MODULE,
    }  # fmt: skip
    standard = {"__future__", "collections", "dataclasses", "re", "typing"}
    assert imported(KIND_VALUES_SOURCE) == {*standard, "numpy", "pyarrow"}  # shipped alone: no project import


def imported(source: Path) -> set[str]:
    """The top-level packages a file imports, but for the fallback of a `try` whose import failed with
    ImportError (the loader's import of this project, where the MLflow folder's module is absent)."""
    tree = ast.parse(source.read_text())
    fallbacks = {
        id(node)
        for handler in ast.walk(tree)
        if isinstance(handler, ast.ExceptHandler) and getattr(handler.type, "id", "") == "ImportError"
        for node in ast.walk(handler)
    }
    return {
        name.split(".")[0]
        for node in ast.walk(tree)
        if id(node) not in fallbacks
        for name in ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) else [])
    }  # fmt: skip


@pytest.mark.parametrize("form", ["arrow", "pandas", "as_mlflow_casts"])
def test_the_loader_s_inputs_are_what_raw_feeds_gives(model_dir, bundle_dir, form):
    rows = scoring_rows()
    frame = {"arrow": rows, "pandas": rows.to_pandas(), "as_mlflow_casts": as_mlflow_casts(rows.to_pandas())}[
        form
    ]
    feeds = mlflow_pyfunc.OnnxModel(str(model_dir / "model")).feeds(frame)
    expected = raw_feeds(rows, load_bundle(bundle_dir).encoding)
    assert list(feeds) == list(expected)
    for name, values in expected.items():
        assert feeds[name].dtype == values.dtype and feeds[name].shape == values.shape
        np.testing.assert_array_equal(feeds[name], values)


def test_values_in_other_forms_are_read_as_raw_feeds_reads_them(model_dir, bundle_dir):
    """Numbers as text, category codes as floats (-0.0 is 0), booleans as words, dates as ISO text with
    and without a zone, and blanks as missing values."""
    frame = pd.DataFrame({
        "amount": ["1e3", " 12 ", None, ""],
        "home city": [3.0, -0.0, float("nan"), 7.0],
        "member": ["Yes", "no", "", None],
        "joined": ["2024-01-31", "2024-01-31T12:00:00+02:00", "", None],
        "last_seen": ["2023-07-01T12:30:00.25Z", None, "1969-12-31T23:59:59", ""],
    }, dtype=object)  # fmt: skip
    feeds = mlflow_pyfunc.OnnxModel(str(model_dir / "model")).feeds(frame)
    expected = raw_feeds(frame, load_bundle(bundle_dir).encoding)
    assert expected["home city"][:, 0].tolist() == ["3", "0", "", "7"]
    for name, values in expected.items():
        np.testing.assert_array_equal(feeds[name], values)


@pytest.mark.parametrize("dtype_backend", ["default", "numpy_nullable"])
def test_a_frame_read_from_parquet_scores_as_the_server_s_casts_of_its_values(
    model_dir, tmp_path, dtype_backend
):
    """Whole numbers as int64 (Int64), booleans with gaps as objects (pandas' "boolean", pd.NA), as
    pandas reads them from parquet: what MLflow's in-process signature check refuses against "double",
    the model itself reads as the HTTP server's float64 casts of the same values."""
    import pyarrow.parquet as pq

    rows = scoring_rows()
    rows = rows.set_column(0, "amount", pa.array(np.arange(rows.num_rows) * 1_000 - 7, pa.int64()))
    pq.write_table(rows, tmp_path / "rows.parquet")
    backend = {} if dtype_backend == "default" else {"dtype_backend": dtype_backend}
    frame = pd.read_parquet(tmp_path / "rows.parquet", **backend)
    integers, booleans = ("Int64", "boolean") if dtype_backend == "numpy_nullable" else ("int64", "object")
    assert (str(frame["amount"].dtype), str(frame["member"].dtype)) == (integers, booleans)
    assert frame["member"].isna().any()
    served = as_mlflow_casts(rows.to_pandas())
    model = mlflow_pyfunc.OnnxModel(str(model_dir / "model"))
    assert model.get_raw_model() is model  # mlflow.pyfunc's get_raw_model(): predict without its check
    for name, values in model.feeds(served).items():
        np.testing.assert_array_equal(model.feeds(frame)[name], values)
    pd.testing.assert_frame_equal(model.predict(frame), model.predict(served))


@pytest.mark.parametrize(
    "column, values, refusal",
    [
        ("amount", ["12", "twelve"], "column 'amount' is read as numeric but holds 'twelve' at row 1"),
        ("amount", [1.0, float("inf")], "column 'amount' has an infinite value at row 1"),
        ("member", ["yes", "maybe"], "column 'member' is read as boolean but holds 'maybe' at row 1"),
        ("member", [1.0, 2.0], "column 'member' is read as boolean but holds 2.0 at row 1"),
        ("joined", ["2024-01-31", "soon"], "column 'joined' is read as date but holds 'soon' at row 1"),
    ],
)
def test_a_value_the_bundle_refuses_is_refused_by_column_and_row(model_dir, column, values, refusal):
    frame = scoring_rows().slice(0, 2).to_pandas().astype({column: object})
    frame[column] = values
    with pytest.raises(ValueError, match=refusal.replace("(", r"\(")):
        mlflow_pyfunc.OnnxModel(str(model_dir / "model")).predict(frame)


@pytest.mark.parametrize(
    "column, values, refusal",
    [
        ("amount", [1250.0, 7.5, "lots", 3.0], r"column 'amount' .* 'lots' \(str\) at row 2"),
        ("home city", ["oslo", None, 3.5, "rome"], r"column 'home city' .* 3.5 \(float\) at row 2"),
        ("member", [True, None, "yes", False], r"column 'member' .* 'yes' \(str\) at row 2"),
    ],
)
def test_a_column_of_mixed_types_is_refused_naming_the_column_and_value(model_dir, column, values, refusal):
    """An object column Arrow cannot hold as one type: refused naming it and its first misfit value,
    not with Arrow's ArrowInvalid."""
    frame = scoring_rows().slice(0, 4).to_pandas().astype({column: object})
    frame[column] = pd.Series(values, dtype=object)
    with pytest.raises(ValueError, match=f"{refusal}.*send one type a column") as refused:
        mlflow_pyfunc.OnnxModel(str(model_dir / "model")).predict(frame)
    assert not isinstance(refused.value, pa.ArrowException)


def test_a_missing_column_is_refused_by_name(model_dir):
    frame = scoring_rows().to_pandas().drop(columns=["member"])
    with pytest.raises(ValueError, match=r"missing columns \['member'\]"):
        mlflow_pyfunc.OnnxModel(str(model_dir / "model")).predict(frame)


def softmax_onnx(path: Path, n_features: int, single: bool = False) -> None:
    """An export that takes one "features" input, float64 `[rows, n]` (float32 with `single`, as an
    earlier release wrote it): probabilities = softmax(features)."""
    from onnx import TensorProto, helper, save

    kind = TensorProto.FLOAT if single else TensorProto.DOUBLE
    features = helper.make_tensor_value_info("features", kind, ["rows", n_features])
    probabilities = helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["rows", n_features])
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["features"], ["single"], to=TensorProto.FLOAT),
            helper.make_node("Softmax", ["single"], ["probabilities"], axis=1),
        ],
        "g",
        [features],
        [probabilities],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    save(model, str(path))


@pytest.mark.parametrize("single", [False, True], ids=["float64", "float32 of an earlier release"])
def test_an_export_of_numeric_features_gets_the_numbers_in_order_as_its_input_takes_them(tmp_path, single):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    softmax_onnx(bundle / "model.onnx", 2, single)
    manifest = {"files": {"weights": "model.pt", "onnx": "model.onnx"}, "feature_names": ["b", "a"],
                "class_labels": [0, 1], "label_kind": "integer", "encoding": numeric_encoding(["b", "a"], [0.5, -1.0]).to_dict(),
                "scaler": {"mean": [0.5, -1.0], "scale": [1.0, 1.0]}}  # fmt: skip
    assert write_mlflow_model(str(bundle), str(tmp_path / "mlflow"), manifest) is None
    signature = yaml.safe_load((tmp_path / "mlflow" / "MLmodel").read_text())["signature"]
    assert [(spec["name"], spec["type"]) for spec in json.loads(signature["inputs"])] == [
        ("b", "double"), ("a", "double")
    ]  # fmt: skip
    assert json.loads(signature["outputs"])[0] == {"type": "long", "name": "prediction", "required": True}
    example = json.loads((tmp_path / "mlflow" / "input_example.json").read_text())
    assert example == {"columns": ["b", "a"], "data": [[0.5, -1.0]]}
    model = mlflow_pyfunc.OnnxModel(str(tmp_path / "mlflow" / "model"))
    answer = model.predict(pd.DataFrame({"a": [3, 0], "b": ["1.5", "2"], "other": ["x", "y"]}))
    logits = np.array([[1.5, 3.0], [2.0, 0.0]], np.float32)
    expected = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert answer["prediction"].tolist() == [1, 0]
    np.testing.assert_allclose(answer[["probability_0", "probability_1"]].to_numpy(), expected, rtol=1e-6)


def test_a_bundle_without_an_onnx_export_gets_no_mlflow_model_and_a_note(tmp_path):
    manifest = {"files": {"weights": "model.pt"}, "feature_names": ["a"], "class_labels": ["x", "y"]}
    note = write_mlflow_model(str(tmp_path), str(tmp_path / "mlflow"), manifest)
    assert note == "mlflow not written: the bundle has no ONNX export, which the MLflow model serves"
    assert not (tmp_path / "mlflow").exists()


def test_an_onnx_export_the_manifest_lists_but_the_folder_lacks_gets_the_note(tmp_path):
    """The manifest read from the folder, where the caller gives none."""
    (tmp_path / "bundle.json").write_text(
        json.dumps({"files": {"weights": "model.npz", "onnx": "model.onnx"}})
    )
    note = write_mlflow_model(str(tmp_path), str(tmp_path / "mlflow"))
    assert note == "mlflow not written: the bundle has no ONNX export, which the MLflow model serves"


def test_an_arrow_record_batch_is_read_as_a_table(model_dir):
    rows = scoring_rows()
    model = mlflow_pyfunc.OnnxModel(str(model_dir / "model"))
    from_batch = model.predict(rows.combine_chunks().to_batches()[0])
    pd.testing.assert_frame_equal(from_batch, model.predict(rows))
    assert isinstance(rows, pa.Table) and from_batch.shape == (rows.num_rows, 1 + len(CLASSES))
