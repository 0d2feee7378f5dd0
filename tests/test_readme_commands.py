"""Every local `pyflyte run` line in the README runs as written, with tiny sizes.

Tiny sizes: the hyperparameters JSON gets `epochs: 1` merged in, and a dataset the test cannot
reach (an object store, a file the reader would bring) is replaced by a small local table with the
label column the command names. Remote commands (`--remote`) need a cluster and are checked
against the project by test_cluster_config.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import blobs_frame
from tests.dependencies import REPO

pytestmark = pytest.mark.slow
PYFLYTE = ".venv/bin/pyflyte"


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [" ".join(line.split()) for line in lines if line.strip().startswith(f"{PYFLYTE} run")]


def tiny(command: str, scratch: Path) -> list[str]:
    words = shlex.split(command)
    words[0] = str(Path(sys.executable).with_name("pyflyte"))
    options = dict(zip(words, words[1:], strict=False))  # each word and the one after it
    if "--dataset" in options:
        index = words.index("--dataset") + 1
        table = scratch / f"{options.get('--label_column', 'label')}.csv"
        frame = blobs_frame(n_rows=150).rename(columns={"species": options.get("--label_column", "label")})
        frame.to_csv(table, index=False)
        words[index] = str(table)
    if "--hyperparameters" in options:
        index = words.index("--hyperparameters") + 1
        words[index] = json.dumps({**json.loads(words[index]), "epochs": 1})
    else:
        words += ["--hyperparameters", json.dumps({"epochs": 1})]
    return words


def test_the_readme_shows_the_local_commands():
    commands = readme_commands()
    assert any("workflows/comparison.py hardware_comparison" in c for c in commands)
    assert any("--dataset" in c for c in commands) and any("--hyperparameters" in c for c in commands)


@pytest.mark.parametrize("command", readme_commands())
def test_a_readme_command_runs_as_written(command, tmp_path):
    result = subprocess.run(
        tiny(command, tmp_path), cwd=REPO, capture_output=True, text=True, timeout=600, env=os.environ.copy()
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "used more than once" not in result.stderr  # the bool flags parse cleanly
    assert "accuracy" in result.stdout
