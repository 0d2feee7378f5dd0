"""The scheduled launch plans as the package and `make register` carry them: a complete launch plan is
scheduled, notifies and is activated; one with inputs missing registers without its schedule and is not
activated, and registration says which keys it lacks (the file's own checks:
tests/unit/workflows/test_schedules.py)."""

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

from tests.dependencies import REPO
from tests.flyte_package import SCHEDULES
from workflows.launch_plans import SCHEDULED
from workflows.schedules import ENV, PHASES

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
@pytest.mark.heavy  # `make register` against a recording flyteadmin: the deploy scenario
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
@pytest.mark.heavy  # `make register` against a recording flyteadmin: the deploy scenario
def test_register_with_the_shipped_file_activates_no_schedule(tmp_path):
    """Nothing in deploy/schedules.yaml as shipped names a user's data, so no schedule may fire."""
    output, created, activated = make_register(tmp_path, None)
    assert activated == set()
    assert created == dict.fromkeys(SCHEDULED, False)
    assert all(f"{name}: defined without its schedule" in output for name in SCHEDULED)


@pytest.mark.slow
def test_the_weekly_comparison_compares_on_the_partition_of_its_kickoff_day(flyte_package):
    nodes = flyte_package.workflows["workflows.launch_plans.scheduled_comparison"].template.nodes
    (partition,) = [n.id for n in nodes if n.task_node.reference_id.name == "tasks.schedule.data_partition"]
    (comparison,) = [
        n for n in nodes if n.workflow_node.sub_workflow_ref.name.endswith("hardware_comparison")
    ]
    (data,) = [b.binding.promise for b in comparison.inputs if b.var == "data"]
    assert data.node_id == partition
