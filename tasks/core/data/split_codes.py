"""The stored columns of the standardised (train and val) splits: a categorical feature is one small integer
column of codes, each row's code the place of its one-hot column among the feature's encoded names, rather
than its one-hot columns themselves (up to a hundred float32 columns, most of the writing).

Reading a split expands the codes back into the standardised float32 one-hot columns (`expanded_features`),
bit for bit what `FittedEncoding.transform_scaled` writes: the split's schema metadata, under `CODES_KEY`,
maps each code column to its encoded names and each one's standardised value for 'off' (0) and 'on' (1).
A table without categories stores its encoded features as they are, with no such metadata.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tasks.core.data.encoding import ColumnEncoding, FittedEncoding
from tasks.core.data.kind_records import RECORDS

CODES_KEY = b"mixedml.split_codes"
CODE_COLUMN_SUFFIX = "#code"  # appended to a code column's name while another column has it


@dataclass(frozen=True)
class CodedFeature:
    """A categorical feature's code column: its encoded names in code order, and each one's standardised
    value (float32) where the row's code is another ('off') and where it is its own ('on')."""

    names: list[str]
    off: np.ndarray
    on: np.ndarray

    def to_dict(self) -> dict:
        return {"names": self.names, "off": self.off.tolist(), "on": self.on.tolist()}

    @classmethod
    def from_dict(cls, saved: dict) -> CodedFeature:
        # A float32 written as a float64 reads back as the same float32.
        return cls(saved["names"], np.asarray(saved["off"], np.float32), np.asarray(saved["on"], np.float32))


@dataclass(frozen=True)
class SplitLayout:
    """A standardised split's stored feature columns, in order, and the code columns among them."""

    fields: list[pa.Field]
    coded: dict[str, CodedFeature]  # by stored column

    def metadata(self) -> dict[bytes, bytes] | None:
        if not self.coded:
            return None
        return {CODES_KEY: json.dumps({name: f.to_dict() for name, f in self.coded.items()}).encode()}


def is_coded(column: ColumnEncoding) -> bool:
    return RECORDS[column.kind].coded


def code_type(width: int) -> pa.DataType:
    """The smallest signed integer that holds every code of a feature `width` one-hot columns wide."""
    for bits, kind in ((8, pa.int8()), (16, pa.int16())):
        if width <= 2 ** (bits - 1):
            return kind
    return pa.int32()


def split_layout(
    encoding: FittedEncoding, mean: np.ndarray, scale: np.ndarray, label_column: str
) -> SplitLayout:
    """The stored columns of a split standardised by `mean` and `scale` (float64, one per encoded
    feature): float32 features as they are, a code column for each categorical feature. A code column is
    named after its feature, unless an encoded name or the label has that name."""
    fields, coded, taken, start = [], {}, {*encoding.encoded_names(), label_column}, 0
    for column in encoding.columns:
        names = column.encoder.names(column.name)
        part = slice(start, start + len(names))
        start = part.stop
        if not is_coded(column):
            fields += [pa.field(name, pa.float32()) for name in names]
            continue
        stored = column.name
        while stored in taken:
            stored += CODE_COLUMN_SUFFIX
        taken.add(stored)
        with np.errstate(over="ignore"):  # an 'off' or 'on' beyond float32 is refused where a row holds it
            coded[stored] = CodedFeature(names, *column.encoder.scaled_values(mean[part], scale[part]))
        fields.append(pa.field(stored, code_type(len(names))))
    return SplitLayout(fields, coded)


def split_coded(schema: pa.Schema) -> dict[str, CodedFeature]:
    """The code columns a split's schema records: none in a split without categories (or any other
    table, such as the raw test split)."""
    saved = (schema.metadata or {}).get(CODES_KEY)
    if saved is None:
        return {}
    return {name: CodedFeature.from_dict(feature) for name, feature in json.loads(saved).items()}


def coded_places(coded: dict[str, CodedFeature]) -> dict[str, tuple[str, int]]:
    """Each encoded name held in a code column: the column, and the code that is its 'on'."""
    return {name: (stored, code) for stored, f in coded.items() for code, name in enumerate(f.names)}


def stored_columns(schema: pa.Schema, features: list[str]) -> list[str]:
    """The split's columns that hold `features`, in the order they are first needed."""
    places = coded_places(split_coded(schema))
    return list(dict.fromkeys(places[name][0] if name in places else name for name in features))


def expanded_features(
    batch: pa.RecordBatch | pa.Table,
    features: list[str],
    coded: dict[str, CodedFeature],
    values: Callable[[pa.Array | pa.ChunkedArray], np.ndarray],
    dtype: type,
) -> np.ndarray:
    """The batch's `features` (rows x features, `dtype`), code columns expanded to their one-hot
    columns' standardised values; `values` reads a stored feature column as numpy."""
    places = coded_places(coded)
    out = np.empty((batch.num_rows, len(features)), dtype=dtype)
    wanted: dict[str, list[tuple[int, int]]] = {}  # code column -> (feature index, code)
    for index, name in enumerate(features):
        if name in places:
            stored, code = places[name]
            wanted.setdefault(stored, []).append((index, code))
        else:
            out[:, index] = values(batch.column(name))
    for stored, taken in wanted.items():
        expand(batch.column(stored).to_numpy(), coded[stored], taken, out)
    return out


def expand(codes: np.ndarray, feature: CodedFeature, taken: list[tuple[int, int]], out: np.ndarray) -> None:
    """Into `out`'s columns in `taken` (feature index, code), each one-hot column's standardised value:
    'on' in the rows whose code is its own, 'off' elsewhere."""
    indexes, own = (np.array(each) for each in zip(*taken, strict=True))
    out[:, indexes] = feature.off[own]
    column_of = np.full(len(feature.names), -1)  # each code's place in `out`, or -1 where not read
    column_of[own] = indexes
    rows = np.flatnonzero(column_of[codes] >= 0)
    out[rows, column_of[codes[rows]]] = feature.on[codes[rows]]
