"""An MLflow model beside a bundle's exports: `mlflow models serve` on it takes a DataFrame with the raw
columns by name and answers the class label and one probability per class.

`write_mlflow_model(bundle_dir, out_dir)` writes, without importing mlflow (no image of this project
installs it), the folder MLflow's model format describes:

    MLmodel                    YAML: the python_function flavor, the signature and the input example
    code/mixedml_onnx_pyfunc.py  mlflow_pyfunc.py as it is: the flavor's `loader_module`
    code/mixedml_kind_values.py  tasks/core/data/kind_values.py as it is: how the loader reads each kind
    model/model.onnx           the bundle's ONNX export, copied
    model/model.json           the raw columns in the export's order with their kinds (and the ONNX input
                               of a column whose name the graph uses), the class labels
    input_example.json         one row, `dataframe_split` orient; serving_input_example.json as a request
    requirements.txt, python_env.yaml, conda.yaml   what the loader imports, pinned as installed here

MLflow's format, as its documentation gives it: a model is a folder whose MLmodel file lists flavors;
the python_function flavor's `loader_module` is imported with the flavor's `code` folder on sys.path
and its `_load_pyfunc(data_path)` called with the `data` path, which returns an object with
`predict(model_input)` (mlflow.pyfunc, "Filesystem format" and "Custom flavors":
https://mlflow.org/docs/latest/python_api/mlflow.pyfunc.html). A column-based signature is a JSON list
of `{"type", "name", "required"}` under `signature.inputs` and `.outputs`, and an input example is
named by `saved_input_example_info` (https://mlflow.org/docs/latest/ml/model/signatures). Its types
here, each kind's in its record (kind_exports.py): numbers and booleans "double" (MLflow casts a JSON
null to NaN, where a "boolean" column would read it as false), categories and text "string", dates
"datetime" (ISO text without a zone offset, taken as UTC).

At serving time the model needs onnxruntime, numpy, pandas and pyarrow, and neither Flyte nor this
project's code. It serves the ONNX export, so a bundle without one gets no MLflow model: the function
then writes nothing and returns a note saying why. A classification answers a label and its
probabilities; a regression its `prediction`, a number in the label's units.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasks.core.bundle.kind_exports import EXPORTS
from tasks.core.bundle.raw_inputs import onnx_input_names, takes_features
from tasks.core.data.api import FittedEncoding, kind_values

MLFLOW_FOLDER = "mlflow"  # where a bundle keeps its MLflow model
LOADER_MODULE = "mixedml_onnx_pyfunc"
LOADER_SOURCE = Path(__file__).with_name("mlflow_pyfunc.py")
# Copied beside the loader under the name it imports: the kinds' values, a module with no project imports.
KIND_VALUES_MODULE, KIND_VALUES_SOURCE = "mixedml_kind_values", Path(kind_values.__file__)
CODE, DATA = "code", "model"
ONNX_FILE, DESCRIPTION_FILE = "model.onnx", "model.json"
INPUT_EXAMPLE, SERVING_EXAMPLE = "input_example.json", "serving_input_example.json"
LABEL_TYPES = {"string": "string", "integer": "long", "float": "double", "boolean": "boolean"}
# What the loader imports. pyarrow is not pinned: each MLflow release caps the pyarrow it takes.
REQUIREMENTS = {"onnxruntime": ">=1.20", "numpy": ">=1.26", "pandas": ">=2.2", "pyarrow": ">=16"}
PINNED = ("onnxruntime", "numpy", "pandas")


def write_mlflow_model(bundle_dir: str, out_dir: str, manifest: dict[str, Any] | None = None) -> str | None:
    """Write the MLflow model of the local bundle folder `bundle_dir` into `out_dir` (created); None
    when written, else the note that says why not. `manifest`: bundle.json's content, where the caller
    holds it (write_bundle, before the manifest is written); read from the folder otherwise."""
    if manifest is None:
        manifest = json.loads((Path(bundle_dir) / "bundle.json").read_text(encoding="utf-8"))
    onnx = manifest.get("files", {}).get("onnx")
    if onnx is None or not (Path(bundle_dir) / onnx).is_file():
        return "mlflow not written: the bundle has no ONNX export, which the MLflow model serves"
    columns = input_columns(manifest)
    folder = Path(out_dir)
    (folder / DATA).mkdir(parents=True, exist_ok=True)
    (folder / CODE).mkdir(exist_ok=True)
    shutil.copyfile(Path(bundle_dir) / onnx, folder / DATA / ONNX_FILE)
    shutil.copyfile(LOADER_SOURCE, folder / CODE / f"{LOADER_MODULE}.py")
    shutil.copyfile(KIND_VALUES_SOURCE, folder / CODE / f"{KIND_VALUES_MODULE}.py")
    description = {"columns": columns, "class_labels": manifest["class_labels"]}
    if problem_type(manifest) == "regression":
        description["problem_type"] = "regression"
    write_json(folder / DATA / DESCRIPTION_FILE, description)
    example = input_example(manifest, columns)
    write_json(folder / INPUT_EXAMPLE, example)
    write_json(folder / SERVING_EXAMPLE, {"dataframe_split": example})
    write_environment(folder)
    write_yaml(folder / "MLmodel", mlmodel(manifest, columns))
    return None


def problem_type(manifest: dict[str, Any]) -> str:
    """classification, or regression: a manifest written before regressions has no target."""
    return manifest.get("target", {}).get("problem_type", "classification")


def input_columns(manifest: dict[str, Any]) -> list[dict[str, str]]:
    """The raw columns in the order the export reads them, with their kinds (the encoding's), and the
    ONNX input of a column not named as the column."""
    encoding = FittedEncoding.from_dict(manifest["encoding"])
    columns = [{"name": column.name, "kind": column.kind} for column in encoding.columns]
    if takes_features(encoding):
        return columns
    for column, name in zip(columns, onnx_input_names(encoding).values(), strict=True):
        if name != column["name"]:
            column["input"] = name
    return columns


def mlmodel(manifest: dict[str, Any], columns: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "flavors": {
            "python_function": {
                "loader_module": LOADER_MODULE,
                "code": CODE,
                "data": DATA,
                "env": {"conda": "conda.yaml", "virtualenv": "python_env.yaml"},
                "python_version": platform.python_version(),
                "streamable": False,
            }
        },
        "model_uuid": uuid.uuid4().hex,
        "utc_time_created": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f"),
        "signature": signature(manifest, columns),
        "saved_input_example_info": {
            "artifact_path": INPUT_EXAMPLE,
            "serving_input_path": SERVING_EXAMPLE,
            "type": "dataframe",
            "pandas_orient": "split",
        },
    }


def signature(manifest: dict[str, Any], columns: list[dict[str, str]]) -> dict[str, Any]:
    """MLflow's column-based signature: each list a JSON string, as MLflow writes it."""
    inputs = [
        {"type": EXPORTS[column["kind"]].mlflow_type, "name": column["name"], "required": True}
        for column in columns
    ]
    if problem_type(manifest) == "regression":
        outputs = [{"type": "double", "name": "prediction", "required": True}]
        return {"inputs": json.dumps(inputs), "outputs": json.dumps(outputs), "params": None}
    label_type = LABEL_TYPES[manifest.get("label_kind", "string")]
    outputs = [{"type": label_type, "name": "prediction", "required": True}] + [
        {"type": "float", "name": f"probability_{label}", "required": True}
        for label in manifest["class_labels"]
    ]
    return {"inputs": json.dumps(inputs), "outputs": json.dumps(outputs), "params": None}


def input_example(manifest: dict[str, Any], columns: list[dict[str, str]]) -> dict[str, Any]:
    """One row, `dataframe_split` orient: each column's value for a missing one (a number's or a date's
    fill, a boolean's rounded), a category its first vocabulary value."""
    if not manifest.get("encoding"):
        return {"columns": [column["name"] for column in columns], "data": [manifest["scaler"]["mean"]]}
    encoding = FittedEncoding.from_dict(manifest["encoding"])
    return {
        "columns": [column.name for column in encoding.columns],
        "data": [[EXPORTS[column.kind].example(column.encoder) for column in encoding.columns]],
    }


def requirements() -> list[str]:
    """The loader's imports: pinned to the versions installed here, or their floors where absent."""
    lines = []
    for name, floor in REQUIREMENTS.items():
        try:
            installed = importlib.metadata.version(name) if name in PINNED else None
        except importlib.metadata.PackageNotFoundError:
            installed = None
        lines.append(f"{name}=={installed}" if installed else f"{name}{floor}")
    return lines


def write_environment(folder: Path) -> None:
    """requirements.txt, and the virtualenv and conda environments MLflow builds from it."""
    pins = requirements()
    (folder / "requirements.txt").write_text("\n".join(pins) + "\n", encoding="utf-8")
    python = platform.python_version()
    write_yaml(
        folder / "python_env.yaml",
        {
            "python": python,
            "build_dependencies": ["pip", "setuptools", "wheel"],
            "dependencies": ["-r requirements.txt"],
        },
    )
    write_yaml(
        folder / "conda.yaml",
        {
            "name": "mlflow-env",
            "channels": ["conda-forge"],
            "dependencies": [f"python={python}", "pip", {"pip": pins}],
        },
    )


def write_json(path: Path, content: Any) -> None:
    path.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")


def write_yaml(path: Path, content: dict[str, Any]) -> None:
    import yaml  # here: the bundle loader is imported where only numpy, pandas and pyarrow may be

    path.write_text(yaml.safe_dump(content, sort_keys=False), encoding="utf-8")
