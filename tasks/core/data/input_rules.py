"""An input rule: the input's name, the check, and what the check says is wrong.

Rules read a config in its JSON form (field name -> value, a nested config as a nested mapping), so the
same rule checks a built config (`asdict`) and the JSON a user or a schedules file gives, before a
config that would refuse to be built is built from it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class InputRule:
    name: str  # the field's path in the config, e.g. "split.val_fraction"
    problem: Callable[[Mapping], str]  # what is wrong with the config's fields; "" when nothing
    fix: Callable[[Mapping], object]  # a value of the field that passes, for the message's example


def broken(rules: Iterable[InputRule], fields: Mapping) -> dict[str, str]:
    """What each broken rule says, by the field's path."""
    return {rule.name: problem for rule in rules if (problem := rule.problem(fields))}


def nested(prefix: str, rules: Iterable[InputRule]) -> tuple[InputRule, ...]:
    """`rules` of a config held in the field `prefix` of another."""
    return tuple(
        InputRule(
            f"{prefix}.{rule.name}",
            lambda fields, rule=rule: rule.problem(fields[prefix]),
            lambda fields, rule=rule: rule.fix(fields[prefix]),
        )
        for rule in rules
    )


def value_at(fields: Mapping, name: str) -> object:
    """The value at a field's path."""
    for part in name.split("."):
        fields = fields[part]
    return fields


def at_path(name: str, value: object) -> dict:
    """`value` nested under a field's path, as its JSON form: {"split": {"seed": 0}}."""
    head, _, rest = name.partition(".")
    return {head: at_path(rest, value) if rest else value}


def described(fields: Mapping, name: str, problem: str) -> str:
    return f"{name} = {value_at(fields, name)!r}: {problem}"
