"""An exported ONNX graph finished for serving: dynamic rows checked, the label output or the rounded
prediction added, the metadata, and the opsets onnxruntime's floor reads."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from contextlib import contextmanager
from typing import Any

import numpy as np

from tasks.core.bundle.export_plan import (
    LABEL,
    ML_OPSET_FLOOR,
    ONNX_IR_VERSION,
    ONNX_OPSET,
    ONNXRUNTIME_FLOOR,
    PREDICTION,
    ROWS,
    ExportPlan,
)
from tasks.core.bundle.raw_inputs import with_raw_inputs


@contextmanager
def native_log_held():
    """tf2onnx runs TensorFlow's graph optimizer, whose C++ lines ("Starting new session", a count of
    GPUs) reach the process's stderr before absl's log is set up, past TF_CPP_MIN_LOG_LEVEL. They are
    held in a file while it runs and shown only where the conversion fails."""
    sys.stderr.flush()
    kept = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(kept, 2)
            held.seek(0)
            sys.stderr.write(held.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(kept, 2)
            os.close(kept)


def check_dynamic_rows(path: str) -> None:
    """Refuse a graph whose inputs or outputs have a fixed batch size; name the dynamic one "rows"."""
    import onnx

    exported = onnx.load(path)
    for value in [*exported.graph.input, *exported.graph.output]:
        batch = value.type.tensor_type.shape.dim[0]
        if batch.HasField("dim_value"):
            raise ValueError(
                f"the exported {value.name!r} has a fixed batch of {batch.dim_value} rows: "
                "the model's forward treats the batch size as a constant"
            )
        batch.dim_param = ROWS
    onnx.save(exported, path)


def finish_onnx(path: str, plan: ExportPlan) -> None:
    """Make the ONNX file at `path`, which takes "features", what serving reads: the raw columns as its
    inputs where the plan has an encoding; the "label" output and the metadata where it has a
    description (and a whole-number "prediction" where the label holds integers); the IR version of
    the onnxruntime floor."""
    import onnx

    if plan.encoding is not None:
        with_raw_inputs(path, plan.encoding)
    exported = onnx.load(path)
    metadata = plan.metadata()
    if metadata is not None:
        if not plan.regression:
            add_label_output(exported, metadata["class_labels"])
        elif plan.rounds:
            round_prediction(exported)
        onnx.helper.set_model_props(exported, onnx_metadata(metadata))
    for_onnxruntime_floor(exported)
    onnx.checker.check_model(exported, full_check=True)
    onnx.save(exported, path)


def add_label_output(exported, class_labels: list[str]) -> None:
    """A "label" output, string `[rows]`: the class label at the argmax of "probabilities", or "" for a
    row whose probabilities are not all finite (overflowed logits): no answer rather than a confident one."""
    from onnx import TensorProto, helper, numpy_helper

    graph = exported.graph
    constants = {
        "serving/class_labels": np.asarray(class_labels, dtype=object),
        "serving/no_label": np.asarray("", dtype=object),
        "serving/class_axis": np.asarray([1], dtype=np.int64),
        "serving/zero": np.asarray(0.0, dtype=np.float32),
    }
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in constants.items())
    graph.node.extend([
        helper.make_node("ArgMax", ["probabilities"], ["serving/class"], "serving/argmax", axis=1, keepdims=0),
        helper.make_node("Gather", ["serving/class_labels", "serving/class"], ["serving/class_label"],
                         "serving/gather", axis=0),
        # x - x is 0 where x is finite and NaN where it is NaN or infinite; a row's sum tells which.
        helper.make_node("Sub", ["probabilities", "probabilities"], ["serving/finite_zero"], "serving/sub"),
        helper.make_node("ReduceSum", ["serving/finite_zero", "serving/class_axis"], ["serving/row_zero"],
                         "serving/row_sum", keepdims=0),
        helper.make_node("Equal", ["serving/row_zero", "serving/zero"], ["serving/answered"], "serving/equal"),
        helper.make_node("Where", ["serving/answered", "serving/class_label", "serving/no_label"], [LABEL],
                         "serving/label"),
    ])  # fmt: skip
    graph.output.append(helper.make_tensor_value_info(LABEL, TensorProto.STRING, [ROWS]))


def round_prediction(exported) -> None:
    """The "prediction" rounded to a whole number: ONNX's Round rounds half to even, as numpy does."""
    from onnx import helper

    graph = exported.graph
    unrounded = "serving/unrounded_prediction"
    for node in all_nodes(graph):
        node.output[:] = [unrounded if name == PREDICTION else name for name in node.output]
        node.input[:] = [unrounded if name == PREDICTION else name for name in node.input]
    graph.node.append(helper.make_node("Round", [unrounded], [PREDICTION], "serving/round"))


def onnx_metadata(metadata: dict[str, Any]) -> dict[str, str]:
    """ONNX's metadata_props: text as it is, anything else as JSON; and the onnxruntime floor."""
    props = {key: value if isinstance(value, str) else json.dumps(value) for key, value in metadata.items()}
    return {**props, "onnxruntime_floor": ONNXRUNTIME_FLOOR}


def for_onnxruntime_floor(exported) -> None:
    """Stamp the IR version of the onnxruntime floor, or refuse an opset above it. The torch exporter
    stamps IR 10 with opset 18 but uses nothing IR 10 added (4-bit types, function overloads) except
    the nodes' metadata_props, its source lines, which are dropped: they name the exporting machine's
    paths and no runtime reads them."""
    opsets = {opset.domain or "ai.onnx": opset.version for opset in exported.opset_import}
    floors = {"ai.onnx": ONNX_OPSET, "ai.onnx.ml": ML_OPSET_FLOOR}
    above = {domain: version for domain, version in opsets.items() if version > floors.get(domain, version)}
    if above:
        raise ValueError(f"the export uses opsets {above}, above onnxruntime {ONNXRUNTIME_FLOOR}'s {floors}")
    for graph in [exported.graph, *exported.functions]:
        for node in all_nodes(graph):
            del node.metadata_props[:]
    exported.ir_version = min(exported.ir_version, ONNX_IR_VERSION)


def all_nodes(graph):
    """The nodes of a graph or function, and those of their subgraphs (an If's branches, a Loop's body)."""
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            for subgraph in [attribute.g, *attribute.graphs] if attribute.HasField("g") else attribute.graphs:
                yield from all_nodes(subgraph)
