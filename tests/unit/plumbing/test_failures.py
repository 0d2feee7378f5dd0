"""Every row of the failure table (tasks/plumbing/failures.py) reaches Flyte as the table says: each exception is
raised inside the training tasks, which flytekit's own entrypoint runs as in a pod, and the kind of the
error document it writes (what propeller retries or not) is read back."""

from __future__ import annotations

import importlib
import json
from types import SimpleNamespace

import pytest
from flyteidl.core import errors_pb2, literals_pb2
from flytekit.bin.entrypoint import _dispatch_execute, setup_execution
from flytekit.exceptions.user import FlyteRecoverableException

from tasks.plumbing.failures import FAILURES, failure_of
from tests.flyte_package import REPO
from tests.unit.training.test_launch import TASK_INPUTS, fake_elastic_launch

# Arguments for the classes whose constructor takes more than a message.
ARGUMENTS = {
    "tasks.core.training.preemption.Preempted": (2, 40, 1.5),
    "tasks.core.accelerators.rule.AcceleratorUnavailable": ("1 x nvidia-l4 GPU", "no GPU is visible"),
    "tasks.core.training.torch_step.OutOfMemoryOnFastPath": (12, 64),
}


def raised(row) -> BaseException:
    """An exception of the row's class, imported by the name the table gives."""
    module, name = row.exception.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    return cls(*ARGUMENTS.get(row.exception, (f"a {name} for the test",)))


def kind_written(task, tmp_path) -> str:
    """Runs `task` through flytekit's entrypoint as a pod does and returns the kind of its error."""
    inputs = tmp_path / "inputs.pb"
    inputs.write_bytes(literals_pb2.LiteralMap().SerializeToString())
    outputs = tmp_path / "outputs"
    with setup_execution(str(tmp_path / "raw"), output_metadata_prefix=str(outputs)) as ctx:
        _dispatch_execute(ctx, lambda: task, str(inputs), str(outputs))
    document = errors_pb2.ErrorDocument.FromString((outputs / "error.pb").read_bytes())
    return errors_pb2.ContainerError.Kind.Name(document.error.kind)


def expected_kind(row) -> str:
    return "RECOVERABLE" if row.retried else "NON_RECOVERABLE"


@pytest.fixture
def in_a_pod(monkeypatch):
    """The task's inputs as the launcher reads them; no cluster variables, one CPU thread."""
    monkeypatch.delenv("FLYTE_INTERNAL_EXECUTION_ID", raising=False)
    monkeypatch.delenv("PET_NNODES", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.mark.parametrize("row", FAILURES, ids=lambda row: row.exception)
def test_the_torch_task_reports_each_failure_as_the_table_says(row, in_a_pod, monkeypatch, tmp_path):
    """Raised where torch elastic's launch runs, inside the kfpytorch plugin and the task's launcher."""
    import torch.distributed.launcher.api

    from tasks.train_torch import train_torch

    error = raised(row)
    monkeypatch.setattr(torch.distributed.launcher.api, "elastic_launch", fake_elastic_launch([], error))
    monkeypatch.setattr(train_torch, "_literal_map_to_python_input", lambda literals, ctx: TASK_INPUTS)
    assert failure_of(error) == row
    assert kind_written(train_torch, tmp_path) == expected_kind(row)


@pytest.mark.parametrize("row", FAILURES, ids=lambda row: row.exception)
def test_the_tensorflow_task_reports_each_failure_as_the_table_says(row, in_a_pod, monkeypatch, tmp_path):
    from tasks.train_tf import train_tf_gpu

    def train_tensorflow(*args):
        raise raised(row)

    monkeypatch.setattr("tasks.train_tf.train_tensorflow", train_tensorflow)
    monkeypatch.setattr(train_tf_gpu, "_literal_map_to_python_input", lambda literals, ctx: TASK_INPUTS)
    assert kind_written(train_tf_gpu, tmp_path) == expected_kind(row)


@pytest.mark.parametrize("row", FAILURES, ids=lambda row: row.exception)
def test_a_ddp_worker_raises_a_retried_failure_as_recoverable_for_the_plugin(row, monkeypatch, tmp_path):
    """The kfpytorch plugin marks a worker's failure recoverable only for a FlyteRecoverableException
    (flytekitplugins/kfpytorch/task.py, `spawn_helper`); other errors keep their type."""
    from tasks.core.training import torch_ddp, torch_training
    from tasks.ddp_worker import SetUpRefused, train_with_ddp
    from tasks.hardware import TRAIN_GPU

    error = raised(row)

    def train(*args, **kwargs):
        raise error

    monkeypatch.setattr(torch_training, "train", train)
    prepared = SimpleNamespace(splits_in_place=lambda: None)
    with setup_execution(str(tmp_path / "raw")):
        if isinstance(error, torch_ddp.SetUpFailed):  # agreed by every rank: the launcher raises it
            assert train_with_ddp(prepared, TASK_INPUTS["hyperparameters"], TRAIN_GPU) == SetUpRefused(
                str(error)
            )
            return
        with pytest.raises(Exception) as caught:
            train_with_ddp(prepared, TASK_INPUTS["hyperparameters"], TRAIN_GPU)
    assert isinstance(caught.value, FlyteRecoverableException) == row.retried
    assert (caught.value.__cause__ if row.retried else caught.value) is error


def child_failed(tmp_path, exitcode: int, message: str | None = None):
    """torch elastic's report of a worker group in which rank 1 failed as described."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    error_file = tmp_path / "error.json"
    if message is not None:
        error_file.write_text(json.dumps({"message": {"message": message, "extraInfo": {"timestamp": "1"}}}))
    failure = ProcessFailure(local_rank=1, pid=4242, exitcode=exitcode, error_file=str(error_file))
    return ChildFailedError("train_with_ddp", {1: failure})


@pytest.mark.parametrize(
    ("exitcode", "message", "kind", "says"),
    [
        (1, "TrainingDiverged: training diverged at epoch 1", "NON_RECOVERABLE",
         "training worker rank 1 failed: TrainingDiverged: training diverged at epoch 1"),
        (-9, None, "RECOVERABLE", "training worker rank 1 (pid 4242) was killed by SIGKILL"),
    ],
    ids=["raised", "killed"],
)  # fmt: skip
def test_a_failed_worker_group_is_reported_by_its_first_failure(
    exitcode, message, kind, says, in_a_pod, monkeypatch, tmp_path
):
    """What the plugin does with torch elastic's ChildFailedError, then the launcher: the rank and the
    worker's own error, and a retry only for a worker that died by a signal."""
    import torch.distributed.launcher.api

    from tasks.train_torch import train_torch

    error = child_failed(tmp_path, exitcode, message)
    monkeypatch.setattr(torch.distributed.launcher.api, "elastic_launch", fake_elastic_launch([], error))
    monkeypatch.setattr(train_torch, "_literal_map_to_python_input", lambda literals, ctx: TASK_INPUTS)
    assert kind_written(train_torch, tmp_path) == kind
    document = errors_pb2.ErrorDocument.FromString((tmp_path / "outputs" / "error.pb").read_bytes())
    assert says in document.error.message


def test_the_reliability_page_lists_the_table_as_the_code_has_it():
    page = (REPO / "docs" / "reliability.md").read_text()
    table = page.split("<!-- failures table: rows of FAILURES in tasks/plumbing/failures.py -->\n", 1)[1]
    rows = [line.split(" | ") for line in table.split("\n\n", 1)[0].splitlines()[2:]]
    listed = [(cells[0].strip("| `"), cells[1] == "yes", cells[2].rstrip(" |")) for cells in rows]
    assert listed == [(row.exception, row.retried, row.what) for row in FAILURES]
