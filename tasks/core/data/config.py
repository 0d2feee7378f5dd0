"""The data a run trains on: the one data input that crosses the task boundaries, from a workflow's
`data` input to preprocessing, with the one table of rules every entry point checks it by (the
workflows' first task, pyflyte's parsing of `--data`, the schedules file at registration)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from tasks.core.data.column_kinds import CATEGORICAL, FORCED_KINDS, column_kind_problem
from tasks.core.data.input_rules import InputRule, at_path, broken, nested, value_at
from tasks.core.data.prepare import EMBEDDED_DIGITS_LABEL
from tasks.core.data.split_config import SPLIT_RULES, SplitConfig
from tasks.core.messages import raise_for
from tasks.core.strict_json import instantiate, shape_problems

EXAMPLE = '{"dataset": "data/iris.csv", "label_column": "species", "split": {"split_by": "signed_up"}}'


@dataclass
class DataConfig:
    """The table, its label column, the kinds forced on some columns, and how its rows are split.
    `problems()` holds every rule; the workflows check it before any data is read."""

    # Parquet or CSV file, a folder of part files, or any fsspec URI; empty: the embedded digits.
    dataset: str = ""
    label_column: str = EMBEDDED_DIGITS_LABEL
    # A column's kind where the guess from its type is wrong (FORCED_KINDS), or "drop" to leave it out.
    column_kinds: dict[str, str] = field(default_factory=dict)
    split: SplitConfig = field(default_factory=SplitConfig)

    @classmethod
    def from_json(cls, text: str) -> DataConfig:
        """The config from `--data` JSON, checked strictly (pyflyte run's parser calls this when a
        dataclass has it, instead of decoding leniently)."""
        return parse_data(json.loads(text))

    def problems(self) -> dict[str, str]:
        """What is wrong, by the field's path (e.g. "split.val_fraction"); empty when the config can run."""
        return rule_problems(asdict(self))


def label_problem(fields: Mapping) -> str:
    """Without a dataset the embedded digits are used, and their label column is fixed."""
    if not fields["label_column"]:
        return "must name the column holding the label"
    if fields["dataset"] or fields["label_column"] == EMBEDDED_DIGITS_LABEL:
        return ""
    return f"the embedded digits dataset has label column '{EMBEDDED_DIGITS_LABEL}'; name your own dataset to use another"


def split_by_problem(fields: Mapping) -> str:
    """The column a time-ordered split goes by; its kind and values are checked when the data is read."""
    if fields["split"]["split_by"] and fields["split"]["split_by"] == fields["label_column"]:
        return (
            "is the label column; name a column of dates, times or numbers to split by, or leave it empty "
            "for a stratified random split"
        )
    return ""


def fixed_kinds(fields: Mapping) -> dict[str, str]:
    return {name: CATEGORICAL for name, kind in fields["column_kinds"].items() if kind not in FORCED_KINDS}


# Every rule of the data input: the field's path, the check (what it says is wrong), a value that passes.
DATA_RULES = (
    InputRule("label_column", label_problem, lambda _: EMBEDDED_DIGITS_LABEL),
    InputRule("column_kinds", lambda fields: column_kind_problem(fields["column_kinds"]), fixed_kinds),
    InputRule("split.split_by", split_by_problem, lambda _: ""),
    *nested("split", SPLIT_RULES),
)


def rule_problems(fields: Mapping) -> dict[str, str]:
    """What the data rules find wrong in a config's JSON form (`json_form`), by the field's path."""
    return broken(DATA_RULES, fields)


def json_form(raw: Mapping) -> dict:
    """`raw`, the JSON form of a DataConfig, with every field it leaves out at its default."""
    defaults = asdict(DataConfig())
    return {**defaults, **raw, "split": {**defaults["split"], **raw.get("split", {})}}


def input_problems(
    fields: Mapping, path: str = "data", rules: tuple[InputRule, ...] = DATA_RULES
) -> list[str]:
    """Every broken rule as the message a user reads: the input, its value, the rule and the fix."""
    return [
        f"input '{path}.{name}' = {value_at(fields, name)!r}: {problem}; "
        f"pass e.g. --{path} '{json.dumps(at_path(name, rule.fix(fields)))}'"
        for rule in rules
        for name, problem in broken([rule], fields).items()
    ]


def parse_data(raw: object, path: str = "data") -> DataConfig:
    """The config from its JSON form, strictly: an unknown field, a value of the wrong type or one its
    rules refuse is an InputError naming it, raised before the config is built (a split refuses to be
    built from a bad value)."""
    raise_for(shape_problems(raw, DataConfig, path, {DataConfig: EXAMPLE}))
    raise_for(input_problems(json_form(raw), path))
    return instantiate(DataConfig, raw)


def decoded_data(raw: object, path: str = "data") -> DataConfig:
    """The config as a task decodes it from a literal: strictly in its shape and by every rule but the
    label column's, which reads the dataset, and a schedule's run fills that in a task later
    (`data_partition`); the run checks the label column once its dataset is known."""
    raise_for(shape_problems(raw, DataConfig, path, {DataConfig: EXAMPLE}))
    rules = tuple(rule for rule in DATA_RULES if rule.name != "label_column")
    raise_for(input_problems(json_form(raw), path, rules))
    return instantiate(DataConfig, raw)
