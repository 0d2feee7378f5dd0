"""What `helm upgrade` does with the Flyte values the repository gives: the chart version every helm
command pins, and flyte-binary's rendering of `configuration.inline`, which goes through `tpl`.

flyte-binary's chart at Flyte's tag v1.16.8, charts/flyte-binary/templates/configmap.yaml:
    100-inline-config.yaml: |
      {{- tpl ( .Values.configuration.inline | toYaml ) . | nindent 4 }}
Neither helm nor Go is needed: `render` follows Go text/template's lexer for the only actions the
values may hold, string constants.
"""

from __future__ import annotations

import re

import pytest
import yaml

from tests.dependencies import REPO

# The chart's version is Flyte's release tag (script/prepare_artifacts.sh at v1.16.8 writes it into
# Chart.yaml); the chart repository's newest flyte-binary is Flyte 2's.
CHART_VERSION = "v1.16.8"
VALUES = REPO / "deploy" / "flyte-binary-values.yaml"
HELM_DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(REPO.glob("deploy/**/*.*"))]
# flyteadmin's notification placeholders, written "{{ %s }}" or "{{%s}}" (`substitutionParam`,
# flyteadmin/pkg/async/notifications/email.go at v1.16.8).
FLYTEADMIN_PLACEHOLDERS = {
    f"{scope}{field}"
    for scope, fields in {
        "": ("project", "domain", "name", "phase", "error"),
        "workflow.": ("project", "domain", "name", "version"),
        "launch_plan.": ("project", "domain", "name", "version"),
    }.items()
    for field in fields
}
# An action holding one string constant: raw (`...`, any character but a backquote, newlines
# included) or interpreted without escapes; "{{- " and " -}}" trim the space beside the action.
CONSTANT_ACTION = re.compile(
    r'\{\{(?P<left>- )?\s*(?:`(?P<raw>[^`]*)`|"(?P<quoted>[^"\\\n]*)")\s*(?P<right> -)?\}\}'
)


def render(text: str) -> str:
    """`tpl` on `text`, whose actions must all be string constants: anything else, flyteadmin's
    `{{ phase }}` among them, is a function call to helm and fails the upgrade."""
    out, position = [], 0
    while (start := text.find("{{", position)) != -1:
        action = CONSTANT_ACTION.match(text, start)
        if action is None:
            raise ValueError(f"not a string constant, tpl would fail on: {text[start : start + 60]!r}")
        before = text[position:start]
        out += [before.rstrip() if action["left"] else before, action["raw"] or action["quoted"] or ""]
        position = action.end()
        if action["right"]:
            position += len(text[position:]) - len(text[position:].lstrip())
    return "".join(out) + text[position:]


def rendered_inline(values: dict) -> dict:
    """`configuration.inline` as the chart hands it to Flyte: toYaml, tpl, read back."""
    return yaml.safe_load(render(yaml.safe_dump(values["configuration"]["inline"])))


def notifications_example() -> dict:
    text = (REPO / "docs" / "cluster.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL) if "notifications:" in b]
    return yaml.safe_load(block)


def test_the_notifications_example_renders_flyteadmins_placeholders():
    emailer = rendered_inline(notifications_example())["notifications"]["emailer"]
    for key in ("subject", "body"):
        placeholders = re.findall(r"\{\{ ?([^{}]*?) ?\}\}", emailer[key])
        assert placeholders and set(placeholders) <= FLYTEADMIN_PLACEHOLDERS, emailer[key]
        assert "`" not in emailer[key] and "{{ phase }}" in emailer[key]


def test_a_bare_placeholder_fails_the_rendering():
    with pytest.raises(ValueError, match="not a string constant"):
        render("subject: '{{ launch_plan.name }} {{ phase }}'")
    assert render('a {{- `{{ phase }}` -}} b {{ "{{" }} name }}') == "a{{ phase }}b {{ name }}"


def test_the_values_file_renders_as_written():
    values = yaml.safe_load(VALUES.read_text())
    assert rendered_inline(values) == values["configuration"]["inline"]


def helm_commands(text: str) -> list[str]:
    """Every `helm install`/`helm upgrade` that starts a line (of a shell block, or a comment's),
    continuation lines (a trailing backslash) joined."""
    lines, commands = text.splitlines(), []
    for number, line in enumerate(lines):
        if re.match(r"[\s#$]*helm (upgrade|install)\b", line):
            command = [line]
            while command[-1].rstrip().endswith("\\") and number + len(command) < len(lines):
                command.append(lines[number + len(command)])
            commands.append(" ".join(command))
    return commands


def test_every_helm_command_pins_the_chart_of_flytes_tag():
    commands = {path.relative_to(REPO): helm_commands(path.read_text()) for path in HELM_DOCS}
    assert commands[REPO.joinpath("README.md").relative_to(REPO)], "the README installs the chart"
    unpinned = [
        f"{path}: {c}"
        for path, found in commands.items()
        for c in found
        if f"--version {CHART_VERSION}" not in c
    ]
    assert not unpinned, "\n".join(unpinned)


def test_upstream_citations_name_a_tag_not_a_branch():
    branches = [
        f"{path.relative_to(REPO)}: {line.strip()}"
        for path in HELM_DOCS
        for line in path.read_text().splitlines()
        if re.search(r"\b(branch (master|main)|flyteorg/flyte[^ ]*@(master|main))\b", line)
    ]
    assert not branches, "\n".join(branches)
