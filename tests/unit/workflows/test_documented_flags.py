"""A bool input of a workflow is a flag on pyflyte's command line (`--int8_export`, `--no_int8_export`):
`--int8_export true` is refused ("Got unexpected extra argument (true)"), so no page may write it so."""

from __future__ import annotations

import re

import pytest

from tests.dependencies import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
WITH_A_VALUE = re.compile(r"--([A-Za-z_][\w-]*)[ =](?:true|false|True|False)\b")


def bool_inputs() -> set[str]:
    """Every bool input of the workflows `pyflyte run` is shown with."""
    from workflows.comparison import hardware_comparison
    from workflows.launch_plans import scheduled_comparison, scheduled_scoring, scheduled_training
    from workflows.pipeline import training_pipeline
    from workflows.scoring import batch_predict

    flows = [training_pipeline, batch_predict, hardware_comparison, scheduled_training,
             scheduled_comparison, scheduled_scoring]  # fmt: skip
    return {name for flow in flows for name, hint in flow.python_interface.inputs.items() if hint is bool}


def test_the_bool_inputs_include_int8_export():
    assert {"int8_export", "plan_resources"} <= bool_inputs()


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_no_page_gives_a_bool_input_a_value(page):
    flags = bool_inputs()
    written = [match.group(0) for match in WITH_A_VALUE.finditer(page.read_text()) if match.group(1) in flags]
    assert written == [], f"{page.name}: write the flag alone (--name or --no_name), not {written}"
