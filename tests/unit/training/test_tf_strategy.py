"""The strategy rules, one test per rule, the TPU branch up to the resolver, and the checks a task on a
cluster makes before it reads any data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.core.accelerators.rule import AcceleratorUnavailable
from tasks.core.messages import InputError
from tasks.core.training import tf_strategy
from tasks.core.training.tf_strategy import (
    PJRT_VARIABLES,
    Environment,
    StrategyUnavailable,
    choose_kind,
    connect_tpu,
    detect_environment,
    gpus_found,
    libtpu_library,
    require_gpus,
    require_tpu,
    select_strategy,
    set_pjrt_defaults,
    tpu_target_strategy,
)

TWO_WORKERS = json.dumps(
    {"cluster": {"worker": ["w0:2222", "w1:2222"]}, "task": {"type": "worker", "index": 0}}
)
ONE_WORKER = json.dumps({"cluster": {"worker": ["w0:2222"]}, "task": {"type": "worker", "index": 0}})


@pytest.mark.parametrize(
    "env, expected",
    [
        (Environment(tpu_name="my-tpu", tf_config=TWO_WORKERS, gpu_count=8), "tpu"),
        (Environment(on_tpu_vm=True), "tpu"),
        (Environment(tf_config=TWO_WORKERS, gpu_count=8), "multi_worker"),
        (Environment(tf_config=ONE_WORKER, gpu_count=2), "mirrored"),
        (Environment(gpu_count=1), "mirrored"),
        (Environment(cpu_devices=2), "mirrored"),
        (Environment(), "default"),
    ],
)
def test_auto_follows_the_rules_in_order(env, expected):
    assert choose_kind("auto", env).kind == expected


@pytest.mark.parametrize("requested", ["tpu", "multi_worker", "mirrored"])
def test_a_demanded_strategy_that_is_missing_fails_fast(requested):
    with pytest.raises(StrategyUnavailable, match=f"strategy '{requested}' was requested but"):
        choose_kind(requested, Environment())


def test_fallback_when_allowed_says_what_it_did():
    choice = choose_kind("tpu", Environment(gpu_count=2), allow_fallback=True)
    assert choice.kind == "mirrored"
    assert "falling back to 'mirrored'" in choice.notes[0]


def test_unknown_strategy_lists_the_valid_ones():
    with pytest.raises(ValueError, match="auto, tpu, multi_worker, mirrored, default"):
        choose_kind("gpu", Environment())


def test_detect_environment_reads_gke_and_kubeflow_variables():
    env = detect_environment({"TPU_WORKER_ID": "0", "TF_CONFIG": TWO_WORKERS}, gpu_count=0, cpu_devices=1)
    assert env.on_tpu_vm and env.multi_worker and env.tpu_name is None
    env = detect_environment({"TPU_NAME": "pod-1"}, gpu_count=3, cpu_devices=1)
    assert (env.tpu_name, env.gpu_count) == ("pod-1", 3)


class RecordingResolver:
    """Stands in for TPUClusterResolver: records the call, then fails as an unreachable TPU does."""

    calls: list[dict] = []

    def __init__(self, **kwargs):
        RecordingResolver.calls.append(kwargs)
        raise ValueError("Could not lookup TPU metadata")


def test_tpu_branch_calls_the_resolver_with_tpu_name_and_explains_the_failure():
    RecordingResolver.calls.clear()
    with pytest.raises(
        StrategyUnavailable, match="could not connect to TPU 'my-tpu'.*Could not lookup TPU metadata"
    ):
        select_strategy("tpu", env=Environment(tpu_name="my-tpu"), resolver_factory=RecordingResolver)
    assert RecordingResolver.calls == [{"tpu": "my-tpu"}]


@pytest.mark.slow
def test_tpu_vm_without_a_tpu_fails_clearly_with_the_real_resolver():
    with pytest.raises(StrategyUnavailable, match="could not connect to TPU 'local'"):
        select_strategy("tpu", env=Environment(on_tpu_vm=True))


def test_auto_falls_back_when_the_tpu_hint_was_wrong():
    strategy, kind = select_strategy(
        "auto", env=Environment(on_tpu_vm=True), resolver_factory=RecordingResolver
    )
    assert kind == "default" and strategy.num_replicas_in_sync == 1


@pytest.mark.parametrize("requested", ["auto", "tpu"])
def test_the_tpu_target_demands_the_tpu_on_a_cluster_and_keeps_the_local_choice(requested):
    assert tpu_target_strategy(requested, on_cluster=True) == "tpu"
    assert tpu_target_strategy(requested, on_cluster=False) == requested


@pytest.mark.parametrize("requested", ["mirrored", "multi_worker", "default"])
@pytest.mark.parametrize("on_cluster", [True, False])
def test_the_tpu_target_refuses_strategies_that_leave_the_slice_idle(requested, on_cluster):
    with pytest.raises(InputError, match=f"'hyperparameters.tf_strategy' = '{requested}'.*'auto' or 'tpu'"):
        tpu_target_strategy(requested, on_cluster)


def test_on_a_cluster_a_tpu_that_does_not_connect_is_no_fallback_to_the_cpu():
    """What `test_auto_falls_back_when_the_tpu_hint_was_wrong` does locally fails on a cluster."""
    with pytest.raises(StrategyUnavailable, match="could not connect to TPU 'local'"):
        select_strategy(
            tpu_target_strategy("auto", on_cluster=True),
            env=Environment(on_tpu_vm=True),
            resolver_factory=RecordingResolver,
        )


DECLARED = "a TPU v5e 2x2 slice (4 chips, tpu-v5-lite-podslice)"
PJRT_SET = {
    "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
    "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/lib/libtpu.so",
    "PJRT_DEVICE": "TPU",
}


def test_no_tpu_in_sight_is_refused_naming_the_slice_and_the_unset_pjrt_variables():
    with pytest.raises(AcceleratorUnavailable) as refused:
        require_tpu(DECLARED, environ={})
    message = str(refused.value)
    assert message.startswith(f"this task declared {DECLARED} but no TPU is reachable")
    assert f"the PJRT variables {', '.join(PJRT_VARIABLES)} are unset" in message


def test_a_tpu_vm_whose_tpu_does_not_connect_is_refused_with_the_resolvers_error():
    environ = {"TPU_WORKER_ID": "0", "TPU_ACCELERATOR_TYPE": "v5litepod-4", **PJRT_SET}
    with pytest.raises(AcceleratorUnavailable) as refused:
        require_tpu(DECLARED, environ, resolver_factory=RecordingResolver)
    assert refused.value.expected == DECLARED
    assert refused.value.found == (
        "could not connect to TPU 'local': ValueError: Could not lookup TPU metadata; "
        "the node says TPU_ACCELERATOR_TYPE=v5litepod-4; "
        "the PJRT variables are set (TF_PLUGGABLE_DEVICE_LIBRARY_PATH=/lib/libtpu.so)"
    )


class ConnectingResolver:
    def __init__(self, tpu: str):
        self.tpu = tpu


def test_the_tpu_system_checked_at_start_is_the_one_training_uses(monkeypatch):
    """Initialising a TPU system again repeats its set-up and loses variables on it: once per process."""
    import tensorflow as tf

    initialised = []
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", initialised.append)
    monkeypatch.setattr(tf_strategy, "_connected_tpus", {})
    require_tpu(DECLARED, {"TPU_WORKER_ID": "0"}, resolver_factory=ConnectingResolver)
    resolver = connect_tpu(Environment(on_tpu_vm=True), resolver_factory=ConnectingResolver)
    assert initialised == [resolver] and resolver.tpu == "local"


def test_pjrt_defaults_fill_in_what_a_tpu_vm_image_left_unset():
    environ = {"TPU_WORKER_ID": "0", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/opt/custom/libtpu.so"}
    set_pjrt_defaults(environ, find_library=lambda: Path("/site-packages/libtpu/libtpu.so"))
    assert environ == {
        "TPU_WORKER_ID": "0",
        "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
        "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/opt/custom/libtpu.so",  # the image's own stays
        "PJRT_DEVICE": "TPU",
    }


def test_pjrt_defaults_need_a_tpu_vm_and_an_installed_libtpu():
    laptop: dict[str, str] = {}
    set_pjrt_defaults(laptop, find_library=lambda: Path("/site-packages/libtpu/libtpu.so"))
    without_libtpu = {"TPU_WORKER_ID": "0"}
    set_pjrt_defaults(without_libtpu, find_library=lambda: None)
    assert (laptop, without_libtpu) == ({}, {"TPU_WORKER_ID": "0"})


def test_libtpu_library_is_the_so_in_the_libtpu_package_folder(tmp_path, monkeypatch):
    assert libtpu_library() is None  # not installed here
    package = tmp_path / "libtpu"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "libtpu.so").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert libtpu_library() == package / "libtpu.so"


def test_a_cpu_build_of_tensorflow_is_named_as_the_reason_no_gpu_is_seen():
    with pytest.raises(AcceleratorUnavailable) as refused:
        require_gpus("1 x nvidia-l4 GPU", 1, environ={})
    assert str(refused.value).startswith(
        "this task declared 1 x nvidia-l4 GPU but TensorFlow sees no GPU: this TensorFlow build has no CUDA"
    )


def test_a_cuda_build_that_sees_too_few_gpus_names_its_cuda_and_the_visible_devices():
    build = {"is_cuda_build": True, "cuda_version": "12.5.1", "cudnn_version": "9"}
    assert gpus_found(1, build, {"CUDA_VISIBLE_DEVICES": ""}) == (
        "TensorFlow sees 1 GPU (built for CUDA 12.5.1 and cuDNN 9, CUDA_VISIBLE_DEVICES=''; "
        "the node's NVIDIA driver must support that CUDA version)"
    )
    assert gpus_found(0, build, {}).startswith("TensorFlow sees no GPU (built for CUDA 12.5.1 and cuDNN 9;")
