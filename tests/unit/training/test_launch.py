from pathlib import Path
from types import SimpleNamespace

import pytest
from flytekit.types.structured import StructuredDataset

from tasks.core.models.torch_startup import rendezvous_events_named_without_stack_walks
from tasks.core.training.config import TrainConfig
from tasks.core.training.launch import (
    LOCAL_CPU_WORKERS_VARIABLE,
    MissingPyTorchJob,
    local_cpu_workers,
    plan_launch,
)

# What the launcher reads of its inputs before any worker starts: the batch against the training rows,
# and that the local splits' files are there (this folder stands in for them).
SPLIT = StructuredDataset(uri=str(Path(__file__).parent))
TASK_INPUTS = {
    "prepared": SimpleNamespace(table=SimpleNamespace(rows={"train": 1_000}), train=SPLIT, val=SPLIT),
    "hyperparameters": TrainConfig(),
}


def launch(**overrides):
    args = dict(
        min_nodes=1, max_nodes=1, nproc_per_node=4, in_pytorch_job=False, gpu_count=4, local_cpu_workers=2
    )
    args.update(overrides)
    return plan_launch(**args)


def test_inside_a_pytorch_job_the_config_is_used_as_declared():
    plan = launch(min_nodes=2, max_nodes=3, in_pytorch_job=True, gpu_count=0)
    assert (plan.min_nodes, plan.max_nodes, plan.nproc_per_node, plan.notes) == (2, 3, 4, [])


def test_multi_node_outside_a_pytorch_job_is_clamped_with_a_note():
    plan = launch(min_nodes=2, max_nodes=4)
    assert (plan.min_nodes, plan.max_nodes, plan.nproc_per_node) == (1, 1, 4)
    assert "clamping to 1 node" in plan.notes[0]


def test_cpu_only_machine_uses_local_cpu_workers():
    plan = launch(gpu_count=0, local_cpu_workers=2)
    assert (plan.max_nodes, plan.nproc_per_node) == (1, 2)
    assert "no GPU found; training with 2 CPU worker processes" in plan.notes[0]
    assert "with 1 CPU worker process (gloo)" in launch(gpu_count=0, local_cpu_workers=1).notes[0]


def test_the_local_cpu_worker_count_comes_from_the_environment_when_set():
    assert local_cpu_workers(2, {}) == 2
    assert local_cpu_workers(2, {LOCAL_CPU_WORKERS_VARIABLE: ""}) == 2
    assert local_cpu_workers(2, {LOCAL_CPU_WORKERS_VARIABLE: "1"}) == 1
    assert local_cpu_workers(2, {LOCAL_CPU_WORKERS_VARIABLE: " 6 "}) == 6


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_a_local_cpu_worker_count_that_is_no_positive_number_is_refused_naming_it(value):
    with pytest.raises(ValueError, match=f"MIXEDML_LOCAL_CPU_WORKERS='{value}'"):
        local_cpu_workers(2, {LOCAL_CPU_WORKERS_VARIABLE: value})


def test_fewer_gpus_than_asked_uses_those_present():
    plan = launch(nproc_per_node=8, gpu_count=2)
    assert plan.nproc_per_node == 2 and "8 GPUs per node requested" in plan.notes[0]


def test_matching_gpus_need_no_note():
    assert launch().notes == []


def test_multi_node_on_a_cluster_outside_a_pytorch_job_fails_naming_the_plugin():
    with pytest.raises(MissingPyTorchJob, match="no 'pytorch' task plugin enabled") as error:
        launch(min_nodes=2, max_nodes=2, on_cluster=True)
    assert "PET_NNODES is unset" in str(error.value)


def test_multi_node_locally_is_still_clamped():
    plan = launch(min_nodes=2, max_nodes=2, on_cluster=False)
    assert plan.max_nodes == 1 and "clamping to 1 node" in plan.notes[0]


def test_single_node_on_a_cluster_is_unaffected():
    assert launch(on_cluster=True).notes == []


def test_the_multinode_task_fails_at_once_on_a_cluster_without_the_pytorch_plugin(monkeypatch):
    """A Flyte execution id in the environment (as propeller sets in every pod) and no PET_NNODES (no
    PyTorchJob): the task fails before it starts any worker."""
    from tasks.train_torch import MachineFittedElasticTask, train_torch_multinode

    monkeypatch.setattr(MachineFittedElasticTask, "require_declared_gpus", lambda self: None)  # a GPU node
    monkeypatch.setenv("FLYTE_INTERNAL_EXECUTION_ID", "a1b2c3")
    monkeypatch.delenv("PET_NNODES", raising=False)
    with pytest.raises(MissingPyTorchJob, match="'pytorch' plugin in propeller's enabled-plugins"):
        train_torch_multinode.execute(**TASK_INPUTS)


class LaunchCaptured(Exception):
    pass


def fake_elastic_launch(captured: list, raise_in_launch: Exception | None = None):
    """Stands in for torch's elastic_launch: records the LaunchConfig the plugin builds from the task."""

    def elastic_launch(config, entrypoint):
        captured.append(config)

        def launch(*args):
            raise raise_in_launch or LaunchCaptured()

        return launch

    return elastic_launch


def test_the_plugin_launches_with_the_fitted_config_and_the_task_keeps_its_declared_one(monkeypatch):
    """Pins the private contract the launcher fitting relies on: the kfpytorch plugin builds its
    LaunchConfig from `task_config.nproc_per_node`, `min_nodes` and `max_nodes` at launch time. A plugin
    upgrade that reads them elsewhere fails here, not on a cluster."""
    import torch.distributed.launcher.api as launcher

    from tasks.hardware import LAUNCHER_EXIT_MARGIN_S, TRAIN_GPU_MULTINODE
    from tasks.train_torch import train_torch_multinode

    captured = []
    monkeypatch.setattr(launcher, "elastic_launch", fake_elastic_launch(captured))
    monkeypatch.delenv("FLYTE_INTERNAL_EXECUTION_ID", raising=False)
    monkeypatch.delenv("PET_NNODES", raising=False)
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    monkeypatch.delenv(LOCAL_CPU_WORKERS_VARIABLE, raising=False)
    with pytest.raises(LaunchCaptured):
        train_torch_multinode.execute(**TASK_INPUTS)
    (config,) = captured
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (1, 1, 2)  # fitted: no GPU here
    assert config.shutdown_timeout == TRAIN_GPU_MULTINODE.attempts.preemption_grace_s + LAUNCHER_EXIT_MARGIN_S
    declared = train_torch_multinode
    assert (declared.min_nodes, declared.max_nodes, declared.task_config.nproc_per_node) == (2, 2, 8)


def test_the_environment_s_local_cpu_worker_count_reaches_the_launch_and_a_bad_one_launches_nothing(
    monkeypatch,
):
    import torch.distributed.launcher.api as launcher

    from tasks.train_torch import train_torch

    captured = []
    monkeypatch.setattr(launcher, "elastic_launch", fake_elastic_launch(captured))
    monkeypatch.delenv("FLYTE_INTERNAL_EXECUTION_ID", raising=False)
    monkeypatch.setenv(LOCAL_CPU_WORKERS_VARIABLE, "1")
    with pytest.raises(LaunchCaptured):
        train_torch.execute(**TASK_INPUTS)
    assert [config.nproc_per_node for config in captured] == [1]
    monkeypatch.setenv(LOCAL_CPU_WORKERS_VARIABLE, "none")
    with pytest.raises(ValueError, match="MIXEDML_LOCAL_CPU_WORKERS='none'"):
        train_torch.execute(**TASK_INPUTS)
    assert len(captured) == 1


def test_a_signalled_agent_makes_the_attempt_exit_with_the_signal(monkeypatch):
    """Pins the plugin's turning the agent's SignalException into IgnoreOutputs (raised while handling
    it), which the task turns back into a failed attempt: exit code 128 + the signal."""
    import signal

    import torch.distributed.launcher.api as launcher
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from tasks.train_torch import train_torch

    preempted = SignalException("got SIGTERM", sigval=signal.SIGTERM)
    monkeypatch.setattr(launcher, "elastic_launch", fake_elastic_launch([], raise_in_launch=preempted))
    with pytest.raises(SystemExit) as exit_:
        train_torch.execute(**TASK_INPUTS)
    assert exit_.value.code == 128 + signal.SIGTERM


def test_rendezvous_events_get_torch_s_names_without_a_stack_walk_during_a_launch(monkeypatch):
    """Pins what the stand-in for torch's `get_method_name` relies on: each rendezvous handler names
    its events through that module-level function, whose name for a caller is the stand-in's."""
    import inspect

    import torch.distributed.launcher.api as launcher
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rendezvous

    from tasks.train_torch import train_torch

    for handler in (rendezvous._BackendRendezvousStateHolder, rendezvous._DistributedRendezvousOpExecutor,
                    rendezvous.DynamicRendezvousHandler):  # fmt: skip
        assert "{get_method_name()}" in inspect.getsource(handler._record), handler

    def _record():  # as the handlers call it: the name wanted is _record's caller's
        return rendezvous.get_method_name()

    def next_rendezvous():
        return _record()

    by_stack_walk = next_rendezvous()
    with rendezvous_events_named_without_stack_walks():
        assert rendezvous.get_method_name.__name__ != "get_method_name"
        assert next_rendezvous() == by_stack_walk == "next_rendezvous"
        assert rendezvous.get_method_name(depth=10_000) == "no_method_name"
    assert rendezvous.get_method_name.__name__ == "get_method_name"  # put back

    names_in_launch = []

    def elastic_launch(config, entrypoint):
        def launch(*args):
            names_in_launch.append(rendezvous.get_method_name.__name__)
            raise LaunchCaptured()

        return launch

    monkeypatch.setattr(launcher, "elastic_launch", elastic_launch)
    with pytest.raises(LaunchCaptured):
        train_torch.execute(**TASK_INPUTS)
    assert names_in_launch == ["calling_method_name"]
