"""Run serialized tasks the way a pod does: their container command in a fresh process.

Inputs are written as a protobuf LiteralMap to a local prefix, exactly what Flyte's propeller
hands a pod; each task's outputs.pb feeds the next, so the chain preprocess -> train -> evaluate
crosses real serialization boundaries.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from flyteidl.core import literals_pb2
from flytekit.core.context_manager import FlyteContextManager
from flytekit.core.type_engine import TypeEngine
from flytekit.models.literals import LiteralMap

from tasks.preprocess import preprocess
from tasks.train_torch import train_torch
from tasks.types import EvaluationReport, TrainedModel
from tests.flyte_package import REPO

pytestmark = pytest.mark.slow


@pytest.fixture
def task_specs(flyte_package):
    return flyte_package.tasks


def container_args(spec) -> list[str]:
    template = spec.template
    if template.WhichOneof("target") == "k8s_pod":
        (container,) = template.k8s_pod.pod_spec["containers"]
        return list(container["args"])
    return list(template.container.args)


def literals(task, values: dict) -> literals_pb2.LiteralMap:
    ctx = FlyteContextManager.current_context()
    hints = {name: task.python_interface.inputs[name] for name in values}
    return TypeEngine.dict_to_literal_map(ctx, values, hints).to_flyte_idl()


def run_like_a_pod(
    spec, inputs: literals_pb2.LiteralMap, workdir: Path, previous_checkpoint: str = ""
) -> literals_pb2.LiteralMap:
    workdir.mkdir(parents=True)
    (workdir / "inputs.pb").write_bytes(inputs.SerializeToString())
    values = {
        "{{.input}}": str(workdir / "inputs.pb"),
        "{{.outputPrefix}}": str(workdir / "outputs"),
        "{{.rawOutputDataPrefix}}": str(workdir / "raw"),
        "{{.checkpointOutputPrefix}}": str(workdir / "checkpoint"),
        "{{.prevCheckpointPrefix}}": previous_checkpoint,
    }
    command = [values.get(arg, arg) for arg in container_args(spec)]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    outputs = workdir / "outputs" / "outputs.pb"
    assert outputs.exists(), f"{spec.template.id.name} wrote no outputs: {sorted(workdir.rglob('*'))}"
    return literals_pb2.LiteralMap.FromString(outputs.read_bytes())


def merged(*maps: literals_pb2.LiteralMap, **named: literals_pb2.Literal) -> literals_pb2.LiteralMap:
    result = literals_pb2.LiteralMap()
    for literal_map in maps:
        for key, value in literal_map.literals.items():
            result.literals[key].CopyFrom(value)
    for key, value in named.items():
        result.literals[key].CopyFrom(value)
    return result


def test_preprocess_train_evaluate_as_pods(task_specs, tmp_path):
    prepared = run_like_a_pod(
        task_specs["tasks.preprocess.preprocess"],
        literals(preprocess, {"dataset": "", "label_column": "label", "val_fraction": 0.15,
                              "test_fraction": 0.15, "seed": 0}),
        tmp_path / "preprocess",
    )  # fmt: skip
    hyper = {"epochs": 8, "batch_size": 64, "learning_rate": 3e-3, "weight_decay": 1e-2, "grad_accum_steps": 1,
             "hidden_sizes": [128], "dropout": 0.1, "seed": 0, "precision": "auto"}  # fmt: skip
    trained = run_like_a_pod(
        task_specs["tasks.train_torch.train_torch"],
        merged(literals(train_torch, hyper), prepared=prepared.literals["o0"]),
        tmp_path / "train",
    )
    report_literals = run_like_a_pod(
        task_specs["tasks.evaluate.evaluate"],
        merged(prepared=prepared.literals["o0"], trained=trained.literals["o0"]),
        tmp_path / "evaluate",
    )
    ctx = FlyteContextManager.current_context()
    report = TypeEngine.literal_map_to_kwargs(
        ctx, LiteralMap.from_flyte_idl(report_literals), {"o0": EvaluationReport}
    )["o0"]
    assert report.accuracy >= 0.9 and report.n_test == 270
    assert (report.framework, report.world_size) == ("pytorch", 2)
    model_files = list((tmp_path / "train" / "raw").rglob("model.pt"))
    assert model_files, "the model artifact was not uploaded to the raw output prefix"
    assert (tmp_path / "train" / "checkpoint" / "training_state.pt").exists(), "no checkpoint was uploaded"

    # A retry (e.g. after preemption) gets the previous attempt's checkpoint and continues from it:
    # here every epoch was done, so it trains nothing more and returns the same model.
    retried = run_like_a_pod(
        task_specs["tasks.train_torch.train_torch"],
        merged(literals(train_torch, hyper), prepared=prepared.literals["o0"]),
        tmp_path / "retry",
        previous_checkpoint=str(tmp_path / "train" / "checkpoint"),
    )
    first, second = (
        TypeEngine.literal_map_to_kwargs(ctx, LiteralMap.from_flyte_idl(m), {"o0": TrainedModel})["o0"]
        for m in (trained, retried)
    )
    assert second.history == first.history
    assert second.samples_per_second == 0.0 < first.samples_per_second  # nothing left to train
    first_state = torch.load(first.artifact.path, weights_only=True)["state_dict"]
    second_state = torch.load(second.artifact.path, weights_only=True)["state_dict"]
    assert all(torch.equal(first_state[name], second_state[name]) for name in first_state)
