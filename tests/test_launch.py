import pytest

from tasks.core.launch import MissingPyTorchJob, plan_launch


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
    assert "no GPU" in plan.notes[0]


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
    from tasks.train_torch import train_torch_multinode

    monkeypatch.setenv("FLYTE_INTERNAL_EXECUTION_ID", "a1b2c3")
    monkeypatch.delenv("PET_NNODES", raising=False)
    with pytest.raises(MissingPyTorchJob, match="'pytorch' plugin in propeller's enabled-plugins"):
        train_torch_multinode.execute(prepared=None)
