"""Run serialized tasks the way a pod does: their container command in a fresh process.

Inputs are written as a protobuf LiteralMap to a local prefix, exactly what Flyte's propeller hands a
pod, and the command's template variables are filled in as propeller fills them, the checkpoint
prefixes included.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import torch
from flyteidl.core import literals_pb2
from flytekit.core.context_manager import FlyteContextManager
from flytekit.core.type_engine import TypeEngine
from flytekit.models.literals import LiteralMap

from tests.flyte_package import REPO, primary_container


def literals(task, values: dict) -> literals_pb2.LiteralMap:
    ctx = FlyteContextManager.current_context()
    hints = {name: task.python_interface.inputs[name] for name in values}
    return TypeEngine.dict_to_literal_map(ctx, values, hints).to_flyte_idl()


def merged(*maps: literals_pb2.LiteralMap, **named: literals_pb2.Literal) -> literals_pb2.LiteralMap:
    result = literals_pb2.LiteralMap()
    for literal_map in maps:
        for key, value in literal_map.literals.items():
            result.literals[key].CopyFrom(value)
    for key, value in named.items():
        result.literals[key].CopyFrom(value)
    return result


def pod_command(
    spec, inputs: literals_pb2.LiteralMap, workdir: Path, previous_checkpoint: str = ""
) -> list[str]:
    """The task's container command for an attempt whose prefixes live under `workdir`."""
    workdir.mkdir(parents=True)
    (workdir / "inputs.pb").write_bytes(inputs.SerializeToString())
    values = {
        "{{.input}}": str(workdir / "inputs.pb"),
        "{{.outputPrefix}}": str(workdir / "outputs"),
        "{{.rawOutputDataPrefix}}": str(workdir / "raw"),
        "{{.checkpointOutputPrefix}}": str(workdir / "checkpoint"),
        "{{.prevCheckpointPrefix}}": previous_checkpoint,
    }
    return [values.get(arg, arg) for arg in primary_container(spec)["args"]]


def pod_environment(**extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **extra}


def run_like_a_pod(
    spec, inputs: literals_pb2.LiteralMap, workdir: Path, previous_checkpoint: str = ""
) -> literals_pb2.LiteralMap:
    command = pod_command(spec, inputs, workdir, previous_checkpoint)
    result = subprocess.run(
        command, cwd=REPO, env=pod_environment(), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not (workdir / "outputs" / "error.pb").exists(), result.stdout[-3000:] + result.stderr[-3000:]
    outputs = workdir / "outputs" / "outputs.pb"
    assert outputs.exists(), f"{spec.template.id.name} wrote no outputs: {sorted(workdir.rglob('*'))}"
    return literals_pb2.LiteralMap.FromString(outputs.read_bytes())


def output(literal_map: literals_pb2.LiteralMap, python_type, name: str = "o0"):
    """The task output `name` as a Python value."""
    ctx = FlyteContextManager.current_context()
    one = LiteralMap.from_flyte_idl(literal_map).literals[name]
    return TypeEngine.to_python_value(ctx, one, python_type)


def model_parameters(trained) -> dict[str, torch.Tensor]:
    return torch.load(trained.artifact.path, weights_only=True)["state_dict"]


def workers_of(launcher: psutil.Process) -> list[psutil.Process]:
    """Every process under the launcher but multiprocessing's resource tracker, which lives as long as
    the launcher itself: the elastic workers and anything they started."""
    return [
        child for child in launcher.children(recursive=True) if "resource_tracker" not in child.cmdline()[-1]
    ]


def running(processes: list[psutil.Process]) -> list[int]:
    """PIDs still running: not exited, and not exited-but-unreaped (a zombie is gone)."""
    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process.pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def refused_like_a_pod(
    spec, inputs: literals_pb2.LiteralMap, workdir: Path, **environment: str
) -> tuple[str, str]:
    """Runs the task's command as a cluster pod would (propeller's execution id set) and expects it to
    fail: returns (what the command printed, the message of the error.pb it wrote)."""
    from flyteidl.core import errors_pb2

    command = pod_command(spec, inputs, workdir)
    cluster = {"FLYTE_INTERNAL_EXECUTION_ID": "f00ba4", **environment}
    result = subprocess.run(
        command, cwd=REPO, env=pod_environment(**cluster), capture_output=True, text=True, timeout=600
    )
    printed = result.stdout + result.stderr
    error = workdir / "outputs" / "error.pb"
    assert result.returncode != 0 or error.exists(), f"the pod did not fail:\n{printed[-3000:]}"
    assert not (workdir / "outputs" / "outputs.pb").exists(), "a refused pod wrote outputs"
    assert error.exists(), f"the pod wrote no error.pb:\n{printed[-3000:]}"
    return printed, errors_pb2.ErrorDocument.FromString(error.read_bytes()).error.message
