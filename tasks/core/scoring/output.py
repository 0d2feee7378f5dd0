"""The output's columns: the input's columns the model does not read, `prediction`, one probability
column per class."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.core.bundle.loading import Bundle, finite_rows
from tasks.core.scoring.records import PREDICTION, PROBABILITY_PREFIX

# ---- the output's columns -------------------------------------------------------------------------------


def probability_columns(class_labels: list, taken: set[str]) -> list[str]:
    """`probability_<label>` per class, reduced to letters, digits, '_', '-' and '.', and made unique
    against each other and the columns passed through."""
    names: list[str] = []
    used = set(taken)
    for label in class_labels:
        base = PROBABILITY_PREFIX + (re.sub(r"[^0-9A-Za-z_.-]+", "_", str(label)).strip("_") or "class")
        name, suffix = base, 2
        while name in used:
            name, suffix = f"{base}_{suffix}", suffix + 1
        used.add(name)
        names.append(name)
    return names


@dataclass(frozen=True)
class OutputLayout:
    """The columns of every part: the input's columns the model does not read, `prediction`, the
    probabilities."""

    passthrough: list[str]
    labels: pa.Array  # the class labels as trained, indexed by class code
    probabilities: list[str]
    schema: pa.Schema
    suffixed: dict[str, str] = field(default_factory=dict)  # a probability column the input held -> ours

    @classmethod
    def of(cls, bundle: Bundle, input_schema: pa.Schema) -> OutputLayout:
        read = set(bundle.input_columns)
        passthrough = [f for f in input_schema if f.name not in read]
        if bundle.target.regression:  # the predicted number alone, in the label's type
            number = pa.int64() if bundle.manifest.record.label_kind == "integer" else pa.float64()
            schema = pa.schema([*passthrough, pa.field(PREDICTION, number)])
            return cls([f.name for f in passthrough], pa.array([]), [], schema)
        labels = pa.array(bundle.class_labels)
        names = probability_columns(bundle.class_labels, {f.name for f in passthrough} | {PREDICTION})
        plain = probability_columns(bundle.class_labels, {PREDICTION})
        fields = [
            *passthrough,
            pa.field(PREDICTION, labels.type),
            *(pa.field(n, pa.float32()) for n in names),
        ]
        suffixed = {old: new for old, new in zip(plain, names, strict=True) if old != new}
        return cls([f.name for f in passthrough], labels, names, pa.schema(fields), suffixed)

    @property
    def dictionary(self) -> list[str]:
        """The columns parquet dictionary-encodes: never the probabilities, where it cuts write time 6x."""
        return [*self.passthrough, PREDICTION]

    def number_batch(self, batch: pa.RecordBatch, numbers: np.ndarray) -> pa.RecordBatch:
        """A regression's output rows (`numbers`: `predict_numbers`, whole for an integer label); a row
        without a finite prediction gets a null."""
        void = ~np.isfinite(numbers)
        kind = self.schema.field(PREDICTION).type
        values = np.where(void, 0.0, numbers).astype(np.int64) if kind == pa.int64() else numbers
        columns = [batch.column(name) for name in self.passthrough]
        columns.append(pa.array(values, kind, mask=void if void.any() else None))
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def batch(self, batch: pa.RecordBatch, codes: np.ndarray, probabilities: np.ndarray) -> pa.RecordBatch:
        """The output rows; a row whose probabilities are not all finite gets nulls, not an answer."""
        by_class = np.ascontiguousarray(probabilities.T)  # one copy; each class becomes a column
        void = ~finite_rows(probabilities)
        mask = void if void.any() else None
        columns = [batch.column(name) for name in self.passthrough]
        columns += [
            pc.take(self.labels, pa.array(codes, mask=mask)),
            *(pa.array(values, mask=mask) for values in by_class),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)
