"""What the cluster receives: `make package` output parsed back and checked.

What each task's own spec declares (resources, accelerators, retries, timeouts, grace periods) is
test_serialization's; this checks what only the package shows: every entity, each task's image as
the build names it, the workflows' wiring and the launch plans."""

from __future__ import annotations

import pytest
from google.protobuf.json_format import MessageToDict

from tasks.hardware import (
    CPU_RETRIES,
    LAUNCHER_RETRIES,
    PIECE_RETRIES,
    TRAIN_GPU,
    TRAIN_GPU_MULTINODE,
    TRAIN_TF_GPU,
    TRAIN_TPU,
)
from tests.flyte_package import REGISTRY, TAG, environment_of, image_of, requests_of

pytestmark = pytest.mark.slow

IMAGE_OF_TASK = {
    "tasks.preprocess.preprocess": "cpu",
    "tasks.preprocess.assign_piece_splits": "cpu",
    "tasks.preprocess.piece_encoding_stats": "cpu",
    "tasks.preprocess.fit_piece_encoding": "cpu",
    "tasks.preprocess.fit_piece_scaler": "cpu",
    "tasks.preprocess.write_piece_splits": "cpu",
    "tasks.preprocess.collect_piece_splits": "cpu",
    "tasks.compare.check_prices": "cpu",
    "tasks.compare.compare": "cpu",
    "tasks.schedule.dataset_partition": "cpu",
    "tasks.schedule.data_partition": "cpu",
    "tasks.tune.check_tuning": "ml-cpu",
    "tasks.tune.start_study": "ml-cpu",
    "tasks.tune.tuning_round": "ml-cpu",
    "tasks.tune.record_round": "ml-cpu",
    "tasks.tune.best_trial": "ml-cpu",
    "tasks.evaluate.evaluate": "ml-cpu",
    "tasks.score.score": "ml-cpu",
    "tasks.score.scoring_fan_out": "ml-cpu",
    "tasks.score.score_piece_cpu": "ml-cpu",
    "tasks.score.collect_scores": "ml-cpu",
    "tasks.score.score_piece_torch_gpu": "torch-gpu",
    "tasks.score.score_piece_tf_gpu": "tf-gpu",
    "tasks.publish.publish_model": "ml-cpu",
    "tasks.train_torch.train_torch": "torch-gpu",
    "tasks.train_torch.train_torch_multinode": "torch-gpu",
    "tasks.train_tf.train_tf_gpu": "tf-gpu",
    "tasks.train_tf.train_tf_tpu": "tpu",
    "tasks.train_torch.train_torch_trial": "torch-gpu",
    "tasks.train_torch.train_torch_multinode_trial": "torch-gpu",
    "tasks.train_tf.train_tf_gpu_trial": "tf-gpu",
    "tasks.train_tf.train_tf_tpu_trial": "tpu",
    "tasks.right_sizing.prepare_data": "ml-cpu",
    "tasks.right_sizing.train_on_target": "ml-cpu",
}

# Each task's retries, from the one table of docs/reliability.md ("The choices per task").
RETRIES_OF_TASK = {
    "tasks.preprocess.preprocess": CPU_RETRIES,
    "tasks.preprocess.assign_piece_splits": CPU_RETRIES,
    "tasks.preprocess.piece_encoding_stats": PIECE_RETRIES,
    "tasks.preprocess.fit_piece_encoding": CPU_RETRIES,
    "tasks.preprocess.fit_piece_scaler": CPU_RETRIES,
    "tasks.preprocess.write_piece_splits": PIECE_RETRIES,
    "tasks.preprocess.collect_piece_splits": CPU_RETRIES,
    "tasks.compare.check_prices": CPU_RETRIES,
    "tasks.compare.compare": CPU_RETRIES,
    "tasks.schedule.dataset_partition": CPU_RETRIES,
    "tasks.schedule.data_partition": CPU_RETRIES,
    "tasks.tune.check_tuning": CPU_RETRIES,
    "tasks.tune.start_study": CPU_RETRIES,
    "tasks.tune.tuning_round": LAUNCHER_RETRIES,
    "tasks.tune.record_round": CPU_RETRIES,
    "tasks.tune.best_trial": CPU_RETRIES,
    "tasks.evaluate.evaluate": CPU_RETRIES,
    "tasks.score.score": LAUNCHER_RETRIES,
    "tasks.score.scoring_fan_out": CPU_RETRIES,
    "tasks.score.score_piece_cpu": PIECE_RETRIES,
    "tasks.score.collect_scores": CPU_RETRIES,
    "tasks.score.score_piece_torch_gpu": PIECE_RETRIES,
    "tasks.score.score_piece_tf_gpu": PIECE_RETRIES,
    "tasks.publish.publish_model": CPU_RETRIES,
    "tasks.train_torch.train_torch": TRAIN_GPU.attempts.retries,
    "tasks.train_torch.train_torch_multinode": TRAIN_GPU_MULTINODE.attempts.retries,
    "tasks.train_tf.train_tf_gpu": TRAIN_TF_GPU.attempts.retries,
    "tasks.train_tf.train_tf_tpu": TRAIN_TPU.attempts.retries,
    "tasks.train_torch.train_torch_trial": TRAIN_GPU.attempts.retries,
    "tasks.train_torch.train_torch_multinode_trial": TRAIN_GPU_MULTINODE.attempts.retries,
    "tasks.train_tf.train_tf_gpu_trial": TRAIN_TF_GPU.attempts.retries,
    "tasks.train_tf.train_tf_tpu_trial": TRAIN_TPU.attempts.retries,
    "tasks.right_sizing.prepare_data": LAUNCHER_RETRIES,
    "tasks.right_sizing.train_on_target": LAUNCHER_RETRIES,
}


@pytest.fixture
def package(flyte_package):
    return flyte_package


def test_package_holds_every_task_workflow_and_launch_plan(package):
    assert set(package.tasks) == set(IMAGE_OF_TASK)
    assert (
        {name: spec.template.type for name, spec in package.podless.items()}
        == {
            "tasks.tune.share_prepared": "echo"  # no pod: propeller copies its input (tests/integration/test_dynamic_size.py)
        }
    )
    assert {"workflows.pipeline.training_pipeline", "workflows.comparison.hardware_comparison",
            "workflows.launch_plans.scheduled_training", "workflows.launch_plans.scheduled_comparison",
            "workflows.launch_plans.scheduled_scoring"} <= set(package.workflows)  # fmt: skip
    assert {"nightly_retrain", "nightly_scoring", "weekly_hardware_comparison"} <= set(package.launch_plans)


def test_every_task_has_the_retries_of_the_table(package):
    """Serialized `retries: 0` is also what an unset one reads as, and propeller then gives the node
    default-max-attempts attempts: the table names every task, so none is left to that default."""
    assert set(RETRIES_OF_TASK) == set(package.tasks)
    retries = {name: spec.template.metadata.retries.retries for name, spec in package.tasks.items()}
    assert retries == RETRIES_OF_TASK
    # Only the @dynamics that launch a sub-workflow go without: they would multiply their children's.
    assert LAUNCHER_RETRIES == 0 < min(CPU_RETRIES, PIECE_RETRIES)


@pytest.mark.parametrize("task, image", sorted(IMAGE_OF_TASK.items()))
def test_each_task_runs_in_the_image_for_its_hardware(package, task, image):
    assert image_of(package.tasks[task]) == f"{REGISTRY}/mixedml-{image}:{TAG}"


def test_multi_node_training_is_a_pytorch_job_with_worker_replicas(package):
    spec = package.tasks["tasks.train_torch.train_torch_multinode"].template
    assert spec.type == "pytorch"
    custom = MessageToDict(spec.custom)
    assert custom["workerReplicas"]["replicas"] == TRAIN_GPU_MULTINODE.nnodes == 2
    elastic = custom["elasticConfig"]
    assert (elastic["rdzvBackend"], elastic["minReplicas"], elastic["maxReplicas"], elastic["nprocPerNode"]) == (
        "c10d", 2, 2, TRAIN_GPU_MULTINODE.gpus_per_node,
    )  # fmt: skip
    assert requests_of(package.tasks["tasks.train_torch.train_torch_multinode"])["gpu"] == "8"
    assert spec.extended_resources.gpu_accelerator.device == "nvidia-h100-80gb"
    assert environment_of(package.tasks["tasks.train_torch.train_torch_multinode"])["NCCL_DEBUG"] == "WARN"


def test_rendezvous_waits_for_node_scale_up():
    from tasks.train_torch import train_torch_multinode

    assert train_torch_multinode.task_config.rdzv_configs["join_timeout"] >= 1800
    assert train_torch_multinode.task_config.rdzv_configs["read_timeout"] >= 1800


def test_launch_plans_carry_schedules(package):
    """The package is built with every scheduled launch plan complete (tests/schedules.yaml); the
    inputs and notifications it gives them are test_schedules'."""
    nightly = package.launch_plans["nightly_retrain"]
    schedule = nightly.spec.entity_metadata.schedule
    assert schedule.cron_schedule.schedule == "0 2 * * *"
    assert schedule.kickoff_time_input_arg == "kickoff_time"
    assert nightly.spec.workflow_id.name == "workflows.launch_plans.scheduled_training"
    assert "kickoff_time" in nightly.spec.default_inputs.parameters  # filled in by the schedule

    weekly = package.launch_plans["weekly_hardware_comparison"]
    assert weekly.spec.entity_metadata.schedule.cron_schedule.schedule == "0 4 * * 1"
    assert weekly.spec.entity_metadata.schedule.kickoff_time_input_arg == "kickoff_time"
    assert weekly.spec.workflow_id.name == "workflows.launch_plans.scheduled_comparison"


def node_tasks(node) -> list[str]:
    if node.HasField("task_node"):
        return [node.task_node.reference_id.name]
    if node.HasField("branch_node"):
        branch = node.branch_node.if_else
        cases = [branch.case, *branch.other]
        return [c.then_node.task_node.reference_id.name for c in cases]
    return []


def depends_on(node) -> set[str]:
    """Nodes whose outputs this node (or, for a branch, any of its cases) consumes."""
    found = set(node.upstream_node_ids)
    found |= {b.binding.promise.node_id for b in node.inputs if b.binding.HasField("promise")}
    if node.HasField("branch_node"):
        branch = node.branch_node.if_else
        for case in [branch.case, *branch.other]:
            found |= depends_on(case.then_node)
    return found - {"", "start-node"}  # workflow inputs


def test_training_pipeline_wires_plan_preprocess_train_evaluate_publish(package):
    nodes = package.workflows["workflows.pipeline.training_pipeline"].template.nodes
    by_task = {node_tasks(node)[0]: node for node in nodes}
    prepare = by_task["tasks.right_sizing.prepare_data"]
    train = by_task["tasks.right_sizing.train_on_target"]
    evaluate = by_task["tasks.evaluate.evaluate"]
    publish = by_task["tasks.publish.publish_model"]
    assert len(nodes) == 4
    assert depends_on(prepare) == set()
    assert depends_on(train) == {prepare.id}
    assert depends_on(evaluate) == {prepare.id, train.id}
    # The bundle evaluate wrote, and the test split the promotion gate scores.
    assert depends_on(publish) == {prepare.id, evaluate.id}


def test_planning_tasks_ask_for_no_accelerator(package):
    for name in ("tasks.right_sizing.prepare_data", "tasks.right_sizing.train_on_target"):
        template = package.tasks[name].template
        assert not template.extended_resources.HasField("gpu_accelerator")
        assert "gpu" not in requests_of(package.tasks[name])


def test_comparison_trains_both_from_one_preparation_in_parallel(package):
    nodes = package.workflows["workflows.comparison.hardware_comparison"].template.nodes
    tasks_of = {node.id: node_tasks(node) for node in nodes}
    upstream = {node.id: depends_on(node) for node in nodes}
    (prep,) = [i for i, t in tasks_of.items() if t == ["tasks.right_sizing.prepare_data"]]  # the front door
    trains = [
        i for i, t in tasks_of.items() if t == ["tasks.right_sizing.train_on_target"]
    ]  # planned, as the pipeline
    assert len(trains) == 2
    for node in trains:
        assert upstream[node] == {prep}  # neither waits for the other


def test_preprocessing_is_cached_under_its_code_version(package):
    from tasks.preprocess import PREPROCESS_CODE_VERSION

    metadata = package.tasks["tasks.preprocess.preprocess"].template.metadata
    assert metadata.discoverable and metadata.discovery_version == PREPROCESS_CODE_VERSION
