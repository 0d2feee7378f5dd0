"""The scheduled launch plans take their inputs and failure notifications from one file
(deploy/schedules.yaml, or the file SCHEDULES / MIXEDML_SCHEDULES names): a complete launch plan is
scheduled, notifies and is activated by `make register`; one with inputs missing registers without its
schedule, is not activated, and registration says which keys it lacks; a bad value is refused naming
its key."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from flytekit import FlyteContextManager
from flytekit.core.type_engine import TypeEngine
from flytekit.models.literals import Literal

from tasks.core.serving.promotion import PromotionPolicy
from tests.dependencies import REPO
from tests.flyte_package import SCHEDULES
from workflows.launch_plans import SCHEDULED
from workflows.schedules import DEFAULT_PATH, ENV, PHASES, PlanSpec, ScheduleError, load_schedules

FILLED = yaml.safe_load(SCHEDULES.read_text())
CHANNEL_OF_FIELD = {"email": "email", "slack": "slack", "pager_duty": "pagerduty"}


def python_value(literal_idl, python_type):
    literal = Literal.from_flyte_idl(literal_idl)
    return TypeEngine.to_python_value(FlyteContextManager.current_context(), literal, python_type)


# --- The package built from a filled-in file ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCHEDULED))
def test_a_complete_launch_plan_carries_its_schedule_and_the_files_inputs(flyte_package, name):
    plan = flyte_package.launch_plans[name]
    schedule = plan.spec.entity_metadata.schedule
    assert schedule.cron_schedule.schedule and schedule.kickoff_time_input_arg == "kickoff_time"
    parameters = plan.spec.default_inputs.parameters
    types = SCHEDULED[name].workflow.python_interface.inputs
    for key, value in FILLED["launch_plans"][name].items():
        carried = python_value(parameters[key].default, types[key])
        if dataclasses.is_dataclass(carried):  # the fields the file sets; the others keep their defaults
            carried = {field: getattr(carried, field) for field in value}
        assert carried == value, key


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCHEDULED))
def test_a_complete_launch_plan_notifies_the_files_recipients_when_a_run_fails(flyte_package, name):
    notifications = flyte_package.launch_plans[name].spec.entity_metadata.notifications
    carried = {}
    for notification in notifications:
        field = notification.WhichOneof("type")
        carried[CHANNEL_OF_FIELD[field]] = (
            list(getattr(notification, field).recipients_email),
            sorted(notification.phases),
        )
    phases = sorted(PHASES[phase] for phase in FILLED["notifications"]["phases"])
    expected = {channel: (FILLED["notifications"][channel], phases) for channel in CHANNEL_OF_FIELD.values()}
    assert carried == expected


# --- What `make register` activates ---------------------------------------------------------------


def make_register(tmp_path: Path, schedules: Path | None) -> tuple[str, dict[str, bool], set[str]]:
    """`make register` as written, with pyflyte talking to a recording stand-in for flyteadmin
    (tests/workers/pyflyte_recording_admin.py). Returns the output, whether each scheduled launch plan was
    created with a schedule, and the launch plans activated."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pyflyte = bin_dir / "pyflyte"
    pyflyte.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" "{REPO}/tests/workers/pyflyte_recording_admin.py" "$@"\n'
    )
    pyflyte.chmod(0o755)
    calls_file = tmp_path / "admin-calls.jsonl"
    command = ["make", "-s", "-o", ".venv/.installed", "register", f"BIN={bin_dir}", "VERSION=v1"]
    command += [f"SCHEDULES={schedules}"] if schedules else []
    environment = {k: v for k, v in os.environ.items() if k != ENV} | {"ADMIN_CALLS": str(calls_file)}
    done = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    calls = [json.loads(line) for line in calls_file.read_text().splitlines()]
    created = {
        c["name"]: c["scheduled"]
        for c in calls
        if c["call"] == "create_launch_plan" and c["name"] in SCHEDULED
    }
    activated = {c["name"] for c in calls if c["call"] == "update_launch_plan" and c["active"]}
    return done.stdout + done.stderr, created, activated


@pytest.mark.slow
def test_register_activates_only_the_launch_plans_the_file_completes_and_names_what_the_others_lack(tmp_path):
    config = yaml.safe_load(SCHEDULES.read_text())
    del config["launch_plans"]["nightly_scoring"]["model_prefix"]
    config["launch_plans"]["weekly_hardware_comparison"]["dataset_template"] = ""
    schedules = tmp_path / "schedules.yaml"
    schedules.write_text(yaml.safe_dump(config))

    output, created, activated = make_register(tmp_path, schedules)

    complete = {"nightly_retrain"}
    assert activated == complete
    assert created == {name: name in complete for name in SCHEDULED}
    for name, key in [
        ("nightly_scoring", "model_prefix"),
        ("weekly_hardware_comparison", "dataset_template"),
    ]:
        assert f"{name}: defined without its schedule, so not activated" in output
        assert f"launch_plans.{name}.{key}" in output
    assert "nightly_retrain: defined without" not in output


@pytest.mark.slow
def test_register_with_the_shipped_file_activates_no_schedule(tmp_path):
    """Nothing in deploy/schedules.yaml as shipped names a user's data, so no schedule may fire."""
    output, created, activated = make_register(tmp_path, None)
    assert activated == set()
    assert created == dict.fromkeys(SCHEDULED, False)
    assert all(f"{name}: defined without its schedule" in output for name in SCHEDULED)


# --- Bad files ------------------------------------------------------------------------------------


def specs() -> dict[str, PlanSpec]:
    return {
        name: PlanSpec(plan.workflow.python_interface.inputs, plan.required)
        for name, plan in SCHEDULED.items()
    }


def load_text(tmp_path: Path, text: str):
    path = tmp_path / "schedules.yaml"
    path.write_text(text)
    return load_schedules(specs(), path)


@pytest.mark.parametrize(
    "text, message",
    [
        ("launch_plans: {nightly_retrain: {dataset_templat: s3://b/x}}",
         "'launch_plans.nightly_retrain.dataset_templat': unknown key; did you mean 'dataset_template'?"),
        ("launch_plans: {nightly_retrian: {}}", "'launch_plans.nightly_retrian': unknown key; did you mean 'nightly_retrain'?"),
        ("launch_plans: {nightly_scoring: {max_parallel: '8'}}",
         "'launch_plans.nightly_scoring.max_parallel' = \"8\": expected a whole number"),
        ("launch_plans: {nightly_scoring: {max_parallel: 0}}",
         "'launch_plans.nightly_scoring.max_parallel' = 0: must be at least 1"),
        ("launch_plans: {nightly_retrain: {target: cuda}}", "'launch_plans.nightly_retrain.target' = 'cuda': not one of gpu"),
        ("launch_plans: {nightly_retrain: {dataset_template: 's3://b/{day}/'}}",
         "'launch_plans.nightly_retrain.dataset_template' = 's3://b/{day}/': cannot be filled: unknown fields ['day']"),
        ("launch_plans: {nightly_retrain: {hyperparameters: {epochs: 0}}}",
         "'launch_plans.nightly_retrain.hyperparameters.epochs' = 0: must be at least 1"),
        ("launch_plans: {weekly_hardware_comparison: {hyperparameters: {epoch: 3}}}",
         "'launch_plans.weekly_hardware_comparison.hyperparameters.epoch': unknown field; did you mean 'epochs'?"),
        ("launch_plans: {nightly_retrain: {promotion: {mode: strict}}}",
         "'launch_plans.nightly_retrain.promotion.mode' = 'strict': not one of gate, always"),
        ("launch_plans: {nightly_retrain: {promotion: {tolerance: 2}}}",
         "'launch_plans.nightly_retrain.promotion.tolerance' = 2.0: must be a number from 0 to 1"),
        ("launch_plans: {nightly_retrain: {promotion: {tolerence: 0.01}}}",
         "'launch_plans.nightly_retrain.promotion.tolerence': unknown field; did you mean 'tolerance'?"),
        ("launch_plans: {nightly_retrain: {promotion: gate}}",
         "'launch_plans.nightly_retrain.promotion' = 'gate': expected an object, e.g. {\"mode\": \"gate\""),
        ("launch_plans: {weekly_hardware_comparison: {prices: {cpu: -1}}}",
         "'launch_plans.weekly_hardware_comparison.prices' = {'cpu': -1.0}: every price must be a finite number >= 0"),
        ("launch_plans: {weekly_hardware_comparison: {prices: {CPU: 1}}}",
         "'launch_plans.weekly_hardware_comparison.prices' = {'CPU': 1.0}: the key 'CPU', which prices nothing: did you mean 'cpu'?"),
        ("launch_plans: {weekly_hardware_comparison: {plan_resources: 'yes'}}",
         "'launch_plans.weekly_hardware_comparison.plan_resources' = 'yes': expected true or false"),
        ("launch_plans: {nightly_retrain: {kickoff_time: 2026-01-01}}",
         "'launch_plans.nightly_retrain.kickoff_time': set by the schedule"),
        ("launch_plans: {nightly_scoring: [model_prefix]}", "'launch_plans.nightly_scoring' = ['model_prefix']: expected a mapping"),
        ("notifications: {email: [ml-team]}", "'notifications.email' = ['ml-team']: expected a list of email addresses"),
        ("notifications: {slack: ml@example.com}", "'notifications.slack' = 'ml@example.com': expected a list of email addresses"),
        ("notifications: {phases: [failure]}", "'notifications.phases' = ['failure']: expected a list of some of failed"),
        ("notifications: {emails: [ml@example.com]}", "'notifications.emails': unknown key; did you mean 'email'?"),
        ("launch-plans: {}", "'launch-plans': unknown key; did you mean 'launch_plans'?"),
        ("launch_plans: {nightly_retrain: {target: gpu}\n", "not valid YAML"),
        ("- nightly_retrain", "expected a mapping of 'notifications' and 'launch_plans'"),
    ],
)  # fmt: skip
def test_a_bad_file_is_refused_naming_the_key_at_fault(tmp_path, text, message):
    with pytest.raises(ScheduleError) as refused:
        load_text(tmp_path, text)
    assert message in str(refused.value)
    assert str(tmp_path / "schedules.yaml") in str(refused.value)


def test_every_key_at_fault_is_named_at_once(tmp_path):
    text = "launch_plans: {nightly_retrain: {target: cuda}, nightly_scoring: {max_parallel: 0}}"
    with pytest.raises(ScheduleError) as refused:
        load_text(tmp_path, text)
    assert "launch_plans.nightly_retrain.target" in str(refused.value)
    assert "launch_plans.nightly_scoring.max_parallel" in str(refused.value)


def test_a_file_named_by_the_environment_must_exist(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "absent.yaml"))
    with pytest.raises(ScheduleError, match=f"absent.yaml: no such file \\({ENV} names it\\)"):
        load_schedules(specs())


def test_required_inputs_left_empty_or_unset_are_missing_and_the_rest_are_kept(tmp_path):
    text = "launch_plans: {nightly_scoring: {model_prefix: '', label_column: churned, max_parallel: 4}}"
    schedules = load_text(tmp_path, text)
    scoring = schedules.plans["nightly_scoring"]
    assert scoring.missing == ("model_prefix", "dataset_template")
    assert scoring.inputs == {"model_prefix": "", "label_column": "churned", "max_parallel": 4}
    assert schedules.notifications == []


def test_the_shipped_file_is_valid_and_names_no_data():
    schedules = load_schedules(specs(), DEFAULT_PATH)
    assert all(plan.missing for plan in schedules.plans.values())


def test_the_nightly_retraining_gates_promotion_where_a_run_by_hand_promotes_always(tmp_path):
    """The shipped file names the gate; a file that leaves `promotion` out gets the workflow's default,
    the gate too; any policy a file gives defaults to the gate; training_pipeline alone promotes always."""
    from workflows.pipeline import training_pipeline

    shipped = load_schedules(specs(), DEFAULT_PATH).plans["nightly_retrain"].inputs["promotion"]
    assert shipped == PromotionPolicy(mode="gate", metric="macro_f1", tolerance=0.0)
    assert (
        SCHEDULED["nightly_retrain"].workflow.python_interface.default_inputs_as_kwargs["promotion"]
        == shipped
    )
    assert training_pipeline.python_interface.default_inputs_as_kwargs["promotion"].mode == "always"
    text = "launch_plans: {nightly_retrain: {promotion: {metric: accuracy, tolerance: 0.01}}}"
    given = load_text(tmp_path, text).plans["nightly_retrain"].inputs["promotion"]
    assert given == PromotionPolicy(mode="gate", metric="accuracy", tolerance=0.01)


@pytest.mark.slow
def test_the_weekly_comparison_compares_on_the_partition_of_its_kickoff_day(flyte_package):
    nodes = flyte_package.workflows["workflows.launch_plans.scheduled_comparison"].template.nodes
    (partition,) = [
        n.id for n in nodes if n.task_node.reference_id.name == "tasks.schedule.dataset_partition"
    ]
    (comparison,) = [
        n for n in nodes if n.workflow_node.sub_workflow_ref.name.endswith("hardware_comparison")
    ]
    (dataset,) = [b.binding.promise for b in comparison.inputs if b.var == "dataset"]
    assert dataset.node_id == partition
