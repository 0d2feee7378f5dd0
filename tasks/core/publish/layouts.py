"""The folders serving stacks load as they are, written under a publish prefix beside the bundle versions.

A version is an integer (versions.py); with it, the bundle's exports are laid out as each server wants:

    <prefix>/triton/<model>/config.pbtxt              the served version's configuration
    <prefix>/triton/<model>/labels-<version>.txt      class labels, one a line, in output order (classifiers)
    <prefix>/triton/<model>/<version>/model.onnx
    <prefix>/triton/<model>/<version>/model.int8.onnx  the int8 export, where the bundle kept one
    <prefix>/tf_serving/models.config                 TF Serving's model config: the served version
    <prefix>/tf_serving/<version>/saved_model.pb, variables/, ...   Keras bundles only

Triton (model_repository.md, model_configuration.md, model_config.proto of triton-inference-server):
a model folder holds numerically named version folders, others are ignored; the onnxruntime backend
reads `<version>/model.onnx`, or the file `default_model_filename` names; with `max_batch_size` > 0
the batch dimension is implicit, so `dims` lists the others; an output of one value a row is stated as `dims: [1]` reshaped to `[]` (dims may not be empty);
`version_policy { specific { versions: [N] } }` serves version N alone (the default
serves the highest); `label_filename` names the labels file of a classification output, read from the
model folder. TF Serving (tensorflow.org/tfx/serving/serving_config): a base path of `<integer>/`
SavedModels, and a model config whose `model_version_policy { specific { versions: N } }` serves N
alone (the default serves the highest).

`config.pbtxt` and `models.config` are the only files rewritten when the served version moves: each is
replaced whole, and each names everything of its version (the labels file carries the version in its
name), so a server never reads one version's configuration with another's labels. A version without a
server's export (a torch bundle has no SavedModel) leaves that server's file as it is: the server keeps
serving the version it names, and publishing says so (`left_behind` in publish.py). The model's name
and how many versions the layouts keep are the prefix's settings (retention.py).

Imports onnx and protobuf only inside the functions that use them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import fsspec

from tasks.core.bundle.manifest import PREDICT_BATCH_ROWS, Manifest

LATEST = "LATEST"
TRITON = "triton"
TF_SERVING = "tf_serving"
TRITON_CONFIG = "config.pbtxt"
TF_SERVING_CONFIG = "models.config"
ONNX_MODEL = "model.onnx"  # the file name Triton's onnxruntime backend reads in a version folder
INT8_EXPORT = "onnx_int8"  # the int8 export's name in a manifest's files (int8.py)
INT8_MODEL = "model.int8.onnx"  # beside model.onnx: `default_model_filename` swaps one for the other
SAVED_MODEL_PB = "saved_model.pb"
LABELLED_OUTPUT = "probabilities"
# Where the TF Serving image looks for models (docs/serving.md mounts <prefix>/tf_serving there).
TF_SERVING_ROOT = "/models"
# A request or a dynamic batch of up to as many rows as the bundle scores in one block.
MAX_BATCH_SIZE = PREDICT_BATCH_ROWS
DEFAULT_NAME = "model"
NAME_CHARACTER = re.compile(r"[^A-Za-z0-9_.\-]")
# Uncommented, config.pbtxt serves the int8 export in place of model.onnx (the same inputs and outputs).
INT8_SWAP = f'# default_model_filename: "{INT8_MODEL}"'
# What each server needs of a version to serve it.
SERVED_EXPORT = {TRITON: "ONNX export", TF_SERVING: "SavedModel (only Keras bundles have one)"}
# The version a configuration file written here serves: `versions: [ N ]` (Triton), `versions: N` (TF Serving).
SERVED_VERSION = re.compile(r"versions:\s*\[?\s*(\d+)")

# ONNX element types (onnx.TensorProto.DataType names) -> Triton's model configuration data types.
TRITON_TYPES = {
    "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16", "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64", "INT8": "TYPE_INT8", "INT16": "TYPE_INT16", "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64", "FLOAT16": "TYPE_FP16", "FLOAT": "TYPE_FP32", "DOUBLE": "TYPE_FP64",
    "STRING": "TYPE_STRING", "BFLOAT16": "TYPE_BF16",
}  # fmt: skip


@dataclass
class Tensor:
    """An input or output as Triton's configuration states it: dims without the batch dimension."""

    name: str
    data_type: str
    dims: list[int]
    reshape: list[int] | None = None  # the model's own shape, where `dims` cannot state it


@dataclass
class Layouts:
    """What one version adds under the prefix, as paths relative to it."""

    copies: dict[str, str] = field(default_factory=dict)  # a local file or folder -> where it goes
    files: dict[str, str] = field(default_factory=dict)  # written with the version
    served: dict[str, str] = field(default_factory=dict)  # written when the version becomes the served one
    notes: list[str] = field(default_factory=list)  # the layouts left out, and why


def join(uri: str, *names: str) -> str:
    return "/".join([uri.rstrip("/"), *names])


def is_version(name: str) -> bool:
    """A folder name Triton and TF Serving read as a version: digits, not led by a zero."""
    return name.isascii() and name.isdigit() and not name.startswith("0")


def labels_file(version: int) -> str:
    return f"labels-{version}.txt"


def serving_name(prefix: str) -> str:
    """The model's name in Triton and TF Serving: the prefix's last folder, in characters both take
    ("model" where none is left), e.g. s3://bucket/models/churn -> "churn"."""
    path = fsspec.core.split_protocol(prefix.split("::")[-1])[1]
    name = NAME_CHARACTER.sub("_", PurePosixPath(path.rstrip("/")).name).lstrip(".")
    return name or DEFAULT_NAME


def server_configs(name: str) -> dict[str, str]:
    """Each server's configuration file, the one promoting rewrites, as a path under the prefix."""
    return {TRITON: f"{TRITON}/{name}/{TRITON_CONFIG}", TF_SERVING: f"{TF_SERVING}/{TF_SERVING_CONFIG}"}


def served_version(config: str) -> str:
    """The version a configuration file of `server_configs` serves; "" where it names none."""
    found = SERVED_VERSION.search(config)
    return found.group(1) if found else ""


def version_layouts(local_dir: str, manifest: Manifest, name: str, version: int) -> Layouts:
    """The Triton layout where the bundle has its ONNX export, the TF Serving one where it has a
    SavedModel; a missing export is noted (the manifest's export_notes say why it is missing)."""
    layouts = Layouts()
    folder = Path(local_dir)
    onnx_file = manifest.files.get("onnx")
    if onnx_file:
        add_triton(layouts, folder / onnx_file, manifest.record.class_labels, name, version)
        if int8_file := manifest.files.get(INT8_EXPORT):
            add_triton_int8(layouts, folder / int8_file, name, version)
    else:
        layouts.notes.append(f"no {TRITON} layout: the bundle has no ONNX export")
    saved_model = manifest.files.get("saved_model")
    if saved_model:
        add_tf_serving(layouts, folder / saved_model, name, version)
    elif manifest.record.framework == "tensorflow":
        layouts.notes.append(f"no {TF_SERVING} layout: the bundle has no SavedModel")
    return layouts


def add_triton(layouts: Layouts, onnx_path: Path, labels: list[str], name: str, version: int) -> None:
    """The version's folder and config.pbtxt; a labels file for a classifier (a regression has no labels)."""
    model = f"{TRITON}/{name}"
    labelled = labels_file(version) if labels else ""
    inputs, outputs = onnx_tensors(str(onnx_path))
    layouts.copies[str(onnx_path)] = f"{model}/{version}/{ONNX_MODEL}"
    if labelled:
        layouts.files[f"{model}/{labelled}"] = labels_text(labels)
    layouts.served[f"{model}/{TRITON_CONFIG}"] = triton_config(name, version, inputs, outputs, labelled)


def add_triton_int8(layouts: Layouts, int8_path: Path, name: str, version: int) -> None:
    """The int8 file beside model.onnx, and in config.pbtxt the line that serves it, commented out."""
    model = f"{TRITON}/{name}"
    layouts.copies[str(int8_path)] = f"{model}/{version}/{INT8_MODEL}"
    config = f"{model}/{TRITON_CONFIG}"
    layouts.served[config] += f"{INT8_SWAP}\n"


def add_tf_serving(layouts: Layouts, saved_model: Path, name: str, version: int) -> None:
    layouts.copies[str(saved_model)] = f"{TF_SERVING}/{version}"
    layouts.served[f"{TF_SERVING}/{TF_SERVING_CONFIG}"] = tf_serving_config(name, version)


def labels_text(labels: list[str]) -> str:
    """One label a line, in the order of the model's output columns; a line break inside a label (which
    would shift every label after it) is written as a space."""
    return "".join(re.sub(r"[\r\n]+", " ", str(label)) + "\n" for label in labels)


def onnx_tensors(path: str) -> tuple[list[Tensor], list[Tensor]]:
    """The graph's inputs and outputs as Triton states them, read from the ONNX file: each has a
    dynamic first (batch) dimension, which the exports guarantee and `max_batch_size` > 0 requires."""
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    return [triton_tensor(value, path) for value in graph.input], [
        triton_tensor(value, path) for value in graph.output
    ]


def triton_tensor(value, path: str) -> Tensor:
    import onnx

    tensor_type = value.type.tensor_type
    dims = list(tensor_type.shape.dim)
    if not dims or dims[0].HasField("dim_value"):
        raise ValueError(f"{path}: {value.name!r} has no dynamic batch dimension; Triton cannot batch it")
    element = onnx.TensorProto.DataType.Name(tensor_type.elem_type)
    if element not in TRITON_TYPES:
        raise ValueError(f"{path}: {value.name!r} is of ONNX type {element}, which Triton does not serve")
    rest = [dim.dim_value if dim.HasField("dim_value") else -1 for dim in dims[1:]]
    if not rest:  # one value a row, e.g. a label: Triton's dims may not be empty, so [1] reshaped to []
        return Tensor(value.name, TRITON_TYPES[element], [1], reshape=[])
    return Tensor(value.name, TRITON_TYPES[element], rest)


def triton_config(name: str, version: int, inputs: list[Tensor], outputs: list[Tensor], labels: str) -> str:
    """config.pbtxt serving `version` alone, with dynamic batching; `labels`: the labels file of the
    probabilities, "" for none."""
    labelled = {LABELLED_OUTPUT: labels} if labels else {}
    return "\n".join([
        f"name: {quoted(name)}",
        'backend: "onnxruntime"',
        f"max_batch_size: {MAX_BATCH_SIZE}",
        "dynamic_batching { }",
        f"version_policy: {{ specific: {{ versions: [ {version} ] }} }}",
        f"input [\n{tensor_entries(inputs, {})}\n]",
        f"output [\n{tensor_entries(outputs, labelled)}\n]",
        "",
    ])  # fmt: skip


def tensor_entries(tensors: list[Tensor], labels: dict[str, str]) -> str:
    entries = []
    for tensor in tensors:
        lines = [f"name: {quoted(tensor.name)}", f"data_type: {tensor.data_type}"]
        lines.append(f"dims: [ {', '.join(map(str, tensor.dims))} ]")
        if tensor.reshape is not None:
            lines.append(f"reshape: {{ shape: [ {', '.join(map(str, tensor.reshape))} ] }}")
        if tensor.name in labels:
            lines.append(f"label_filename: {quoted(labels[tensor.name])}")
        entries.append("  {\n" + "".join(f"    {line}\n" for line in lines) + "  }")
    return ",\n".join(entries)


def tf_serving_config(name: str, version: int) -> str:
    """TF Serving's model config file, serving `version` alone from `/models/<name>`."""
    return (
        "model_config_list {\n"
        "  config {\n"
        f"    name: {quoted(name)}\n"
        f"    base_path: {quoted(f'{TF_SERVING_ROOT}/{name}')}\n"
        '    model_platform: "tensorflow"\n'
        f"    model_version_policy {{ specific {{ versions: {version} }} }}\n"
        "  }\n"
        "}\n"
    )


def quoted(text: str) -> str:
    """A protobuf text-format string: a column's name may hold quotes, backslashes or any character."""
    from google.protobuf import text_encoding

    return f'"{text_encoding.CEscape(text, as_utf8=True)}"'
