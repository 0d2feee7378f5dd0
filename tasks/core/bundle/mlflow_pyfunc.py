"""The code of a bundle's MLflow model: MLflow's python_function flavor imports it by its
`loader_module` name and calls `_load_pyfunc(data_path)`, whose `predict(frame)` scores a DataFrame.

`mlflow_model.write_mlflow_model` copies this file into the MLflow model's code/ folder, which MLflow
puts on sys.path, and beside it tasks/core/data/kind_values.py as `mixedml_kind_values`. It needs
onnxruntime, numpy, pandas and pyarrow, and no other code of this project, so a server that has only the
MLflow model folder runs it.

`data_path` is the model's data folder: model.onnx (the bundle's ONNX export) and model.json (the raw
columns in the order the export reads them, each with its kind and, where the export names it otherwise,
its "input"; and the class labels). `predict` reads the columns by name and turns them into the
export's inputs as the bundle reads a table:
- an export that takes one "features" input (numeric columns): the numbers float64 `[rows, columns]`
  (float32 where an earlier release wrote the file so);
- an export that takes the raw columns: one `[rows, 1]` input per column, text for categories and free
  text ('' where missing), float64 for numbers and booleans (NaN where missing) and for dates (seconds
  since 1970 UTC).
Each value is read, and sent to the export, as the bundle reads and sends its kind: by the kind's
record in kind_values.py, which preprocessing and `raw_inputs.raw_feeds` read too.

It answers a DataFrame: "prediction", the class label as the label column held it, then one
"probability_<label>" column per class, float32, in the order of the class labels; a regression's
"prediction" is a number in the label's units (a whole number where the label held integers: the
export rounds it, as the bundle does). A column Arrow cannot hold as one type (numbers and text in one
object column) is refused naming it and its first value that does not fit.

A column of any type the bundle reads is read: int64 numbers, pandas' nullable booleans ("boolean", with
pd.NA) and Int64 as a frame read from parquet holds them, score as the HTTP server's float64 casts of
the same values. `mlflow.pyfunc.load_model(...).predict` checks a frame against the signature before it
reaches this code and refuses those types against "double" (mlflow/models/utils.py,
`_enforce_mlflow_datatype`: int64, unless every value is 0 or 1, and booleans are not safe casts);
`get_raw_model()` is this model, whose `predict` takes the frame as it is.
"""

from __future__ import annotations

import json
import os

import numpy as np
import onnxruntime
import pandas as pd
import pyarrow as pa

try:  # in the MLflow model's code folder, beside this file
    import mixedml_kind_values as kind_values
except ImportError:  # in this project
    from tasks.core.data.api import kind_values

ONNX_FILE = "model.onnx"
DESCRIPTION_FILE = "model.json"
FEATURES = "features"
PROBABILITIES = "probabilities"
PREDICTION = "prediction"  # a regression's one output


def _load_pyfunc(data_path: str) -> OnnxModel:
    """The entry point MLflow's python_function flavor calls with the flavor's `data` folder."""
    return OnnxModel(data_path)


class OnnxModel:
    def __init__(self, folder: str) -> None:
        with open(os.path.join(folder, DESCRIPTION_FILE), encoding="utf-8") as file:
            description = json.load(file)
        self.columns = [(column["name"], column["kind"]) for column in description["columns"]]
        self.inputs = [column.get("input", column["name"]) for column in description["columns"]]
        self.class_labels = list(description["class_labels"])
        self.regression = description.get("problem_type") == "regression"
        self.session = onnxruntime.InferenceSession(
            os.path.join(folder, ONNX_FILE), providers=["CPUExecutionProvider"]
        )
        inputs = [value.name for value in self.session.get_inputs()]
        self.takes_features = inputs == [FEATURES]
        # float64, or float32 in a file an earlier release wrote, which a folder made from it now reads
        single = self.session.get_inputs()[0].type == "tensor(float)"
        self.features_dtype = np.float32 if single else np.float64
        if not self.takes_features and inputs != self.inputs:
            raise ValueError(f"{ONNX_FILE} takes the inputs {inputs}, not those {DESCRIPTION_FILE} lists")

    def get_raw_model(self) -> OnnxModel:
        """What MLflow's `PyFuncModel.get_raw_model()` returns: this model, whose `predict` reads a frame
        without MLflow's signature check."""
        return self

    def predict(self, model_input, params=None) -> pd.DataFrame:
        """Labels and per-class probabilities of the rows of `model_input`, a DataFrame with the
        columns the model reads (by name; others are ignored). A regression's: the predicted number
        in the label's units (NaN where the model's output is not finite)."""
        row_index = getattr(model_input, "index", None)
        if self.regression:
            (prediction,) = self.session.run([PREDICTION], self.feeds(model_input))
            return pd.DataFrame({"prediction": prediction}, index=row_index)
        (probabilities,) = self.session.run([PROBABILITIES], self.feeds(model_input))
        unanswered = np.flatnonzero(~np.isfinite(probabilities).all(axis=1))
        if len(unanswered):
            raise ValueError(
                f"the model's outputs are not finite for {len(unanswered)} rows (the first at row "
                f"{unanswered[0]}); no class is an answer for them"
            )
        labels = np.asarray(self.class_labels, dtype=object)[probabilities.argmax(axis=1)]
        answer = {"prediction": labels.tolist()}
        for index, label in enumerate(self.class_labels):
            answer[f"probability_{label}"] = probabilities[:, index]
        return pd.DataFrame(answer, index=row_index)

    def feeds(self, frame) -> dict[str, np.ndarray]:
        table = arrow_columns(frame, [name for name, _ in self.columns])
        if self.takes_features:
            numbers = [read(kind_values.NUMERIC, table.column(name), name) for name, _ in self.columns]
            return {FEATURES: np.column_stack(numbers).astype(self.features_dtype)}
        return {
            input_name: feed(kind, table.column(name), name)
            for input_name, (name, kind) in zip(self.inputs, self.columns, strict=True)
        }


def arrow_columns(frame, names: list[str]) -> pa.Table:
    if isinstance(frame, pa.Table | pa.RecordBatch):
        return pa.Table.from_batches([frame]) if isinstance(frame, pa.RecordBatch) else frame
    missing = [name for name in names if name not in frame.columns]
    if missing:
        raise ValueError(f"missing columns {missing}; the model reads {names}")
    try:
        return pa.Table.from_pandas(frame, columns=names, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        for name in names:
            refuse_mixed_types(frame[name], name)
        raise ValueError(f"the columns {names} cannot be read: {error}") from error


def refuse_mixed_types(values: pd.Series, name: str) -> None:
    """Refuse a column Arrow cannot hold as one type (numbers and text in an object column), naming the
    first value that does not fit the ones before it."""
    if converts(values):
        return
    fits, fails = 0, len(values)  # the first `fits` values convert, the first `fails` do not
    while fails - fits > 1:
        middle = (fits + fails) // 2
        fits, fails = (middle, fails) if converts(values.iloc[:middle]) else (fits, middle)
    value = values.iloc[fails - 1]
    raise ValueError(
        f"column {name!r} holds values of more than one type: {value!r} ({type(value).__name__}) at row "
        f"{fails - 1} does not fit the values before it; send one type a column (numbers, text, booleans "
        "or dates)"
    )


def converts(values: pd.Series) -> bool:
    try:
        pa.array(values, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return False
    return True


def feed(kind: str, column: pa.ChunkedArray, name: str) -> np.ndarray:
    """One raw column as the ONNX export's input, `[rows, 1]`."""
    return kind_values.VALUES[kind].feed(read(kind, column, name))


def read(kind: str, column: pa.ChunkedArray, name: str):
    return kind_values.read_values(kind, column, Named(name))


class Named:
    """A column as the loader's refusals name it (`kind_values.Where`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def not_a(self, kind: str, values: pa.Array, index: int) -> ValueError:
        value = values[index].as_py()
        return ValueError(f"column {self.name!r} is read as {kind} but holds {value!r} at row {index}")

    def infinite(self, values: np.ndarray, infinite: np.ndarray) -> ValueError:
        return ValueError(f"column {self.name!r} has an infinite value at row {np.flatnonzero(infinite)[0]}")
