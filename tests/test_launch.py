from tasks.core.launch import plan_launch


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
