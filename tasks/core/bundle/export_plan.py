"""What every export shares: the inputs' and outputs' names and rules, the plan an export follows,
its result, and running one export so that a failure leaves a note and nothing behind."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tasks.core.bundle.raw_inputs import input_rules
from tasks.core.data.api import FittedEncoding, ScalerStats

INPUT = "features"
OUTPUTS = ("logits", "probabilities")
LABEL = "label"
# A regression's one output: the number in the label's units, float64 `[rows]`.
PREDICTION = "prediction"
REGRESSION_OUTPUTS = (PREDICTION,)
ROWS = "rows"
ONNX_FILE = "model.onnx"
SAVED_MODEL_DIR = "saved_model"
# TF Serving's folder for files beside a SavedModel that it does not load (its warm-up requests).
SAVED_MODEL_METADATA = os.path.join("assets.extra", "metadata.json")
SERVING_ENDPOINT = "serve"
# ONNX 1.13's IR version and opsets; onnxruntime 1.15 (ONNX 1.14: IR 9, opset 19) loads them.
ONNX_OPSET = 18
ONNX_IR_VERSION = 8
ML_OPSET_FLOOR = 3
ONNXRUNTIME_FLOOR = "1.15"
OUTPUT_RULES = {
    "logits": "float32 [rows, classes], classes in the order of class_labels",
    "probabilities": "float32 [rows, classes], the softmax of the logits",
    LABEL: "string [rows], the class label of the largest probability (the first where tied); empty where the "
    "probabilities are not finite (no answer)",
}
REGRESSION_OUTPUT_RULES = {
    PREDICTION: "float64 [rows], the predicted number in the label's units; NaN where the model's output "
    "is not finite (no answer)",
}
WHOLE_NUMBER_OUTPUT_RULES = {
    PREDICTION: "float64 [rows], the predicted number in the label's units, rounded to a whole number (half "
    "to even) as the label holds integers; NaN where the model's output is not finite (no answer)",
}

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportDescription:
    """What the exports say of the model they serve, as the bundle's manifest records it."""

    feature_names: list[str]  # the model's features, in order (the encoded ones where columns are raw)
    label_column: str
    class_labels: list[str]  # text, in class order: what the "label" output returns
    format_version: int  # the bundle's format
    problem_type: str = "classification"
    # A regression's label: mean + std x the model's one output is the prediction.
    target_mean: float = 0.0
    target_std: float = 1.0
    whole_numbers: bool = False  # a regression of an integer label: the prediction is rounded

    @property
    def regression(self) -> bool:
        return self.problem_type == "regression"

    @property
    def output_rules(self) -> dict[str, str]:
        if not self.regression:
            return OUTPUT_RULES
        return WHOLE_NUMBER_OUTPUT_RULES if self.whole_numbers else REGRESSION_OUTPUT_RULES


@dataclass
class ExportResult:
    """What was exported (export name -> path relative to the bundle folder) and what was not, and why;
    `checks`: export name -> what its check at export time found (onnxruntime against the model)."""

    files: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class ExportPlan:
    """What every export of one model shares: the scaler; `fill` (the encoding's value for a missing
    number, by feature) where the input is "features"; `encoding` where the inputs are the raw
    columns; the description, where given."""

    scaler: ScalerStats
    fill: list[float] | None = None
    encoding: FittedEncoding | None = None
    description: ExportDescription | None = None

    @property
    def regression(self) -> bool:
        return self.description is not None and self.description.regression

    @property
    def outputs(self) -> tuple[str, ...]:
        return REGRESSION_OUTPUTS if self.regression else OUTPUTS

    @property
    def rounds(self) -> bool:
        """Whether the prediction is rounded to a whole number, half to even, as the bundle rounds it."""
        return self.regression and self.description.whole_numbers

    def label_units(self) -> tuple[float, float] | None:
        """A regression's (mean, std) of the label, which turn the model's output into its units."""
        return (self.description.target_mean, self.description.target_std) if self.regression else None

    def metadata(self) -> dict[str, Any] | None:
        """The description and the input rules, as the exports carry them; None without a description."""
        described = self.description
        if described is None:
            return None
        inputs = input_rules(self.encoding) if self.encoding is not None else [self.features_rule()]
        return {
            "problem_type": described.problem_type,
            "label_column": described.label_column,
            "class_labels": list(described.class_labels),
            "feature_names": list(described.feature_names),
            "bundle_format_version": described.format_version,
            "inputs": inputs,
            "outputs": described.output_rules,
        }

    def features_rule(self) -> dict[str, Any]:
        rule = {
            "name": INPUT,
            "dtype": "float64",
            "shape": [ROWS, len(self.scaler.mean)],
            "order": "feature_names",
        }
        return {**rule, "missing": "NaN"} if self.fill is not None else rule


def write_json(path: str, content: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as file:
        json.dump(content, file, indent=2, ensure_ascii=False)
        file.write("\n")


def onnx_session(path: str):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def attempt(result: ExportResult, name: str, relative: str, directory: str, write: Callable[[str], Any]):
    """Run one export into `directory/relative`: recorded in `result.files` (and what `write` returns,
    its check, in `result.checks`) if it succeeds, else in `result.notes`, with nothing left behind."""
    path = os.path.join(directory, relative)
    try:
        check = write(path)
    except Exception as error:
        logger.warning("%s export left out", name, exc_info=True)
        result.notes.append(f"{name} not exported: {summary(error)}")
        discard(path)
    else:
        result.files[name] = relative
        if check is not None:
            result.checks[name] = check


def summary(error: BaseException) -> str:
    """The error's first line; exporters wrap the cause in pages of advice, so the cause speaks."""
    cause = error.__cause__ or error
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def discard(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)
