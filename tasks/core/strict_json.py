"""Strict decoding of a dataclass from its JSON form: an unknown field or a value of the wrong type is
named, never dropped or coerced (flytekit's own decoding drops unknown keys and turns 2.7 into 2)."""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from collections.abc import Collection, Mapping

NO_EXAMPLES: Mapping[type, str] = {}
TYPE_NAMES = {int: "a whole number", float: "a number", str: "a string"}


def shape_problems(
    raw: object, cls: type, path: str, examples: Mapping[type, str] = NO_EXAMPLES
) -> list[str]:
    """Unknown fields and values of the wrong type in `raw`, the JSON form of dataclass `cls`."""
    if not isinstance(raw, dict):
        return [
            f"input '{path}' = {raw!r}: expected an object{', e.g. ' + examples[cls] if cls in examples else ''}"
        ]
    hints = typing.get_type_hints(cls)
    found = [unknown_field(path, name, hints) for name in raw if name not in hints]
    for name, value in raw.items():
        if name in hints:
            found += value_problems(value, hints[name], f"{path}.{name}", examples)
    return found


def unknown_field(path: str, name: str, hints: Collection[str]) -> str:
    close = difflib.get_close_matches(str(name), hints, n=1)
    guess = f"did you mean '{close[0]}'? " if close else ""
    return f"input '{path}.{name}': unknown field; {guess}known fields: {', '.join(hints)}"


def value_problems(
    value: object, hint: object, path: str, examples: Mapping[type, str] = NO_EXAMPLES
) -> list[str]:
    if dataclasses.is_dataclass(hint):
        return shape_problems(value, hint, path, examples)
    if typing.get_origin(hint) is dict:
        if not isinstance(value, dict):
            return [f"input '{path}' = {value!r}: expected an object of names to values"]
        return [
            found
            for key, item in value.items()
            for found in value_problems(item, typing.get_args(hint)[1], f"{path}.{key}", examples)
        ]
    if typing.get_origin(hint) is list:
        if not isinstance(value, list):
            return [f"input '{path}' = {json.dumps(value)}: expected a list"]
        (item_hint,) = typing.get_args(hint)
        return [
            found
            for index, item in enumerate(value)
            for found in value_problems(item, item_hint, f"{path}[{index}]", examples)
        ]
    if any(fits(value, accepted) for accepted in args(hint)):
        return []
    expected = " or ".join(TYPE_NAMES[accepted] for accepted in args(hint))
    if isinstance(value, list) and float in args(hint):
        expected += ", or a list of numbers such as [64, 32]"
    return [f"input '{path}' = {json.dumps(value)}: expected {expected}"]


def args(hint: object) -> tuple:
    """The types a field accepts: those of a union, else the type itself."""
    return typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)


def fits(value: object, accepted: type) -> bool:
    if isinstance(value, bool):  # JSON's true is not the number 1
        return accepted is bool
    if accepted is int:  # a whole float too: a JSON literal carries every number as a float
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if accepted is float:
        return isinstance(value, int | float)
    return isinstance(value, accepted)


def instantiate(cls: type, raw: dict):
    """The dataclass `cls` from `raw`, its JSON form, once `shape_problems` found nothing wrong in it."""
    hints = typing.get_type_hints(cls)
    return cls(**{name: convert(value, hints[name]) for name, value in raw.items()})


def convert(value: object, hint: object) -> object:
    if dataclasses.is_dataclass(hint):
        return instantiate(hint, value)
    if typing.get_origin(hint) is dict:
        return {key: convert(item, typing.get_args(hint)[1]) for key, item in value.items()}
    if hint is int:
        return int(value)
    return float(value) if isinstance(value, int | float) and float in args(hint) else value
