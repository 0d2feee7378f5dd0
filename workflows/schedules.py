"""The scheduled launch plans' inputs, and who hears when a scheduled run fails, from one file.

A launch plan's inputs are fixed where it is defined in code: `pyflyte register` and `flytectl update
launchplan` cannot set them. So workflows/launch_plans.py reads them here when pyflyte imports it to
package or register: from the file that MIXEDML_SCHEDULES names (the Makefile's SCHEDULES), else
deploy/schedules.yaml beside the code (an absent default file reads as empty). Every value is checked
against the workflow input it sets, and one error names every key at fault. A plan that can run a study
(nightly_retrain) takes a `tuning` section of its settings, which makes it run the study instead.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import yaml
from flytekit import Email, PagerDuty, Slack, WorkflowExecutionPhase
from flytekit.core.notification import Notification

from tasks.catalog import DEFAULT_PRICES_PER_HOUR
from tasks.core.data.config import EXAMPLE as DATA_EXAMPLE
from tasks.core.data.config import DataConfig, json_form, rule_problems
from tasks.core.data.input_rules import value_at
from tasks.core.data.schedule_uri import partition_uri
from tasks.core.evaluation.compare import price_problems, unknown_price_key
from tasks.core.publish.promotion import EXAMPLE as PROMOTION_EXAMPLE
from tasks.core.publish.promotion import PromotionPolicy
from tasks.core.strict_json import convert, instantiate, shape_problems, value_problems
from tasks.core.training.config import EXAMPLES, TrainConfig, with_option_lists_joined
from tasks.core.tuning.checks import tuning_problems
from tasks.core.tuning.study import TuningSettings
from tasks.targets import TARGETS

ENV = "MIXEDML_SCHEDULES"
DEFAULT_PATH = Path(__file__).resolve().parents[1] / "deploy" / "schedules.yaml"
# Every scheduled workflow takes the time its schedule fired; the schedule sets it, never the file.
KICKOFF = "kickoff_time"
# A plan's section that makes it run a study (docs/tuning.md): its keys are the study's settings.
TUNING = "tuning"
TUNING_KEYS = tuple(setting.name for setting in dataclasses.fields(TuningSettings))

# The terminal phases flytekit accepts for a notification (flytekit/core/notification.py, VALID_PHASES).
PHASES = {
    "failed": WorkflowExecutionPhase.FAILED,
    "timed_out": WorkflowExecutionPhase.TIMED_OUT,
    "aborted": WorkflowExecutionPhase.ABORTED,
    "succeeded": WorkflowExecutionPhase.SUCCEEDED,
}
DEFAULT_PHASES = ["failed", "timed_out"]
# All three are email addresses to flyteadmin: a Slack channel's or a PagerDuty service's address.
CHANNELS = {"email": Email, "slack": Slack, "pagerduty": PagerDuty}
EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
# An object of each dataclass input, for messages about a value of the wrong form.
DATACLASS_EXAMPLES = {**EXAMPLES, PromotionPolicy: PROMOTION_EXAMPLE, DataConfig: DATA_EXAMPLE}


class ScheduleError(ValueError):
    """A schedules file that cannot work; the message names the file and each key at fault."""


@dataclass(frozen=True)
class PlanSpec:
    inputs: Mapping[str, object]  # the workflow's inputs and their Python types
    required: tuple[str, ...]  # the inputs without which a scheduled run is not worth running
    # The inputs of the workflow the plan runs instead when the file gives it a `tuning` section (a
    # study, whose settings are among them); None: the plan takes no such section.
    tuned_inputs: Mapping[str, object] | None = None


@dataclass(frozen=True)
class PlanConfig:
    inputs: dict[str, object]  # the values the file sets, as the workflow's Python types
    missing: tuple[str, ...]  # required inputs the file leaves unset or empty
    # The study's settings the `tuning` section sets, as the tuned workflow's inputs; None: no study.
    tuning: dict[str, object] | None = None


@dataclass(frozen=True)
class Schedules:
    source: Path
    plans: dict[str, PlanConfig]
    notifications: list[Notification]

    def unset_keys(self, plan: str) -> str:
        return ", ".join(f"launch_plans.{plan}.{name}" for name in self.plans[plan].missing)


def schedules_path() -> Path:
    named = os.environ.get(ENV)
    return Path(named) if named else DEFAULT_PATH


def load_schedules(specs: Mapping[str, PlanSpec], path: Path | None = None) -> Schedules:
    path = shown(path or schedules_path())
    raw = read(path)
    found = unknown_keys(raw, ("notifications", "launch_plans"), "")
    plans_raw = section(raw, "launch_plans", found)
    found += unknown_keys(plans_raw, specs, "launch_plans.")
    plans = {}
    for name, spec in specs.items():
        plans[name], plan_found = plan_config(
            section(plans_raw, name, found, f"launch_plans.{name}"), spec, name
        )
        found += plan_found
    notifications, notification_found = notifications_of(section(raw, "notifications", found))
    found += notification_found
    if found:
        raise ScheduleError(f"{path}: " + "\n  ".join(["cannot schedule the launch plans:", *found]))
    return Schedules(path, plans, notifications)


def shown(path: Path) -> Path:
    """The path as messages show it: relative to the working directory where it is inside it."""
    try:
        return path.resolve().relative_to(Path.cwd())
    except ValueError:
        return path


def read(path: Path) -> dict:
    if not path.exists():
        if path.resolve() == DEFAULT_PATH and ENV not in os.environ:
            return {}
        raise ScheduleError(f"{path}: no such file ({ENV} names it)")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ScheduleError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(raw, dict | None):
        raise ScheduleError(f"{path}: expected a mapping of 'notifications' and 'launch_plans', got {raw!r}")
    return raw or {}


def section(raw: dict, key: str, found: list[str], path: str | None = None) -> dict:
    """The mapping under `key`; empty when unset (an error is added when it is not a mapping)."""
    value = raw.get(key)
    if value is not None and not isinstance(value, dict):
        found.append(f"'{path or key}' = {value!r}: expected a mapping")
    return value if isinstance(value, dict) else {}


def unknown_keys(raw: dict, known: Collection[str], prefix: str) -> list[str]:
    return [unknown_key(str(key), known, prefix) for key in raw if key not in known]


def unknown_key(key: str, known: Collection[str], prefix: str) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    guess = f"did you mean '{close[0]}'? " if close else ""
    return f"'{prefix}{key}': unknown key; {guess}known keys: {', '.join(known)}"


def plan_config(raw: dict, spec: PlanSpec, plan: str) -> tuple[PlanConfig, list[str]]:
    settable = {name: hint for name, hint in spec.inputs.items() if name != KICKOFF}
    prefix = f"launch_plans.{plan}."
    known = [*settable, TUNING] if spec.tuned_inputs is not None else list(settable)
    found = unknown_keys({k: v for k, v in raw.items() if k != KICKOFF}, known, prefix)
    if KICKOFF in raw:
        found.append(f"'{prefix}{KICKOFF}': set by the schedule each time it fires; remove it")
    inputs = {}
    for name, value in raw.items():
        if name in settable and value is not None:
            inputs[name], value_found = checked(value, settable[name], f"{prefix}{name}")
            found += value_found
    missing = tuple(name for name in spec.required if raw.get(name) in (None, ""))
    tuning = None
    if spec.tuned_inputs is not None and raw.get(TUNING) is not None:
        tuning, tuning_found = tuning_config(raw, inputs, spec.tuned_inputs, prefix)
        found += tuning_found
    return PlanConfig(inputs, missing, tuning), found


def tuning_config(
    raw: dict, inputs: dict, tuned_inputs: Mapping[str, object], prefix: str
) -> tuple[dict[str, object], list[str]]:
    """The plan's `tuning` section as the study's inputs, and what is wrong with it: each setting as a
    run checks it (tasks/core/tuning/checks.py), the search space against the plan's hyperparameters and
    the metric against its data's problem type. An input of the plan that a study does not take is
    refused too (a study plans every trial: plan_resources)."""
    key, section_raw = f"{prefix}{TUNING}", raw[TUNING]
    if not isinstance(section_raw, dict):
        return {}, [f"'{key}' = {section_raw!r}: expected a mapping of study settings, e.g. {{trials: 8}}"]
    found = unknown_keys(section_raw, TUNING_KEYS, f"{key}.")
    found += [
        f"'{prefix}{name}': not an input of a study (with '{key}'), which plans every trial; remove it"
        for name in raw
        if name not in (TUNING, KICKOFF, *tuned_inputs) and name in inputs
    ]
    values = {}
    for name, value in section_raw.items():
        if name in TUNING_KEYS and value is not None:
            # A search space may be written as YAML: the study reads it as JSON text.
            value = json.dumps(value) if name == "search_space" and isinstance(value, dict) else value
            values[name], value_found = checked(value, tuned_inputs[name], f"{key}.{name}")
            found += value_found
    if not found:
        found += study_problems(values, inputs, key)
    return values, found


def study_problems(values: dict[str, object], inputs: dict, key: str) -> list[str]:
    """The study's rules, each message naming the section's key: against the plan's hyperparameters and
    data where the file sets them validly (the defaults otherwise, whose own problems are named apart)."""
    base, data = inputs.get("hyperparameters"), inputs.get("data")
    base = base if isinstance(base, TrainConfig) and not base.problems() else TrainConfig()
    problem_type = data.split.problem_type if isinstance(data, DataConfig) else "auto"
    found = tuning_problems(TuningSettings(**values), base, problem_type)
    # "input 'trials' = 0: ..." -> "'launch_plans.nightly_retrain.tuning.trials' = 0: ..."
    return [f"'{key}." + problem.removeprefix("input '") for problem in found]


def checked(value: object, hint: object, key: str) -> tuple[object, list[str]]:
    """`value` as the input's Python type, and what is wrong with it."""
    if hint is bool:
        return value, [] if isinstance(value, bool) else [f"'{key}' = {value!r}: expected true or false"]
    if hint is DataConfig:
        return checked_data(value, key)
    if dataclasses.is_dataclass(hint):
        value = with_option_lists_joined(value)
        found = [
            problem.removeprefix("input ") for problem in shape_problems(value, hint, key, DATACLASS_EXAMPLES)
        ]
        if found:
            return None, found
        config = instantiate(hint, value)
        return config, [
            f"'{key}.{name}' = {getattr(config, name)!r}: {rule}" for name, rule in config.problems().items()
        ]
    found = [
        problem.removeprefix("input ") for problem in value_problems(value, hint, key, DATACLASS_EXAMPLES)
    ]
    if found:
        return None, found
    value = convert(value, hint)
    rule = RULES.get(key.rsplit(".", 1)[-1])
    problem = rule(value) if rule else ""
    return value, [f"'{key}' = {value!r}: {problem}"] if problem else []


def checked_data(value: object, key: str) -> tuple[DataConfig | None, list[str]]:
    """The data input, by the data rules on its JSON form (a split refuses to be built from a bad value).
    Its dataset is the partition the template names, as the rules read it."""
    found = [
        problem.removeprefix("input ")
        for problem in shape_problems(value, DataConfig, key, DATACLASS_EXAMPLES)
    ]
    if found:
        return None, found
    if "dataset" in value:
        return None, [
            f"'{key}.dataset': filled from dataset_template each time the schedule fires; remove it"
        ]
    fields = {**json_form(value), "dataset": "{dataset_template}"}
    found = [
        f"'{key}.{name}' = {value_at(fields, name)!r}: {problem}"
        for name, problem in rule_problems(fields).items()
    ]
    return (None if found else instantiate(DataConfig, value)), found


def template_rule(template: str) -> str:
    """What the run would refuse (tasks/core/data/schedule_uri.py), without the input's name it puts first."""
    try:
        partition_uri(template, datetime(2000, 1, 1))
    except ValueError as error:
        return str(error).removeprefix(f"input 'dataset_template' = '{template}' ")
    return ""


def price_rule(prices: Mapping[str, float]) -> str:
    unknown = [name for name in prices if name not in DEFAULT_PRICES_PER_HOUR]
    if unknown:
        return unknown_price_key(unknown[0], DEFAULT_PRICES_PER_HOUR).removeprefix("input 'prices' has ")
    if price_problems(prices):
        return "every price must be a finite number >= 0 (USD per accelerator-hour)"
    return ""


# Rules on an input's value beyond its type, by input name (the workflows check them again at run time).
RULES = {
    "dataset_template": template_rule,
    "target": lambda target: "" if target in TARGETS else f"not one of {', '.join(TARGETS)}",
    "max_parallel": lambda count: "" if count >= 1 else "must be at least 1",
    "prices": price_rule,
}


def notifications_of(raw: dict) -> tuple[list[Notification], list[str]]:
    found = unknown_keys(raw, ["phases", *CHANNELS], "notifications.")
    phases = raw.get("phases", DEFAULT_PHASES)
    if not isinstance(phases, list) or not phases or any(phase not in PHASES for phase in phases):
        found.append(f"'notifications.phases' = {phases!r}: expected a list of some of {', '.join(PHASES)}")
        phases = []
    notifications = []
    for channel, kind in CHANNELS.items():
        recipients = raw.get(channel) or []
        bad = recipients if not isinstance(recipients, list) else [r for r in recipients if not is_email(r)]
        if bad:
            found.append(f"'notifications.{channel}' = {recipients!r}: expected a list of email addresses")
        elif recipients and phases:
            notifications.append(
                kind(phases=[PHASES[phase] for phase in phases], recipients_email=recipients)
            )
    return notifications, found


def is_email(value: object) -> bool:
    return isinstance(value, str) and EMAIL.fullmatch(value) is not None
