"""Raw feature columns as the exports' named inputs, encoded in the graph as the bundle encodes them.

Where a bundle's `FittedEncoding` is more than its numeric columns as they are, its exports take one
input per raw column the encoding reads, of shape `[rows, 1]` (the batch dimension "rows" dynamic):

- numeric: float64 (a large value is not rounded before scaling); NaN where missing;
- boolean: float64 0 or 1; NaN where missing;
- categorical: text (`tensor(string)`, `tf.string`), as the bundle reads it: an integer code as '3',
  a boolean as 'true'/'false'; an empty string where missing;
- date: float64 seconds since 1970-01-01 00:00 UTC (Unix time; fractions for times of day); NaN where
  missing. The bundle reads dates to the microsecond, which float64 seconds hold until about 2255.
- text: text as the bundle reads it; an empty string where missing.

The graph turns them into the encoded features, float64 in `FittedEncoding.encoded_names()` order, with
the rules of `tasks.core.data.encoding`: a missing number or boolean takes its fill, with the indicator
where the encoding has one; a category one-hot over the vocabulary, then <other> (an unseen value),
then <missing>; a date as days since the train origin, month (1-12) and weekday (0 = Monday); text
as each bucket's count of the value's words in the train table (words.py), then <missing>.

`onnx_encoding` writes that as an ONNX graph (standard operators and ai.onnx.ml's LabelEncoder, which
onnxruntime runs; for text, onnxruntime's own Tokenizer too, as standard ONNX splits text from opset 20
alone, beyond the exports' opset 18 and onnxruntime 1.15) and `with_raw_inputs` puts it in front of an export that takes "features";
`tf_encoded` does the same with TensorFlow ops, for the SavedModel's named-input signature. Each kind's
part of them is its record in kind_exports.py; its values and input type, its record in the data layer's
kind_values.py.
The ONNX inputs are named as the columns, except a name the graph itself uses (its outputs, "features",
its internal prefixes), which `onnx_input_names` leads with "input/"; the SavedModel's are named by
`signature_names` (TensorFlow renames some characters). `raw_feeds` gives a table's columns as the ONNX
inputs take them, and `input_rules` the conventions above, input by input, as the exports' metadata
states them; `sample_table` makes rows of every kind of value the inputs take, for the check at export
time.

Imports onnx and tensorflow only inside the functions that use them.
"""

from __future__ import annotations

import copy
import re

import numpy as np
import pyarrow as pa

from tasks.core.bundle.kind_exports import (
    EXPORTS,
    ML_DOMAIN,
    ML_OPSET,
    ORT_DOMAIN,
    ORT_OPSET,
    PREFIX,
    GraphBuilder,
)
from tasks.core.bundle.table_input import arrow_features
from tasks.core.data.api import NUMERIC, VALUES, ColumnEncoding, FittedEncoding, Place, canonical

ROWS = "rows"
FEATURES = "features"  # the one input of an export whose encoding is its numeric columns as they are
ENCODED = "raw_inputs/features"  # the encoding graph's output, the numeric export's "features"
MODEL_PREFIX = "model/"  # names inside the numeric export, once the two are one graph
RENAMED_PREFIX = "input/"  # leads an input whose column has a name the graph uses
# Names a column's input cannot take: the exports' outputs and input, and the prefixes of the names
# inside the graph (exports.add_label_output's "serving/" too). A renamed input keeps its column's name
# after RENAMED_PREFIX, so two columns never meet.
GRAPH_NAMES = frozenset({FEATURES, "logits", "probabilities", "label", "prediction", ""})
GRAPH_PREFIXES = (PREFIX, MODEL_PREFIX, "serving/", RENAMED_PREFIX)
TF_NAME_CHARACTER = re.compile(r"[^A-Za-z0-9]")


def takes_text(column: ColumnEncoding) -> bool:
    """Whether the column's input is text (`tensor(string)`, `tf.string`) rather than float64."""
    return VALUES[column.kind].feed_type == "string"


def read_as_is(column: ColumnEncoding) -> bool:
    """Whether the column's one feature is its own number: numeric, without a missing-value indicator."""
    return column.kind == NUMERIC and column.encoder.names(column.name) == [column.name]


def takes_features(encoding: FittedEncoding) -> bool:
    """Whether the exports of a bundle with `encoding` take one "features" input rather than the raw
    columns: every column read as it is."""
    return all(read_as_is(column) for column in encoding.columns)


def raw_feeds(table, encoding: FittedEncoding) -> dict[str, np.ndarray]:
    """The columns that `encoding` reads from `table` (a pandas DataFrame, a pyarrow Table or
    RecordBatch) as the ONNX export's inputs: each read as the bundle reads it, then in the inputs'
    convention; where the export takes "features", the one feed float64 `[rows, columns]`, NaN where
    missing. A missing column, and a value the bundle refuses, are refused here as there (DatasetError),
    naming the column and where it can, the row."""

    table = arrow_features(table, [column.name for column in encoding.columns], "table", encoded=True)
    if takes_features(encoding):
        columns = encoding.columns
        numbers = [canonical(NUMERIC, table.column(column.name), Place(column.name)) for column in columns]
        return {FEATURES: np.column_stack(numbers).astype(np.float64)}
    names = onnx_input_names(encoding)
    return {names[column.name]: column_feed(column, table.column(column.name)) for column in encoding.columns}


def column_feed(column: ColumnEncoding, values) -> np.ndarray:
    return VALUES[column.kind].feed(canonical(column.kind, values, Place(column.name)))


def onnx_input_names(encoding: FittedEncoding) -> dict[str, str]:
    """Each raw column's ONNX input name: the column's, or where the graph uses that name (an output,
    "features", a name inside the graph), the column's led by RENAMED_PREFIX (`label` -> `input/label`)."""
    return {
        column.name: f"{RENAMED_PREFIX}{column.name}"
        if column.name in GRAPH_NAMES or column.name.startswith(GRAPH_PREFIXES)
        else column.name
        for column in encoding.columns
    }


def signature_names(encoding: FittedEncoding) -> dict[str, str]:
    """Each raw column's input name in the SavedModel's signature, a name TensorFlow keeps as it is:
    its function arguments are renamed by `sanitize_arg_name` (tensorflow/core/function/polymorphism/
    function_type.py: each character that is not alphanumeric as '_', led by 'arg_' where the first is
    not a letter), and two arguments renamed alike are refused. So the column's name in ASCII letters,
    digits and '_' (`home city` -> `home_city`, `1st` -> `arg_1st`), with a suffix where two names meet
    (`a.b` -> `a_b`, `a b` -> `a_b_2`)."""
    names: dict[str, str] = {}
    for column in encoding.columns:
        name = TF_NAME_CHARACTER.sub("_", column.name)
        name = name if re.match(r"[A-Za-z]", name) else f"arg_{name}"
        unique, count = name, 1
        while unique in names.values():
            count += 1
            unique = f"{name}_{count}"
        names[column.name] = unique
    return names


def input_rules(encoding: FittedEncoding) -> list[dict]:
    """What each input is, in the inputs' order: the raw column it takes, its ONNX and SavedModel names,
    the column's kind, its type and shape, how a missing value is sent, and a date's unit."""
    names, signatures = onnx_input_names(encoding), signature_names(encoding)
    return [column_rule(column, names[column.name], signatures[column.name]) for column in encoding.columns]


def column_rule(column: ColumnEncoding, name: str, signature_name: str) -> dict:
    rule = {
        "name": name,
        "column": column.name,
        "signature_name": signature_name,
        "kind": column.kind,
        "dtype": VALUES[column.kind].feed_type,
        "shape": [ROWS, 1],
        "missing": "" if takes_text(column) else "NaN",
    }
    return {**rule, **copy.deepcopy(EXPORTS[column.kind].rule)}


def sample_table(encoding: FittedEncoding, mean: list[float], scale: list[float], rows: int = 8) -> pa.Table:
    """`rows` rows of the raw columns `encoding` reads, seeded: numbers about their train spread
    (`mean` and `scale` of the encoded features), both booleans, each category and an unseen one, dates
    about the train range; each column missing in one row, a different row for the next column."""
    rng = np.random.default_rng(0)
    first_features = np.cumsum([0] + [len(column.encoder.names(column.name)) for column in encoding.columns])
    table = {}
    for index, column in enumerate(encoding.columns):
        missing = np.arange(rows) == index % rows
        first = first_features[index]
        table[column.name] = EXPORTS[column.kind].sample(
            column, rng, rows, missing, mean[first], scale[first]
        )
    return pa.table(table)


# ---- ONNX ---------------------------------------------------------------------------------------------


def onnx_encoding(encoding: FittedEncoding, ir_version: int, opset: int):
    """An ONNX model from one input per raw column to ENCODED, float64 `[rows, features]`."""
    from onnx import TensorProto, helper

    graph = GraphBuilder()
    names = onnx_input_names(encoding)
    blocks = [onnx_column(graph, column, names[column.name]) for column in encoding.columns]
    encoded = graph.node("Concat", *blocks, axis=1)
    graph.nodes.append(helper.make_node("Identity", [encoded], [ENCODED], f"{PREFIX}output"))
    inputs = [
        helper.make_tensor_value_info(
            names[column.name],
            TensorProto.STRING if takes_text(column) else TensorProto.DOUBLE,
            [ROWS, 1],
        )
        for column in encoding.columns
    ]
    output = helper.make_tensor_value_info(ENCODED, TensorProto.DOUBLE, [ROWS, len(encoding.encoded_names())])
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(ML_DOMAIN, ML_OPSET)]
    if any(node.domain == ORT_DOMAIN for node in graph.nodes):  # text: onnxruntime's Tokenizer
        opsets.append(helper.make_opsetid(ORT_DOMAIN, ORT_OPSET))
    model = helper.make_model(
        helper.make_graph(graph.nodes, "raw_inputs", inputs, [output], graph.initializers),
        opset_imports=opsets,
    )
    model.ir_version = ir_version
    return model


def onnx_column(graph: GraphBuilder, column: ColumnEncoding, name: str) -> str:
    """The column's encoded block, float64 `[rows, its features]`, from its input `name`."""
    return EXPORTS[column.kind].onnx(graph, name, column.encoder)


def with_raw_inputs(path: str, encoding: FittedEncoding) -> None:
    """Rewrite the ONNX export at `path`, which takes "features" (float64), to take the raw columns."""
    import onnx
    from onnx import compose

    numeric = onnx.load(path)
    (features,) = [value.name for value in numeric.graph.input]
    opsets = {opset.domain: opset.version for opset in numeric.opset_import}
    encoder = onnx_encoding(encoding, numeric.ir_version, opsets[""])
    if ML_DOMAIN in opsets:
        encoder.opset_import[1].version = opsets[ML_DOMAIN]
    numeric = compose.add_prefix(
        numeric, MODEL_PREFIX, rename_inputs=False, rename_outputs=False, rename_functions=False
    )
    merged = compose.merge_models(encoder, numeric, io_map=[(ENCODED, features)])
    once_per_domain(merged)
    onnx.checker.check_model(merged)
    onnx.save(merged, path)


def once_per_domain(model) -> None:
    """Each opset domain imported once: onnx's `compose.merge_models` (1.23) checks that both models
    import a domain at one version, then imports both models' lists, each domain twice."""
    from onnx import helper

    versions = {opset.domain: opset.version for opset in model.opset_import}
    del model.opset_import[:]
    model.opset_import.extend(helper.make_opsetid(domain, version) for domain, version in versions.items())


# ---- TensorFlow ---------------------------------------------------------------------------------------


def tf_input_signature(encoding: FittedEncoding) -> dict:
    """The SavedModel's named inputs: one TensorSpec `[rows, 1]` per raw column."""
    import tensorflow as tf

    names = signature_names(encoding)
    return {
        names[column.name]: tf.TensorSpec(
            [None, 1], tf.string if takes_text(column) else tf.float64, name=names[column.name]
        )
        for column in encoding.columns
    }


def tf_encoded(inputs: dict, encoding: FittedEncoding):
    """The encoded features, float64 `[rows, features]`, from the signature's named inputs."""
    import tensorflow as tf

    names = signature_names(encoding)
    blocks = [
        EXPORTS[column.kind].tf(inputs[names[column.name]], column.encoder) for column in encoding.columns
    ]
    return tf.concat(blocks, axis=1)
