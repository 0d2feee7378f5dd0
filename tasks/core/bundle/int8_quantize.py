"""Static int8 quantization of a bundle's `model.onnx`, its activation ranges calibrated on train rows.

Dynamic quantization (`DynamicQuantizeLinear`) picks one activation scale per batch, so one row's
answer would depend on the rows that share its batch: a single large value coarsens every other row's
input, and an inf turns them all to NaN. Static quantization fixes each scale from calibration data,
so a row's output depends on its own inputs only.

The export's graph reads raw rows and holds the preprocessing (`raw_inputs.py`, the scaler), while the
prepared train split holds the rows as the model reads them: encoded and standardised, float32. So
the graph is cut where the model's input is made (the last Cast to float32 before the first dense
layer, `torch_export.py`'s `.float()` or `tf.cast` after the scaler), the part behind the cut is quantized
with `onnxruntime.quantization.quantize_static`, calibrated on a seeded sample of CALIBRATION_ROWS
train rows fed at the cut, and the float preprocessing in front is joined back on. The preprocessing
(string lookups, float64 arithmetic) is thus never handed to the quantizer.

onnxruntime's quantizer (onnxruntime/python/tools/quantization/quantize.py, `quantize_static`, and
https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html): QuantFormat.QDQ,
which its CPU kernels fuse into integer MatMul; activations uint8 with MinMax ranges, weights int8 per
tensor in 7 bits (`reduce_range`, for x86 CPUs without VNNI, whichever CPU later serves the file);
only MatMul and Gemm with constant weights (`MatMulConstBOnly`), their outputs left float
(`OpTypesToExcludeOutputQuantization`): a layer's input is quantized where the next layer reads it,
and the logits are not rounded to 256 steps. On the int8 benchmark that kept more answers equal to
fp32's and ran faster than quantizing the outputs too (docs/serving.md). A CNN's Conv layers stay float.

Imports onnx and onnxruntime only inside the functions that use them.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np
import pyarrow as pa

from tasks.core.bundle.onnx_graph import for_onnxruntime_floor
from tasks.core.data.api import batch_features, parquet_split

QUANTIZED_OPS = ("MatMul", "Gemm")
CALIBRATION_ROWS = 2048  # train rows the activation ranges are taken from, at most
CALIBRATION_SEED = 0
CALIBRATION_BATCH = 256  # rows per calibration run
FLOAT = 1  # onnx.TensorProto.FLOAT


def calibration_rows(
    train_rows: str | pa.Table,
    feature_names: list[str],
    rows: int = CALIBRATION_ROWS,
    seed: int = CALIBRATION_SEED,
) -> np.ndarray:
    """A seeded sample of at most `rows` rows of the prepared train split (a parquet file or folder, or a
    table), as the model reads them: float32, rows x features. ValueError where it has none."""
    table = train_rows if isinstance(train_rows, pa.Table) else parquet_split(train_rows)
    total = table.num_rows if isinstance(table, pa.Table) else table.count_rows()
    if total == 0:
        raise ValueError("the train split has no rows to calibrate the activations on")
    picked = np.sort(np.random.default_rng(seed).choice(total, min(rows, total), replace=False))
    return batch_features(table.take(picked), feature_names, np.float32)


def quantize(source: Path, target: Path, calibration: np.ndarray) -> list[str]:
    """Write `source` with its MatMul and Gemm nodes statically quantized to `target`, their activation
    ranges calibrated on `calibration` (rows as the model reads them); the names of the int8 weights.
    ValueError where there were none to quantize, or no model input to calibrate at."""
    import onnx

    model = onnx.load(source)
    one_opset_per_domain(model)
    model = onnx.shape_inference.infer_shapes(model)  # the cut's shape, which tf2onnx does not write
    cut = model_input(model, calibration.shape[1])
    front, back = split_at(model, cut)
    back = quantized_part(back, cut, calibration)
    for part in front, back:  # shapes inferred on both sides name the cut twice, which a merge refuses
        del part.graph.value_info[:]
    quantized = onnx.compose.merge_models(front, back, io_map=[(cut, cut)])
    one_opset_per_domain(quantized)
    keep_non_finite_rows(quantized, cut, calibration.shape[1])
    weights = int8_weights(quantized)
    if not weights:
        raise ValueError(f"the graph has no {' or '.join(QUANTIZED_OPS)} with constant weights to quantize")
    quantized.ir_version = model.ir_version
    onnx.helper.set_model_props(quantized, {prop.key: prop.value for prop in model.metadata_props})
    for_onnxruntime_floor(quantized)
    onnx.checker.check_model(quantized, full_check=True)
    onnx.save(quantized, target)
    return weights


def model_input(model, width: int) -> str:
    """The tensor where the graph hands the model its float32 input: the output of the last Cast to
    float32 ahead of the first MatMul or Gemm with constant weights."""
    constants = {tensor.name for tensor in model.graph.initializer}
    casts: list[str] = []
    for node in model.graph.node:
        if node.op_type in QUANTIZED_OPS and len(node.input) > 1 and node.input[1] in constants:
            break
        if node.op_type == "Cast" and any(a.name == "to" and a.i == FLOAT for a in node.attribute):
            casts.append(node.output[0])
    if not casts:
        raise ValueError("no float32 model input ahead of the dense layers to calibrate at")
    check_width(model, casts[-1], width)
    return casts[-1]


def check_width(model, name: str, width: int) -> None:
    shape = next(
        (value.type.tensor_type.shape for value in model.graph.value_info if value.name == name), None
    )
    dims = [dim.dim_value if dim.HasField("dim_value") else None for dim in shape.dim] if shape else []
    if dims[-1:] not in ([width], [None]):
        raise ValueError(f"the model input {name!r} has shape {dims}, not {width} features a row")


def split_at(model, cut: str):
    """The graph in front of `cut` (the raw inputs to it) and behind it (it to the outputs)."""
    from onnx.utils import Extractor

    extractor = Extractor(model)
    inputs, outputs = (
        [value.name for value in model.graph.input],
        [value.name for value in model.graph.output],
    )
    return extractor.extract_model(inputs, [cut]), extractor.extract_model([cut], outputs)


def quantized_part(model, cut: str, calibration: np.ndarray):
    """`model` (read from `cut`) statically quantized, calibrated on `calibration` fed at `cut`."""
    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    with TemporaryDirectory(prefix="mixedml-int8-") as work, quiet_quantizer():
        source, target = Path(work) / "float.onnx", Path(work) / "int8.onnx"
        onnx.save(model, source)
        quantize_static(
            source,
            target,
            RowsReader(cut, calibration),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(QUANTIZED_OPS),
            per_channel=False,
            reduce_range=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            extra_options={
                "MatMulConstBOnly": True,
                "OpTypesToExcludeOutputQuantization": list(QUANTIZED_OPS),
            },
        )
        return onnx.load(target)


class RowsReader:
    """A CalibrationDataReader, which onnxruntime recognises by its `get_next` (None once done; its
    `__subclasshook__`, calibrate.py): `rows` fed to `name`, CALIBRATION_BATCH at a time."""

    def __init__(self, name: str, rows: np.ndarray):
        count = max(1, -(-len(rows) // CALIBRATION_BATCH))
        self.feeds = iter({name: part} for part in np.array_split(rows, count))

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.feeds, None)


def keep_non_finite_rows(model, cut: str, width: int) -> None:
    """A row with a non-finite feature answers as in `model.onnx` (NaN logits and probabilities, no
    label), where QuantizeLinear would saturate it into a class: the logits ahead of the softmax get
    NaN added in those rows. `x * 0` is NaN exactly where x is inf or NaN, and its row sum (a MatMul by
    ones, added after quantization so it stays float) NaN exactly where any feature is."""
    from onnx import helper, numpy_helper

    softmax = next((node for node in model.graph.node if node.op_type == "Softmax"), None)
    if softmax is None:
        raise ValueError("the graph has no Softmax whose logits a non-finite row would make NaN")
    logits = softmax.input[0]
    unmasked = f"{logits}/before_non_finite_rows"
    producer = next(node for node in model.graph.node if logits in node.output)
    outputs = [unmasked if name == logits else name for name in producer.output]
    del producer.output[:]
    producer.output.extend(outputs)
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(np.zeros((), np.float32), "non_finite_rows/zero"),
            numpy_helper.from_array(np.ones((width, 1), np.float32), "non_finite_rows/ones"),
        ]
    )
    at = list(model.graph.node).index(softmax)  # its inputs' producers come before it, as the cut's do
    for offset, node in enumerate(
        [
            helper.make_node("Mul", [cut, "non_finite_rows/zero"], ["non_finite_rows/zeroed"]),
            helper.make_node(
                "MatMul", ["non_finite_rows/zeroed", "non_finite_rows/ones"], ["non_finite_rows/nan"]
            ),
            helper.make_node("Add", [unmasked, "non_finite_rows/nan"], [logits]),
        ]
    ):
        model.graph.node.insert(at + offset, node)


def int8_weights(model) -> list[str]:
    from onnx import TensorProto

    return [
        tensor.name
        for tensor in model.graph.initializer
        if tensor.data_type == TensorProto.INT8 and not tensor.name.endswith("_zero_point")
    ]


def one_opset_per_domain(model) -> None:
    """Merging the encoding graph in front of the model imports the default domain twice, at one
    version; onnxruntime runs that, but its quantizer refuses it."""
    versions: dict[str, int] = {}
    for opset in model.opset_import:
        domain = "" if opset.domain == "ai.onnx" else opset.domain
        versions[domain] = max(versions.get(domain, 0), opset.version)
    if len(versions) == len(model.opset_import):
        return
    from onnx import helper

    del model.opset_import[:]
    model.opset_import.extend(helper.make_opsetid(domain, version) for domain, version in versions.items())


@contextmanager
def quiet_quantizer():
    """The quantizer logs on the root logger that the model was not pre-processed (symbolic shape
    inference and graph fusions, which matter for transformer models, not for these)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)
