"""Every local `pyflyte run` line in the README runs as written, with tiny sizes.

Tiny sizes: the hyperparameters JSON gets `epochs: 1` merged in, and a dataset the test cannot
reach (an object store, a file the reader would bring) is replaced by a small local table in the
same format (parquet or CSV) with the label column the command names. The folders a command writes
and a later one reads (`--publish_to`, `--model`, `--output`) are relative to one scratch folder. Remote commands (`--remote`)
need a cluster and are checked against the project by test_cluster_config.

The commands share one process (tests/workers/readme_driver.py): each goes through pyflyte's own command
line parsing and runs, and its exit status, stdout and stderr are kept apart, so one test per
command reads its own result, while the process start-up and the flytekit/torch imports are paid
once.

Each PyTorch training starts one CPU worker (MIXEDML_LOCAL_CPU_WORKERS=1): what a command adds is its
inputs, and the two-rank runs are tests/integration/test_ddp.py's and tests/integration/test_pipeline.py's.
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

from tasks.core.training.launch import LOCAL_CPU_WORKERS_VARIABLE
from tests.conftest import blobs_frame
from tests.dependencies import REPO

pytestmark = pytest.mark.slow
PYFLYTE = ".venv/bin/pyflyte"
DRIVER = Path(__file__).parents[1] / "workers" / "readme_driver.py"


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [" ".join(line.split()) for line in lines if line.strip().startswith(f"{PYFLYTE} run")]


COMMANDS = readme_commands()


def tiny(command: str, scratch: Path) -> list[str]:
    words = shlex.split(command)
    words[0] = str(Path(sys.executable).with_name("pyflyte"))
    options = dict(zip(words, words[1:], strict=False))  # each word and the one after it
    if "--dataset" in options:  # batch_predict's
        index = words.index("--dataset") + 1
        words[index] = local_table(words[index], options.get("--label_column", "label"), scratch)
    if "--data" in options:  # the training workflows': JSON whose dataset is replaced
        index = words.index("--data") + 1
        data = json.loads(words[index])
        if data.get("dataset"):
            data["dataset"] = local_table(data["dataset"], data.get("label_column", "label"), scratch)
        words[index] = json.dumps(data)
    for name in ("--publish_to", "--model", "--output"):  # one folder the commands share, in order
        if name in options:
            index = words.index(name) + 1
            words[index] = str(scratch.parent / "shared" / words[index])
    if "batch_predict" in words:  # scoring trains nothing
        return words
    if "--hyperparameters" in options:
        index = words.index("--hyperparameters") + 1
        words[index] = json.dumps({**json.loads(words[index]), "epochs": 1})
    else:
        words += ["--hyperparameters", json.dumps({"epochs": 1})]
    return words


def local_table(dataset: str, label_column: str, scratch: Path) -> str:
    """A small local table in the format `dataset` names, with its label column."""
    frame = blobs_frame(n_rows=150).rename(columns={"species": label_column})
    table = scratch / f"{label_column}{Path(dataset).suffix}"
    if table.suffix in (".parquet", ".pq"):
        frame.to_parquet(table)
    else:
        frame.to_csv(table, index=False)
    return str(table)


def text(output: str | bytes | None) -> str:
    """What a process wrote before it timed out (bytes, even when the run asked for text)."""
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def run_the_commands(commands: list[str], root: Path) -> dict:
    """README commands, tiny, in one driver process: command -> its result, plus the driver's own
    exit and output for when a command has no result (the driver died before or during it)."""
    argvs = []
    for number, command in enumerate(commands):
        scratch = root / f"command-{number}"
        scratch.mkdir()
        argvs.append(tiny(command, scratch))
    argvs_file, results_file = root / "commands.json", root / "results.json"
    argvs_file.write_text(json.dumps(argvs))
    driver_command = [sys.executable, str(DRIVER), str(argvs_file), str(results_file), str(root / "cache")]
    try:
        driver = subprocess.run(
            driver_command,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600 * max(1, len(commands)),  # 600 s a command, as when each had its own process
            env={**os.environ, LOCAL_CPU_WORKERS_VARIABLE: "1"},
        )
        exit_status, out, err = driver.returncode, driver.stdout, driver.stderr
    except subprocess.TimeoutExpired as late:  # the commands that finished still have their results
        exit_status, out, err = "none (timed out)", text(late.stdout), text(late.stderr)
    results = json.loads(results_file.read_text()) if results_file.exists() else []
    return {
        "results": dict(zip(commands, results, strict=False)),
        "driver": {"exit": exit_status, "output": out + err[-3000:]},
    }


def selected_commands(items: list[pytest.Item]) -> list[str]:
    """The README commands whose tests the session runs: all of them, unless -k or node ids pick."""
    picked = {
        item.callspec.params.get("command")
        for item in items
        if getattr(item, "originalname", None) == "test_a_readme_command_runs_as_written"
    }
    return [command for command in COMMANDS if command in picked]


@pytest.fixture(scope="module")
def readme_run(request, tmp_path_factory) -> dict:
    """The one driver run of the session's README commands (their tests share a worker: one group)."""
    return run_the_commands(selected_commands(request.session.items), tmp_path_factory.mktemp("readme"))


def test_the_readme_shows_the_local_commands():
    assert any("workflows/comparison.py hardware_comparison" in c for c in COMMANDS)
    assert any('--data \'{"dataset": ' in c for c in COMMANDS) and any(
        "--hyperparameters" in c for c in COMMANDS
    )


@pytest.mark.xdist_group("readme")
@pytest.mark.parametrize("command", COMMANDS)
def test_a_readme_command_runs_as_written(command, readme_run):
    result = readme_run["results"].get(command)
    if result is None:
        driver = readme_run["driver"]
        pytest.fail(f"no result, the driver exited {driver['exit']}:\n{driver['output']}")
    assert result["returncode"] == 0, result["stderr"][-3000:]
    assert "used more than once" not in result["stderr"]  # the bool flags parse cleanly
    assert "accuracy" in result["stdout"]
    everything = result["stdout"] + result["stderr"]
    for marker in ("macro-F1", "resource plan ("):  # a report's or a plan's line, printed once
        lines = [line[line.index(marker) :] for line in everything.splitlines() if marker in line]
        assert len(lines) == len(set(lines)), f"printed twice: {lines}"
    for noise in ("torchvision", "FutureWarning", "cpu_feature_guard", "Starting new session"):
        assert noise not in everything, noise
