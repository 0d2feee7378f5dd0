"""The types of a table's columns as reading sees them: numbers (the types a feature may have), and one
type for a column across the part files of a folder, or the difference named."""

from __future__ import annotations

import pyarrow as pa

from tasks.core.data.files import DatasetError
from tasks.core.messages import preview


def is_number_or_null(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_null(kind)


def is_number(kind: pa.DataType) -> bool:
    """A type a feature may have: decimals are read as float64 (see `batch_features`)."""
    return (
        pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_decimal(kind)
    )


def column_kind(kind: pa.DataType) -> str:
    if is_number(kind):
        return "number"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "text"
    return str(kind)


def unified_type(name: str, types: list[tuple[str, pa.DataType]], uri: str) -> pa.DataType:
    """One type for a column across (file, type) pairs: numbers that differ are read as float64."""
    typed = [(file, kind) for file, kind in types if not pa.types.is_null(kind)]
    if not typed:
        return pa.null()
    base_file, base_type = typed[0]
    for file, kind in typed[1:]:
        if column_kind(kind) != column_kind(base_type):
            raise DatasetError(
                f"{uri}: part file {file}: column '{name}' has type {kind}, but it is {base_type} "
                f"in part file {base_file}"
            )
    if all(kind == base_type for _, kind in typed) or column_kind(base_type) != "number":
        return base_type
    return pa.float64()


def check_same_columns(uri: str, first: tuple[str, list[str]], part: tuple[str, list[str]]) -> None:
    (first_path, expected), (path, names) = first, part
    missing = [repr(n) for n in expected if n not in names]
    extra = [repr(n) for n in names if n not in expected]
    if missing or extra:
        differences = [
            f"{label} {preview(columns)}"
            for label, columns in (("lacks", missing), ("adds", extra))
            if columns
        ]
        raise DatasetError(
            f"{uri}: part file {path} has other columns than part file {first_path}: it "
            + " and ".join(differences)
        )
