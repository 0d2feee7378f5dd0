"""Encodings the export tests build without preprocessing a table."""

from __future__ import annotations

from tasks.core.data.api import FittedEncoding


def numeric_encoding(names, fills=None) -> FittedEncoding:
    """Every column a number read as it is, no gaps in the train rows: the exports take "features".
    `fills`: each column's train mean, 0 by default."""
    fills = fills or [0.0] * len(names)
    return FittedEncoding.from_dict({
        "version": 1,
        "left_out": {},
        "columns": [
            {"name": name, "kind": "numeric", "fill": fill, "indicator": False}
            for name, fill in zip(names, fills, strict=True)
        ],
    })  # fmt: skip


def numbered_encoding(count: int) -> FittedEncoding:
    return numeric_encoding([f"f{index}" for index in range(count)])
