"""On a cluster the TensorFlow tasks never train on the host CPU: run from the package as cluster pods on
this CPU-only machine, both refuse at start, naming the device they declared, before reading any data.

The pods get prepared data whose train and val splits are gone, so a task that read its data before
checking its hardware would fail on the missing files instead of naming the device."""

from __future__ import annotations

import msgpack
import pytest
from flyteidl.core import literals_pb2
from flytekit.core.context_manager import FlyteContextManager
from flytekit.core.type_engine import TypeEngine
from flytekit.models.literals import Literal

from tasks.core.models.plugins import mlp_spec
from tasks.core.training.config import TrainConfig
from tasks.train_tf import train_tf_gpu, train_tf_tpu
from tasks.types import PreparedData
from tests.pods import literals, merged, refused_like_a_pod

pytestmark = pytest.mark.slow
HYPERPARAMETERS = TrainConfig(epochs=1, batch_size=16, model=mlp_spec([8]))
SPLIT_GONE = "is gone"  # what reading a missing split raises (tasks/plumbing/storage.py)


@pytest.fixture(scope="module")
def splits_gone(prepared_by_a_pod, tmp_path_factory) -> literals_pb2.Literal:
    """The preprocessing pod's output, its train and val splits pointing where there is nothing."""
    nowhere = tmp_path_factory.mktemp("splits-gone")
    fields = msgpack.loads(prepared_by_a_pod.scalar.binary.value)
    for split in ("train", "val"):
        fields[split]["uri"] = str(nowhere / split)
    literal = literals_pb2.Literal()
    literal.CopyFrom(prepared_by_a_pod)
    literal.scalar.binary.value = msgpack.dumps(fields)
    return literal


def test_a_task_that_read_these_inputs_would_fail_on_the_missing_splits(splits_gone):
    ctx = FlyteContextManager.current_context()
    prepared = TypeEngine.to_python_value(ctx, Literal.from_flyte_idl(splits_gone), PreparedData)
    with pytest.raises(FileNotFoundError, match=f"the train split at .* {SPLIT_GONE}"):
        prepared.local_splits()


def inputs(task, prepared: literals_pb2.Literal) -> literals_pb2.LiteralMap:
    return merged(literals(task, {"hyperparameters": HYPERPARAMETERS}), prepared=prepared)


def test_the_tpu_task_on_a_node_without_a_tpu_refuses_naming_the_slice(flyte_package, splits_gone, tmp_path):
    spec = flyte_package.tasks["tasks.train_tf.train_tf_tpu"]
    printed, message = refused_like_a_pod(spec, inputs(train_tf_tpu, splits_gone), tmp_path / "pod")
    assert (
        "AcceleratorUnavailable: this task declared a TPU v5e 2x2 slice (4 chips, tpu-v5-lite-podslice)"
        in message
    )
    assert "no TPU is reachable" in message and "PJRT_DEVICE" in message
    assert SPLIT_GONE not in printed + message


def test_the_tpu_task_on_a_tpu_vm_whose_tpu_does_not_connect_refuses_with_the_resolvers_error(
    flyte_package, splits_gone, tmp_path
):
    spec = flyte_package.tasks["tasks.train_tf.train_tf_tpu"]
    gke_tpu_node = {"TPU_WORKER_ID": "0", "TPU_ACCELERATOR_TYPE": "v5litepod-4"}
    printed, message = refused_like_a_pod(
        spec, inputs(train_tf_tpu, splits_gone), tmp_path / "pod", **gke_tpu_node
    )
    assert (
        "this task declared a TPU v5e 2x2 slice (4 chips, tpu-v5-lite-podslice) but could not connect"
        in message
    )
    assert "TPU_ACCELERATOR_TYPE=v5litepod-4" in message
    assert SPLIT_GONE not in printed + message


def test_the_tf_gpu_task_on_a_node_without_a_gpu_refuses_naming_the_gpu(flyte_package, splits_gone, tmp_path):
    spec = flyte_package.tasks["tasks.train_tf.train_tf_gpu"]
    printed, message = refused_like_a_pod(spec, inputs(train_tf_gpu, splits_gone), tmp_path / "pod")
    assert (
        "AcceleratorUnavailable: this task declared 1 x nvidia-l4 GPU but TensorFlow sees no GPU" in message
    )
    assert "no CUDA support" in message
    assert SPLIT_GONE not in printed + message
