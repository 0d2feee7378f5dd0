"""An export checked against the live model: onnxruntime's outputs on a few rows within a tolerance."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tasks.core.bundle.export_plan import INPUT, PREDICTION, ExportPlan, onnx_session
from tasks.core.bundle.raw_inputs import raw_feeds, sample_table

PARITY_ROWS = 8
# The largest difference in a probability, or a logit's relative to it above 1; a regression's in the
# label's standard deviations (relative to the standardised prediction above 1).
PARITY_TOLERANCE = 1e-4


def check_parity(path: str, live: Callable, plan: ExportPlan) -> dict[str, Any]:
    """onnxruntime's outputs for PARITY_ROWS rows against the live model's (`live`: its input features
    -> (logits, probabilities), or (prediction,)); refused over PARITY_TOLERANCE."""
    try:
        import onnxruntime
    except ImportError:
        return {"not_run": "onnxruntime is not installed where the bundle was written"}
    feeds, features = parity_inputs(plan)
    outputs = plan.outputs
    expected = dict(zip(outputs, live(features), strict=True))
    got = dict(zip(outputs, onnx_session(path).run(list(outputs), feeds), strict=True))
    if plan.rounds:
        expected[PREDICTION] = rounded_expectation(got[PREDICTION], expected[PREDICTION], *plan.label_units())
    difference = max(float(np.max(np.abs(got[name] - expected[name]))) for name in outputs)
    units = plan.label_units() or (0.0, 1.0)
    relative = max(scaled_difference(got[name], expected[name], *units) for name in outputs)
    if not relative <= PARITY_TOLERANCE:  # NaN too
        scale = "in the label's standard deviations" if plan.regression else "relative to values above 1"
        raise ValueError(
            f"onnxruntime {onnxruntime.__version__}'s answers differ from the model's by {relative:.3g} "
            f"({scale}), more than {PARITY_TOLERANCE:g}"
        )
    return {
        "max_abs_difference": difference,
        "max_scaled_difference": relative,
        "tolerance": PARITY_TOLERANCE,
        "onnxruntime": onnxruntime.__version__,
        "rows": len(features),
    }


def scaled_difference(got: np.ndarray, expected: np.ndarray, mean: float = 0.0, std: float = 1.0) -> float:
    """The largest difference in units of `std` (a regression's label's; 1 else), divided by the
    standardised value (expected - `mean`) / `std` where that is above 1: float32 logits of 1e6 differ
    in their last bits by more than a probability may differ at all. Equal where both are NaN."""
    both_nan = np.isnan(got) & np.isnan(expected)
    scale = np.maximum(std, np.abs(expected - mean))
    return float(np.max(np.where(both_nan, 0.0, np.abs(got - expected) / scale), initial=0.0))


def rounded_expectation(got: np.ndarray, unrounded: np.ndarray, mean: float, std: float) -> np.ndarray:
    """The live model's numbers rounded as the export rounds them, or, where one lies within the
    tolerance of a half, either whole number beside it: float32 rounding may tip it either way."""
    slack = PARITY_TOLERANCE * np.maximum(std, np.abs(unrounded - mean))
    below = np.floor(unrounded)
    at_half = np.abs(unrounded - below - 0.5) <= slack
    beside = (got == below) | (got == below + 1)
    return np.where(at_half & beside, got, np.round(unrounded))


def parity_inputs(plan: ExportPlan) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The ONNX file's feeds for the check's rows, and the features the live model takes for them:
    with an encoding, raw rows of every kind of value (`sample_table`) and their encoded features;
    else rows about the scaler's mean, with a NaN where the export fills one."""
    if plan.encoding is not None:
        table = sample_table(plan.encoding, plan.scaler.mean, plan.scaler.scale, PARITY_ROWS)
        return raw_feeds(table, plan.encoding), plan.encoding.transform(table)
    rng = np.random.default_rng(0)
    mean, scale = np.asarray(plan.scaler.mean), np.asarray(plan.scaler.scale)
    rows = mean + scale * rng.normal(size=(PARITY_ROWS, len(mean)))
    if plan.fill is not None:
        rows[0, 0] = np.nan
    return {INPUT: rows}, rows
