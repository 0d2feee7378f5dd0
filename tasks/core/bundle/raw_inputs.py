"""Raw feature columns as the exports' named inputs, encoded in the graph as the bundle encodes them.

Where a bundle's `FittedEncoding` is more than its numeric columns as they are, its exports take one
input per raw column the encoding reads, of shape `[rows, 1]` (the batch dimension "rows" dynamic):

- numeric: float64 (a large value is not rounded before scaling); NaN where missing;
- boolean: float64 0 or 1; NaN where missing;
- categorical: text (`tensor(string)`, `tf.string`), as the bundle reads it: an integer code as '3',
  a boolean as 'true'/'false'; an empty string where missing;
- date: float64 seconds since 1970-01-01 00:00 UTC (Unix time; fractions for times of day); NaN where
  missing. The bundle reads dates to the microsecond, which float64 seconds hold until about 2255.

The graph turns them into the encoded features, float64 in `FittedEncoding.encoded_names()` order, with
the rules of `tasks.core.data.encoding`: a missing number or boolean takes its fill, with the indicator
where the encoding has one; a category one-hot over the vocabulary, then <other> (an unseen value),
then <missing>; a date as days since the train origin, month (1-12) and weekday (0 = Monday).

`onnx_encoding` writes that as an ONNX graph (standard operators and ai.onnx.ml's LabelEncoder, which
onnxruntime runs) and `with_raw_inputs` puts it in front of an export that takes "features";
`tf_encoded` does the same with TensorFlow ops, for the SavedModel's named-input signature.
The ONNX inputs are named as the columns, except a name the graph itself uses (its outputs, "features",
its internal prefixes), which `onnx_input_names` leads with "input/"; the SavedModel's are named by
`signature_names` (TensorFlow renames some characters). `raw_feeds` gives a table's columns as the ONNX
inputs take them, and `input_rules` the conventions above, input by input, as the exports' metadata
states them; `sample_table` makes rows of every kind of value the inputs take, for the check at export
time.

Imports onnx and tensorflow only inside the functions that use them.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

from tasks.core.bundle.table_input import arrow_features
from tasks.core.data.api import (
    BOOLEAN,
    CATEGORICAL,
    DATE,
    MISSING_INSTANT,
    NUMERIC,
    CategoryEncoding,
    ColumnEncoding,
    DateEncoding,
    FittedEncoding,
    Place,
    canonical,
)

ROWS = "rows"
FEATURES = "features"  # the one input of an export whose encoding is its numeric columns as they are
ENCODED = "raw_inputs/features"  # the encoding graph's output, the numeric export's "features"
PREFIX = "raw_inputs/"  # names inside the encoding graph
MODEL_PREFIX = "model/"  # names inside the numeric export, once the two are one graph
RENAMED_PREFIX = "input/"  # leads an input whose column has a name the graph uses
# Names a column's input cannot take: the exports' outputs and input, and the prefixes of the names
# inside the graph (exports.add_label_output's "serving/" too). A renamed input keeps its column's name
# after RENAMED_PREFIX, so two columns never meet.
GRAPH_NAMES = frozenset({FEATURES, "logits", "probabilities", "label", "prediction", ""})
GRAPH_PREFIXES = (PREFIX, MODEL_PREFIX, "serving/", RENAMED_PREFIX)
SECONDS_PER_DAY = 86_400
MICROS_PER_SECOND = 1_000_000
ML_DOMAIN, ML_OPSET = "ai.onnx.ml", 3  # the ai.onnx.ml version that ONNX opset 18 pairs with
# Days from 0000-03-01 to 1970-01-01, and the days of a 400-year era: the civil calendar from a day
# count (Howard Hinnant's days_from_civil, inverted), in integer operations only.
EPOCH_SHIFT, DAYS_PER_ERA = 719_468, 146_097
TF_NAME_CHARACTER = re.compile(r"[^A-Za-z0-9]")
UNIX_SECONDS = "seconds since 1970-01-01T00:00:00Z"


def is_categorical(column: ColumnEncoding) -> bool:
    return column.kind == CATEGORICAL


def read_as_is(column: ColumnEncoding) -> bool:
    """Whether the column's one feature is its own number: numeric, without a missing-value indicator."""
    return column.kind == NUMERIC and column.encoder.names(column.name) == [column.name]


def takes_features(encoding: FittedEncoding | None) -> bool:
    """Whether the exports of a bundle with `encoding` take one "features" input rather than the raw
    columns: every column read as it is (or no encoding)."""
    return encoding is None or all(read_as_is(column) for column in encoding.columns)


def raw_feeds(table, encoding: FittedEncoding) -> dict[str, np.ndarray]:
    """The columns that `encoding` reads from `table` (a pandas DataFrame, a pyarrow Table or
    RecordBatch) as the ONNX export's inputs: each read as the bundle reads it, then in the inputs'
    convention; where the export takes "features", the one feed float32 `[rows, columns]`, NaN where
    missing. A missing column, and a value the bundle refuses, are refused here as there (DatasetError),
    naming the column and where it can, the row."""

    table = arrow_features(table, [column.name for column in encoding.columns], "table", encoded=True)
    if takes_features(encoding):
        columns = encoding.columns
        numbers = [canonical(NUMERIC, table.column(column.name), Place(column.name)) for column in columns]
        return {FEATURES: np.column_stack(numbers).astype(np.float32)}
    names = onnx_input_names(encoding)
    return {names[column.name]: column_feed(column, table.column(column.name)) for column in encoding.columns}


def column_feed(column: ColumnEncoding, values) -> np.ndarray:
    values = canonical(column.kind, values, Place(column.name))
    if is_categorical(column):
        return np.asarray(values.fill_null("").to_pylist(), dtype=object)[:, None]
    if column.kind == DATE:
        return np.where(values == MISSING_INSTANT, np.nan, values / MICROS_PER_SECOND)[:, None]
    return np.asarray(values, dtype=np.float64)[:, None]


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
        "dtype": "string" if is_categorical(column) else "float64",
        "shape": [ROWS, 1],
        "missing": "" if is_categorical(column) else "NaN",
    }
    if is_categorical(column):
        rule["unseen"] = "<other>"
    elif column.kind == BOOLEAN:
        rule["values"] = [0, 1]
    elif column.kind == DATE:
        rule["unit"] = UNIX_SECONDS
    return rule


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
        table[column.name] = sample_column(column, rng, rows, missing, mean[first], scale[first])
    return pa.table(table)


def sample_column(column: ColumnEncoding, rng, rows: int, missing: np.ndarray, mean: float, scale: float):
    if is_categorical(column):
        vocabulary = column.encoder.vocabulary
        unseen = "<unseen>" + "_" * max((len(value) for value in vocabulary), default=0)
        values = [*vocabulary, unseen]
        return pa.array([values[row % len(values)] for row in range(rows)], pa.string(), mask=missing)
    if column.kind == BOOLEAN:
        return pa.array(np.arange(rows) % 2 == 1, mask=missing)
    if column.kind == DATE:
        spread = max(column.encoder.fill - column.encoder.origin, MICROS_PER_SECOND * SECONDS_PER_DAY)
        micros = column.encoder.fill + (rng.normal(size=rows) * spread).astype(np.int64)
        return pa.array(micros, pa.timestamp("us", tz="UTC"), mask=missing)
    return pa.array(mean + scale * rng.normal(size=rows), mask=missing)


def date_seconds(micros: int) -> float:
    return micros / MICROS_PER_SECOND


# ---- ONNX ---------------------------------------------------------------------------------------------


class GraphBuilder:
    """Nodes and constants of the encoding graph, each output named inside PREFIX."""

    def __init__(self):
        self.nodes, self.initializers = [], []

    def name(self, hint: str) -> str:
        return f"{PREFIX}{hint}_{len(self.nodes) + len(self.initializers)}"

    def constant(self, values, dtype) -> str:
        from onnx import numpy_helper

        name = self.name("constant")
        self.initializers.append(numpy_helper.from_array(np.asarray(values, dtype=dtype), name))
        return name

    def node(self, op: str, *inputs: str, domain: str = "", **attributes) -> str:
        from onnx import helper

        output = self.name(op)
        self.nodes.append(helper.make_node(op, list(inputs), [output], output, domain=domain, **attributes))
        return output

    def floor_div(self, numerator: str, denominator: int) -> str:
        """Integer division rounded down, for negative numerators too (Div truncates toward 0)."""
        divisor = self.constant(denominator, np.int64)
        remainder = self.node("Mod", numerator, divisor, fmod=0)  # takes the divisor's sign
        return self.node("Div", self.node("Sub", numerator, remainder), divisor)


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
            TensorProto.STRING if is_categorical(column) else TensorProto.DOUBLE,
            [ROWS, 1],
        )
        for column in encoding.columns
    ]
    output = helper.make_tensor_value_info(ENCODED, TensorProto.DOUBLE, [ROWS, len(encoding.encoded_names())])
    model = helper.make_model(
        helper.make_graph(graph.nodes, "raw_inputs", inputs, [output], graph.initializers),
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(ML_DOMAIN, ML_OPSET)],
    )
    model.ir_version = ir_version
    return model


def onnx_column(graph: GraphBuilder, column: ColumnEncoding, name: str) -> str:
    """The column's encoded block, float64 `[rows, its features]`, from its input `name`."""
    if isinstance(column.encoder, CategoryEncoding):
        return onnx_category(graph, name, column.encoder)
    missing = graph.node("IsNaN", name)
    if isinstance(column.encoder, DateEncoding):
        filled = graph.node(
            "Where", missing, graph.constant(date_seconds(column.encoder.fill), np.float64), name
        )
        block = onnx_date(graph, filled, column.encoder)
    else:
        block = graph.node("Where", missing, graph.constant(column.encoder.fill, np.float64), name)
    if not column.encoder.indicator:
        return block
    return graph.node("Concat", block, double(graph, missing), axis=1)


def double(graph: GraphBuilder, values: str) -> str:
    from onnx import TensorProto

    return graph.node("Cast", values, to=TensorProto.DOUBLE)


def onnx_category(graph: GraphBuilder, name: str, encoder: CategoryEncoding) -> str:
    """One-hot over the vocabulary, then <other>, then <missing> (an empty string) where the encoding
    has it; elsewhere an empty string is <other>, as the bundle counts a missing value."""
    other = len(encoder.vocabulary)
    codes = {value: index for index, value in enumerate(encoder.vocabulary)}
    codes.setdefault("", other + 1 if encoder.indicator else other)
    code = graph.node(
        "LabelEncoder",
        name,
        domain=ML_DOMAIN,
        keys_strings=list(codes),
        values_int64s=list(codes.values()),
        default_int64=other,
    )
    width = np.arange(other + 1 + encoder.indicator, dtype=np.int64)
    return double(graph, graph.node("Equal", code, graph.constant(width, np.int64)))


def onnx_date(graph: GraphBuilder, seconds: str, encoder: DateEncoding) -> str:
    """days since the origin, month and weekday, from float64 seconds none of which is missing."""
    from onnx import TensorProto

    day_length = graph.constant(SECONDS_PER_DAY, np.float64)
    since = graph.node("Sub", seconds, graph.constant(date_seconds(encoder.origin), np.float64))
    days = graph.node("Div", since, day_length)
    day = graph.node(
        "Cast", graph.node("Floor", graph.node("Div", seconds, day_length)), to=TensorProto.INT64
    )
    month = onnx_month(graph, day)
    weekday = graph.node(
        "Mod", graph.node("Add", day, graph.constant(3, np.int64)), graph.constant(7, np.int64)
    )
    return graph.node("Concat", days, double(graph, month), double(graph, weekday), axis=1)


def onnx_month(graph: GraphBuilder, day: str) -> str:
    """The month (1-12) of day `day` since 1970-01-01, in the civil calendar."""
    constant = lambda value: graph.constant(value, np.int64)  # noqa: E731
    shifted = graph.node("Add", day, constant(EPOCH_SHIFT))
    era = graph.floor_div(shifted, DAYS_PER_ERA)
    of_era = graph.node("Sub", shifted, graph.node("Mul", era, constant(DAYS_PER_ERA)))  # 0 ... 146096
    leap = [graph.node("Div", of_era, constant(days)) for days in (1460, 36524, 146096)]
    year_days = graph.node("Add", graph.node("Sub", of_era, leap[0]), graph.node("Sub", leap[1], leap[2]))
    year = graph.node("Div", year_days, constant(365))  # of the era, years starting on March 1st
    year_start = graph.node(
        "Sub",
        graph.node("Add", graph.node("Mul", year, constant(365)), graph.node("Div", year, constant(4))),
        graph.node("Div", year, constant(100)),
    )
    day_of_year = graph.node("Sub", of_era, year_start)  # 0 = March 1st
    from_march = graph.node(
        "Div", graph.node("Add", graph.node("Mul", day_of_year, constant(5)), constant(2)), constant(153)
    )
    return graph.node(
        "Add", graph.node("Mod", graph.node("Add", from_march, constant(2)), constant(12)), constant(1)
    )


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
            [None, 1], tf.string if is_categorical(column) else tf.float64, name=names[column.name]
        )
        for column in encoding.columns
    }


def tf_encoded(inputs: dict, encoding: FittedEncoding):
    """The encoded features, float64 `[rows, features]`, from the signature's named inputs."""
    import tensorflow as tf

    names = signature_names(encoding)
    blocks = [tf_column(inputs[names[column.name]], column.encoder) for column in encoding.columns]
    return tf.concat(blocks, axis=1)


def tf_column(values, encoder):
    import tensorflow as tf

    if isinstance(encoder, CategoryEncoding):
        return tf_category(values, encoder)
    missing = tf.math.is_nan(values)
    if isinstance(encoder, DateEncoding):
        block = tf_date(
            tf.where(missing, tf.constant(date_seconds(encoder.fill), tf.float64), values), encoder
        )
    else:
        block = tf.where(missing, tf.constant(encoder.fill, tf.float64), values)
    return tf.concat([block, tf.cast(missing, tf.float64)], axis=1) if encoder.indicator else block


def tf_category(text, encoder: CategoryEncoding):
    import tensorflow as tf

    vocabulary = tf.constant(encoder.vocabulary, tf.string, shape=[len(encoder.vocabulary)])
    known = tf.equal(text, vocabulary)  # [rows, vocabulary]
    missing = tf.equal(text, "")
    other = tf.logical_not(tf.reduce_any(known, axis=1, keepdims=True))
    if not encoder.indicator:
        return tf.cast(tf.concat([known, other], axis=1), tf.float64)
    other = tf.logical_and(other, tf.logical_not(missing))
    return tf.cast(tf.concat([known, other, missing], axis=1), tf.float64)


def tf_date(seconds, encoder: DateEncoding):
    import tensorflow as tf

    days = (seconds - tf.constant(date_seconds(encoder.origin), tf.float64)) / SECONDS_PER_DAY
    day = tf.cast(tf.floor(seconds / SECONDS_PER_DAY), tf.int64)
    weekday = tf.math.floormod(day + 3, 7)
    return tf.concat([days, tf.cast(tf_month(day), tf.float64), tf.cast(weekday, tf.float64)], axis=1)


def tf_month(day):
    """As `onnx_month`."""
    import tensorflow as tf

    shifted = day + EPOCH_SHIFT
    era = tf.math.floordiv(shifted, DAYS_PER_ERA)
    of_era = shifted - era * DAYS_PER_ERA
    year = (of_era - of_era // 1460 + of_era // 36524 - of_era // 146096) // 365
    day_of_year = of_era - (365 * year + year // 4 - year // 100)
    from_march = (5 * day_of_year + 2) // 153
    return tf.math.floormod(from_march + 2, 12) + 1
