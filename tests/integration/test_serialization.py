"""What the cluster receives: each task's serialized spec carries the hardware it declares."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from flytekit.configuration import ImageConfig, SerializationSettings
from flytekit.tools.translator import get_serializable
from google.protobuf.json_format import MessageToDict

from tasks.compare import compare
from tasks.evaluate import evaluate
from tasks.hardware import LAUNCHER_EXIT_MARGIN_S, TRAIN_GPU, TRAIN_GPU_MULTINODE, TRAIN_TF_GPU, TRAIN_TPU
from tasks.preprocess import preprocess
from tasks.train_tf import train_tf_gpu, train_tf_tpu
from tasks.train_torch import train_torch, train_torch_multinode

IMAGES = {
    name: f"registry.example.com/mixedml-{name}:v1"
    for name in ("cpu", "ml-cpu", "torch-gpu", "tf-gpu", "tpu")
}
SETTINGS = SerializationSettings(image_config=ImageConfig.from_images(IMAGES["cpu"], IMAGES))


def template(task):
    return get_serializable(OrderedDict(), SETTINGS, task).template.to_flyte_idl()


def resources(container) -> dict[str, dict[str, str]]:
    names = {1: "cpu", 2: "gpu", 3: "memory"}
    return {
        kind: {
            names.get(entry.name, str(entry.name)): entry.value
            for entry in getattr(container.resources, kind)
        }
        for kind in ("requests", "limits")
    }


def test_tpu_task_carries_accelerator_topology_and_gke_scheduling():
    spec = template(train_tf_tpu)
    accelerator = spec.extended_resources.gpu_accelerator
    assert (accelerator.device, accelerator.partition_size) == ("tpu-v5-lite-podslice", "2x2")
    assert spec.WhichOneof("target") == "k8s_pod"
    pod = MessageToDict(spec.k8s_pod.pod_spec)
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "2x2",
    }
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    (primary,) = pod["containers"]
    assert primary["name"] == "primary"
    for kind in ("requests", "limits"):
        assert primary["resources"][kind]["google.com/tpu"] == str(TRAIN_TPU.chips) == "4"
        assert primary["resources"][kind]["cpu"] == TRAIN_TPU.cpu
    assert "task-module" in primary["args"] and "tasks.train_tf" in primary["args"]


def primary_container(spec) -> dict:
    (primary,) = MessageToDict(spec.k8s_pod.pod_spec)["containers"]
    assert primary["name"] == spec.config["primary_container_name"] == "primary"
    return primary


@pytest.mark.parametrize("task", [train_torch, train_tf_gpu], ids=["torch", "tf"])
def test_gpu_tasks_carry_gpu_request_and_accelerator(task):
    spec = template(task)
    assert spec.extended_resources.gpu_accelerator.device == TRAIN_GPU.device == "nvidia-l4"
    assert spec.extended_resources.shared_memory.size_limit == TRAIN_GPU.shared_memory
    declared = primary_container(spec)["resources"]
    assert declared["requests"]["gpu"] == declared["limits"]["gpu"] == "1"
    assert declared["requests"]["cpu"] == TRAIN_GPU.cpu


def test_single_node_elastic_is_a_plain_pod_running_torch_elastic():
    spec = template(train_torch)
    assert spec.type == "python-task"
    assert "tasks.train_torch" in primary_container(spec)["args"]


TRAINING = {
    "torch": (train_torch, TRAIN_GPU),
    "torch-multinode": (train_torch_multinode, TRAIN_GPU_MULTINODE),
    "tf-gpu": (train_tf_gpu, TRAIN_TF_GPU),
    "tf-tpu": (train_tf_tpu, TRAIN_TPU),
}


@pytest.mark.parametrize("name", TRAINING)
def test_training_tasks_carry_timeout_retries_and_the_preemption_grace_period(name):
    task, profile = TRAINING[name]
    spec = template(task)
    assert spec.metadata.timeout.ToTimedelta() == profile.attempts.timeout
    assert spec.metadata.retries.retries == profile.attempts.retries
    assert spec.metadata.interruptible is profile.attempts.interruptible is (name != "torch-multinode")
    pod = MessageToDict(spec.k8s_pod.pod_spec)
    expected = profile.attempts.preemption_grace_s + LAUNCHER_EXIT_MARGIN_S
    assert pod["terminationGracePeriodSeconds"] == expected == profile.attempts.termination_grace_s


def test_training_timeout_becomes_the_nodes_deadline():
    """Propeller reads a node's timeout (its ExecutionDeadline) from the node metadata, which flytekit
    fills from the task's timeout."""
    node_metadata = train_torch.construct_node_metadata()
    assert node_metadata.timeout == TRAIN_GPU.attempts.timeout


@pytest.mark.slow
def test_multinode_pytorchjob_frees_its_nodes_when_done_and_restarts_no_worker(flyte_package):
    """What the package registers: once the job has Succeeded or Failed, the operator deletes its pods
    still running (a failed job's survivors included), and torch elastic restarts no worker group."""
    spec = flyte_package.tasks["tasks.train_torch.train_torch_multinode"].template
    assert spec.type == "pytorch"
    job = MessageToDict(spec.custom)
    policy = job["runPolicy"]
    assert policy["cleanPodPolicy"] == "CLEANPOD_POLICY_RUNNING"
    assert policy["activeDeadlineSeconds"] == TRAIN_GPU_MULTINODE.attempts.timeout.total_seconds()
    # 0 is the field's default, which protobuf leaves out.
    assert job["elasticConfig"].get("maxRestarts", 0) == 0


def test_a_pytorchjob_with_twice_the_nodes_to_lose_gets_one_retry_more():
    """What the cluster receives: one retry more than the single-node task's, and both leave at least
    one attempt on demand after the spot one."""
    multinode, single = template(train_torch_multinode), template(train_torch)
    assert multinode.metadata.retries.retries == single.metadata.retries.retries + 1
    assert single.metadata.retries.retries >= 1


@pytest.mark.parametrize("task", [preprocess, evaluate, compare], ids=lambda t: t.name)
def test_cpu_tasks_request_no_accelerator(task):
    spec = template(task)
    assert not spec.HasField("extended_resources") or not spec.extended_resources.HasField("gpu_accelerator")
    declared = resources(spec.container)
    assert "gpu" not in declared["requests"] and "gpu" not in declared["limits"]
    assert declared["requests"]["cpu"]


def test_preprocessing_declares_its_default_size():
    assert resources(template(preprocess).container)["requests"] == {"cpu": "2", "memory": "4Gi"}


def test_tpu_profile_rejects_multi_host_and_unknown_slices():
    from tasks.hardware import TpuSliceProfile

    with pytest.raises(ValueError, match="not a single-host slice; use one of 1x1, 2x2, 2x4"):
        TpuSliceProfile(generation="v5e", topology="4x4", cpu="8", mem="32Gi")
    with pytest.raises(ValueError, match="v5e, v5p, v6e"):
        TpuSliceProfile(generation="v4", topology="2x2x1", cpu="8", mem="32Gi")
    v5p = TpuSliceProfile(generation="v5p", topology="2x2x1", cpu="8", mem="32Gi")
    assert (v5p.gke_accelerator, v5p.chips) == ("tpu-v5p-slice", 4)
