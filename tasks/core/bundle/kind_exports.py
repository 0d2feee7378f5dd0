"""Each column kind's part of a bundle's exports, in one `KindExport` record per kind: the ONNX nodes and
the TensorFlow ops that encode its raw input, what the exports' metadata says of the input, sample values
for the check at export time, and its MLflow signature type and example value.

raw_inputs.py and mlflow_model.py read `EXPORTS[kind].xxx` and never test a kind. The kind's values and
the input's type come from the data layer (kind_values.py), preprocessing's part from its records
(kind_records.py); all three tables name the same kinds (tests/unit/bundle/test_kind_exports.py).

Imports onnx and tensorflow only inside the functions that use them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa

from tasks.core.data.api import (
    BOOLEAN,
    CATEGORICAL,
    DATE,
    NOT_WORD,
    NUMERIC,
    TEXT,
    WORD,
    CategoryEncoding,
    ColumnEncoding,
    DateEncoding,
    NumberEncoding,
    TextEncoding,
)

PREFIX = "raw_inputs/"  # names inside the encoding graph
SECONDS_PER_DAY = 86_400
MICROS_PER_SECOND = 1_000_000
ML_DOMAIN, ML_OPSET = "ai.onnx.ml", 3  # the ai.onnx.ml version that ONNX opset 18 pairs with
# onnxruntime's own operators, its Tokenizer among them: standard ONNX splits no text before opset 20.
ORT_DOMAIN, ORT_OPSET = "com.microsoft", 1
# A value with one word, after the column's values in the text graph: no tensor of it is then empty,
# which onnxruntime's StringNormalizer refuses. Its row is dropped before the block is returned.
WORDY_ROW = "w"
FINGERPRINT_RANGE = 2**63 - 1  # TensorFlow's 64-bit fingerprint of a word, as a non-negative int64
# Days from 0000-03-01 to 1970-01-01, and the days of a 400-year era: the civil calendar from a day
# count (Howard Hinnant's days_from_civil, inverted), in integer operations only.
EPOCH_SHIFT, DAYS_PER_ERA = 719_468, 146_097
UNIX_SECONDS = "seconds since 1970-01-01T00:00:00Z"
WORDS_RULE = "runs of ASCII letters and digits, lowercased; each word counts in its bucket of the encoding"


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

    def double(self, values: str) -> str:
        from onnx import TensorProto

        return self.node("Cast", values, to=TensorProto.DOUBLE)


def with_indicator(graph: GraphBuilder, block: str, missing: str, encoder) -> str:
    return graph.node("Concat", block, graph.double(missing), axis=1) if encoder.indicator else block


def onnx_number(graph: GraphBuilder, name: str, encoder: NumberEncoding) -> str:
    """A number or a boolean: a missing value (NaN) takes the fill, then the indicator if any."""
    missing = graph.node("IsNaN", name)
    block = graph.node("Where", missing, graph.constant(encoder.fill, np.float64), name)
    return with_indicator(graph, block, missing, encoder)


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
    return graph.double(graph.node("Equal", code, graph.constant(width, np.int64)))


def onnx_date(graph: GraphBuilder, name: str, encoder: DateEncoding) -> str:
    """Days since the origin, month and weekday from float64 seconds, a missing one (NaN) the fill's;
    then the indicator if any."""
    from onnx import TensorProto

    missing = graph.node("IsNaN", name)
    seconds = graph.node("Where", missing, graph.constant(date_seconds(encoder.fill), np.float64), name)
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
    block = graph.node("Concat", days, graph.double(month), graph.double(weekday), axis=1)
    return with_indicator(graph, block, missing, encoder)


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


def onnx_text(graph: GraphBuilder, name: str, encoder: TextEncoding) -> str:
    """Each bucket's count of the value's words found in the encoder's table, then <missing> (an empty
    string). Words as words.py finds them: onnxruntime's Tokenizer (RE2, as pyarrow and TensorFlow)
    finds the runs of ASCII letters and digits, lowercased once found, so StringNormalizer meets ASCII
    alone (its "C" locale is the one every machine has); a word not in the table takes a bucket beyond
    the last, which no bucket counts."""
    flat = graph.constant([-1], np.int64)
    values = graph.node("Reshape", name, flat)
    with_wordy_row = graph.node("Concat", values, graph.constant([WORDY_ROW], object), axis=0)
    tokens = graph.node(  # [rows + 1, most words in a row], padded with '' (no word)
        "Tokenizer", with_wordy_row, domain=ORT_DOMAIN, mark=0, mincharnum=1, pad_value="", tokenexp=WORD
    )
    lower = graph.node(
        "StringNormalizer", graph.node("Reshape", tokens, flat), case_change_action="LOWER", locale="C"
    )
    table = encoder.words or {"": encoder.buckets}  # LabelEncoder takes at least one key
    bucket = graph.node(
        "LabelEncoder",
        lower,
        domain=ML_DOMAIN,
        keys_strings=list(table),
        values_int64s=list(table.values()),
        default_int64=encoder.buckets,
    )
    by_row = graph.node(
        "Unsqueeze", graph.node("Reshape", bucket, graph.node("Shape", tokens)), graph.constant([2], np.int64)
    )
    hot = graph.node("Equal", by_row, graph.constant(np.arange(encoder.buckets), np.int64))
    counts = graph.node("ReduceSum", graph.double(hot), graph.constant([1], np.int64), keepdims=0)
    first = graph.constant([0], np.int64)
    block = graph.node("Slice", counts, first, graph.node("Shape", values), first)  # the column's rows
    missing = graph.node(
        "LabelEncoder", name, domain=ML_DOMAIN, keys_strings=[""], values_int64s=[1], default_int64=0
    )
    return with_indicator(graph, block, missing, encoder)


# ---- TensorFlow ---------------------------------------------------------------------------------------


def tf_with_indicator(block, missing, encoder):
    import tensorflow as tf

    return tf.concat([block, tf.cast(missing, tf.float64)], axis=1) if encoder.indicator else block


def tf_number(values, encoder: NumberEncoding):
    import tensorflow as tf

    missing = tf.math.is_nan(values)
    block = tf.where(missing, tf.constant(encoder.fill, tf.float64), values)
    return tf_with_indicator(block, missing, encoder)


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


def tf_date(values, encoder: DateEncoding):
    import tensorflow as tf

    missing = tf.math.is_nan(values)
    seconds = tf.where(missing, tf.constant(date_seconds(encoder.fill), tf.float64), values)
    days = (seconds - tf.constant(date_seconds(encoder.origin), tf.float64)) / SECONDS_PER_DAY
    day = tf.cast(tf.floor(seconds / SECONDS_PER_DAY), tf.int64)
    weekday = tf.math.floormod(day + 3, 7)
    block = tf.concat([days, tf.cast(tf_month(day), tf.float64), tf.cast(weekday, tf.float64)], axis=1)
    return tf_with_indicator(block, missing, encoder)


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


def tf_text(text, encoder: TextEncoding):
    """As `onnx_text`: the words of each value (the separators turned to spaces, then split), each
    looked up in the table by its fingerprint and then compared, so a word outside it counts nowhere."""
    import tensorflow as tf

    words = tf.strings.split(tf.strings.regex_replace(text[:, 0], NOT_WORD, " "))  # ragged [rows, words]
    found = tf.strings.lower(words.flat_values)
    hot = tf.one_hot(tf_buckets(found, encoder), encoder.buckets, dtype=tf.float64)  # zeros for -1
    counts = tf.math.unsorted_segment_sum(hot, words.value_rowids(), tf.shape(text, out_type=tf.int64)[0])
    return tf_with_indicator(counts, tf.equal(text, ""), encoder)


def tf_buckets(words, encoder: TextEncoding):
    """Each word's bucket in the encoder's table, -1 where it has none: the table sorted by TensorFlow's
    fingerprint of its words, searched for each word's, and the word found compared with it."""
    import tensorflow as tf

    table = encoder.words or {"": -1}
    keys = np.asarray(list(table), dtype=object)
    with tf.init_scope():  # computed once, while tracing: constants of the graph
        prints = tf.strings.to_hash_bucket_fast(keys, FINGERPRINT_RANGE).numpy()
    if len(np.unique(prints)) < len(prints):
        raise ValueError("two words of the text table share a 64-bit fingerprint; the lookup would miss one")
    order = np.argsort(prints)
    place = tf.searchsorted(
        tf.constant(prints[order]), tf.strings.to_hash_bucket_fast(words, FINGERPRINT_RANGE)
    )
    place = tf.minimum(place, len(keys) - 1)
    same = tf.equal(tf.gather(tf.constant(keys[order].tolist(), tf.string), place), words)
    buckets = np.fromiter(table.values(), dtype=np.int64, count=len(table))[order]
    return tf.where(same, tf.gather(tf.constant(buckets), place), tf.constant(-1, tf.int64))


# ---- sample values, for the check at export time ------------------------------------------------------


def sample_numbers(column: ColumnEncoding, rng, rows: int, missing: np.ndarray, mean: float, scale: float):
    """About the train spread (`mean` and `scale` of the encoded feature)."""
    return pa.array(mean + scale * rng.normal(size=rows), mask=missing)


def sample_categories(column: ColumnEncoding, rng, rows: int, missing: np.ndarray, mean: float, scale: float):
    """Each category, and an unseen one."""
    vocabulary = column.encoder.vocabulary
    unseen = "<unseen>" + "_" * max((len(value) for value in vocabulary), default=0)
    values = [*vocabulary, unseen]
    return pa.array([values[row % len(values)] for row in range(rows)], pa.string(), mask=missing)


def sample_booleans(column: ColumnEncoding, rng, rows: int, missing: np.ndarray, mean: float, scale: float):
    return pa.array(np.arange(rows) % 2 == 1, mask=missing)


def sample_dates(column: ColumnEncoding, rng, rows: int, missing: np.ndarray, mean: float, scale: float):
    """About the train range."""
    spread = max(column.encoder.fill - column.encoder.origin, MICROS_PER_SECOND * SECONDS_PER_DAY)
    micros = column.encoder.fill + (rng.normal(size=rows) * spread).astype(np.int64)
    return pa.array(micros, pa.timestamp("us", tz="UTC"), mask=missing)


def sample_texts(column: ColumnEncoding, rng, rows: int, missing: np.ndarray, mean: float, scale: float):
    """Train words in other cases, beside punctuation, a letter outside ASCII and a word never seen; and
    a value of no word."""
    words = list(column.encoder.words) or ["word"]

    def value(row: int) -> str:
        first, second = words[row % len(words)], words[(row + 1) % len(words)]
        return f"{first.upper()}, {second}-Ärger {first} unseen{row}" if row % 3 else "  ...  "

    return pa.array([value(row) for row in range(rows)], pa.string(), mask=missing)


# ---- MLflow: each input's example, the value that stands for a missing one ---------------------------


def example_category(encoder: CategoryEncoding) -> str | None:
    return encoder.vocabulary[0] if encoder.vocabulary else None


def example_text(encoder: TextEncoding) -> str | None:
    return " ".join(list(encoder.words)[:3]) or None


def example_date(encoder: DateEncoding) -> str:
    """ISO text without a zone, taken as UTC."""
    instant = datetime.fromtimestamp(encoder.fill / 1_000_000, UTC)
    return instant.replace(tzinfo=None).isoformat(timespec="seconds")


@dataclass(frozen=True)
class KindExport:
    name: str
    onnx: Callable[[GraphBuilder, str, Any], str]  # the encoded block's nodes from the named input
    tf: Callable[[Any, Any], Any]  # the encoded block from the input tensor
    rule: dict[str, Any]  # what the exports' metadata adds about the input (`raw_inputs.input_rules`)
    sample: Callable[..., pa.Array]  # rows of values the input takes (`raw_inputs.sample_table`)
    mlflow_type: str  # the MLflow signature's column type
    example: Callable[[Any], Any]  # the MLflow input example's value


EXPORTS = {
    export.name: export
    for export in (
        KindExport(NUMERIC, onnx_number, tf_number, {}, sample_numbers, "double", lambda e: float(e.fill)),
        KindExport(
            CATEGORICAL,
            onnx_category,
            tf_category,
            {"unseen": "<other>"},
            sample_categories,
            "string",
            example_category,
        ),
        # MLflow casts a JSON null to NaN in a "double" column, where a "boolean" one reads it as false.
        KindExport(
            BOOLEAN,
            onnx_number,
            tf_number,
            {"values": [0, 1]},
            sample_booleans,
            "double",
            lambda e: float(round(e.fill)),
        ),
        KindExport(DATE, onnx_date, tf_date, {"unit": UNIX_SECONDS}, sample_dates, "datetime", example_date),
        KindExport(
            TEXT,
            onnx_text,
            tf_text,
            {"words": WORDS_RULE, "unseen": "counts nowhere", "onnx_operators": ORT_DOMAIN},
            sample_texts,
            "string",
            example_text,
        ),
    )
}
