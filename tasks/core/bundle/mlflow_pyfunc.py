"""The code of a bundle's MLflow model: MLflow's python_function flavor imports it by its
`loader_module` name and calls `_load_pyfunc(data_path)`, whose `predict(frame)` scores a DataFrame.

`mlflow_model.write_mlflow_model` copies this file into the MLflow model's code/ folder, which MLflow
puts on sys.path. It needs onnxruntime, numpy, pandas and pyarrow, and no code of this project: it
imports nothing from it, so a server that has only the MLflow model folder runs it.

`data_path` is the model's data folder: model.onnx (the bundle's ONNX export) and model.json (the raw
columns in the order the export reads them, each with its kind and, where the export names it otherwise,
its "input"; and the class labels). `predict` reads the columns by name and turns them into the
export's inputs as the bundle reads a table:
- an export that takes one "features" input (numeric columns): the numbers float32 `[rows, columns]`;
- an export that takes the raw columns: one `[rows, 1]` input per column, text for categories ('' where
  missing), float64 for numbers and booleans (NaN where missing) and for dates (seconds since 1970 UTC).
Each value is read as the bundle reads its kind: the functions below are a copy of `canonical` in
tasks/core/data/column_kinds.py and of `raw_feeds` in tasks/core/bundle/raw_inputs.py, held to them by
tests/unit/bundle/test_mlflow_model.py.

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
import pyarrow.compute as pc

ONNX_FILE = "model.onnx"
DESCRIPTION_FILE = "model.json"
FEATURES = "features"
PROBABILITIES = "probabilities"
PREDICTION = "prediction"  # a regression's one output
NUMERIC, CATEGORICAL, BOOLEAN, DATE = "numeric", "categorical", "boolean", "date"
TEXT_BOOLEANS = ("false", "true", "0", "1", "no", "yes")  # a word's index modulo 2 is its truth
ZONE_SUFFIX = r"(Z|\d\d:\d\d(:\d\d(\.\d*)?)?[+-]\d\d(:?\d\d)?)$"
MICROS_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1}
MICROS_PER_SECOND = 1_000_000
MISSING_INSTANT = np.iinfo(np.int64).min


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
            numbers = [canonical(NUMERIC, table.column(name), name) for name, _ in self.columns]
            return {FEATURES: np.column_stack(numbers).astype(np.float32)}
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
    values = canonical(kind, column, name)
    if kind == CATEGORICAL:
        return np.asarray(values.fill_null("").to_pylist(), dtype=object)[:, None]
    if kind == DATE:
        return np.where(values == MISSING_INSTANT, np.nan, values / MICROS_PER_SECOND)[:, None]
    return np.asarray(values, dtype=np.float64)[:, None]


# ---- each kind's values, as the bundle reads them ---------------------------------------------------


def canonical(kind: str, column: pa.ChunkedArray | pa.Array, name: str):
    if pa.types.is_dictionary(column.type):
        column = pc.cast(column, column.type.value_type)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = blank_as_null(column)
    return CONVERTERS[kind](column, name)


def blank_as_null(text: pa.Array) -> pa.Array:
    text = pc.cast(text, pa.string())
    return null_where(pc.equal(text, ""), text)


def null_where(mask: pa.Array, values: pa.Array) -> pa.Array:
    return pc.if_else(mask, pa.scalar(None, values.type), values)


def refused(name: str, kind: str, values: pa.Array, index: int) -> ValueError:
    return ValueError(f"column {name!r} is read as {kind} but holds {values[index].as_py()!r} at row {index}")


def first_failing(values: pa.Array, parse) -> int:
    for index in range(len(values)):
        try:
            parse(values.slice(index, 1))
        except pa.ArrowInvalid:
            return index
    return 0


def as_numbers(column: pa.Array, name: str) -> np.ndarray:
    if pa.types.is_string(column.type):
        text = pc.utf8_trim_whitespace(column)
        try:
            column = pc.cast(text, pa.float64())
        except pa.ArrowInvalid:
            index = first_failing(text, lambda one: pc.cast(one, pa.float64()))
            raise refused(name, NUMERIC, text, index) from None
    values = pc.cast(column, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
    infinite = np.flatnonzero(np.isinf(values))
    if len(infinite):
        raise ValueError(f"column {name!r} has an infinite value at row {infinite[0]}")
    return values


def as_categories(column: pa.Array, name: str) -> pa.Array:
    if pa.types.is_floating(column.type):
        column = pc.add(column, pa.scalar(0.0, column.type))  # -0.0 as 0.0: the same category
        column = null_where(pc.is_nan(column), column)
    return pc.cast(column, pa.string())


def as_booleans(column: pa.Array, name: str) -> np.ndarray:
    if pa.types.is_string(column.type):
        words = pc.utf8_lower(pc.utf8_trim_whitespace(column))
        index = pc.index_in(words, value_set=pa.array(TEXT_BOOLEANS))
        unknown = np.flatnonzero(
            pc.and_(pc.is_valid(words), pc.is_null(index)).to_numpy(zero_copy_only=False)
        )
        if len(unknown):
            raise refused(name, BOOLEAN, column, int(unknown[0]))
        return index.to_numpy(zero_copy_only=False) % 2
    values = pc.cast(column, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
    other = np.flatnonzero(~np.isnan(values) & (values != 0) & (values != 1))
    if len(other):
        raise refused(name, BOOLEAN, column, int(other[0]))
    return values


def as_instants(column: pa.Array, name: str) -> np.ndarray:
    """int64 microseconds since 1970 UTC: a naive timestamp or a date taken as UTC."""
    if pa.types.is_string(column.type):
        try:
            column = text_instants(column)
        except pa.ArrowInvalid:
            raise refused(name, DATE, column, first_failing(column, text_instants)) from None
    elif pa.types.is_null(column.type):
        column = pa.nulls(len(column), pa.timestamp("us"))
    if pa.types.is_date32(column.type):
        column = pc.cast(column, pa.date64())
    unit = "ms" if pa.types.is_date64(column.type) else column.type.unit
    stored = pc.fill_null(pc.cast(column, pa.int64()), 0).to_numpy(zero_copy_only=False)
    micros = stored // 1_000 if unit == "ns" else stored * MICROS_PER_UNIT[unit]
    return np.where(pc.is_null(column).to_numpy(zero_copy_only=False), MISSING_INSTANT, micros)


def text_instants(text: pa.Array) -> pa.Array:
    """ISO text as naive timestamps in UTC: zoned values converted, naive ones taken as UTC."""
    text = pc.utf8_trim_whitespace(text)
    zoned = pc.match_substring_regex(text, ZONE_SUFFIX)
    naive = pc.cast(null_where(zoned, text), pa.timestamp("us"))
    utc = pc.cast(null_where(pc.invert(zoned), text), pa.timestamp("us", tz="UTC"))
    return pc.coalesce(naive, pc.cast(utc, pa.timestamp("us")))


CONVERTERS = {NUMERIC: as_numbers, CATEGORICAL: as_categories, BOOLEAN: as_booleans, DATE: as_instants}
