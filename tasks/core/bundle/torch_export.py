"""The ONNX export of a torch model, the preprocessing in its graph."""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager
from typing import Any

import numpy as np

from tasks.core.bundle.export_parity import check_parity
from tasks.core.bundle.export_plan import (
    INPUT,
    ONNX_FILE,
    ONNX_OPSET,
    OUTPUTS,
    ROWS,
    ExportPlan,
    ExportResult,
    attempt,
)
from tasks.core.bundle.onnx_graph import check_dynamic_rows, finish_onnx
from tasks.core.data.api import ScalerStats


def export_torch(model, plan: ExportPlan, directory: str) -> ExportResult:
    """ONNX of `model` behind the scaler: from "features", or with an encoding, from the raw columns."""
    result = ExportResult()
    serving = torch_serving_module(model, plan.scaler, plan.fill, plan.label_units())

    def live(features: np.ndarray) -> tuple[np.ndarray, ...]:
        import torch

        with torch.no_grad():
            return tuple(output.numpy() for output in serving(torch.from_numpy(features)))

    def write(path: str) -> dict[str, Any]:
        write_torch_onnx(serving, len(plan.scaler.mean), path, plan.outputs)
        finish_onnx(path, plan)
        return check_parity(path, live, plan)

    attempt(result, "onnx", ONNX_FILE, directory, write)
    return result


def torch_serving_module(
    model,
    scaler: ScalerStats,
    fill: list[float] | None = None,
    label_units: tuple[float, float] | None = None,
):
    """`model` behind the scaler, returning (logits, probabilities). With `fill` (the encoding's value
    for a missing number, by feature), a NaN is filled as the bundle fills it. With a regression's
    `label_units` (mean, std), returning (prediction,): the one output in the label's units, float64."""
    import torch

    class Serving(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            self.register_buffer("mean", torch.tensor(scaler.mean, dtype=torch.float64))
            self.register_buffer("scale", torch.tensor(scaler.scale, dtype=torch.float64))
            self.fills = fill is not None
            if self.fills:
                self.register_buffer("fill", torch.tensor(fill, dtype=torch.float64))
            self.regression = label_units is not None
            if self.regression:
                # Tensors of shape [1], not Python numbers: the exporter's optimizer drops an Add of a
                # scalar within 1e-8 of 0 and a Mul of one within 1e-5 of 1 as no-ops (onnxscript
                # rewriter/rules/common/_no_op.py, matched with rewriter/_pattern_ir.py's tolerances),
                # and a label's mean may be that small.
                self.register_buffer("label_mean", torch.tensor([label_units[0]], dtype=torch.float64))
                self.register_buffer("label_std", torch.tensor([label_units[1]], dtype=torch.float64))

        def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, ...]:
            raw = features.double()
            if self.fills:
                raw = torch.where(torch.isnan(raw), self.fill, raw)
            standardised = ((raw - self.mean) / self.scale).float()
            logits = self.model(standardised).float()
            if self.regression:
                return (logits[:, 0].double() * self.label_std + self.label_mean,)
            return logits, torch.softmax(logits, dim=-1)

    return Serving().eval()


def write_torch_onnx(serving, n_features: int, path: str, outputs: tuple[str, ...] = OUTPUTS) -> None:
    """The input "features" in float64, as the bundle standardises them: float32 would round a raw
    number before its scaling (17-digit ids a few hundred apart would all read as one)."""
    import torch

    with quiet_exporter():
        torch.onnx.export(
            serving,
            # two rows: torch.export specialises a dimension of size 1
            (torch.zeros(2, n_features, dtype=torch.float64),),
            path,
            dynamo=True,
            dynamic_shapes={INPUT: {0: torch.export.Dim(ROWS)}},
            input_names=[INPUT],
            output_names=list(outputs),
            opset_version=ONNX_OPSET,
            external_data=False,
            verbose=False,
        )
    check_dynamic_rows(path)


@contextmanager
def quiet_exporter():
    """The dynamo exporter logs a warning for each torchvision op it cannot register where torchvision is
    not installed (no model here uses them), and torch.export a pytree FutureWarning: noise in a run's
    log that asks nothing of the user. Errors still reach the log and the export's note."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        registration.setLevel(level)
