"""The strategy rules, one test per rule, and the TPU branch up to the resolver."""

from __future__ import annotations

import json

import pytest

from tasks.core.tf_strategy import (
    Environment,
    StrategyUnavailable,
    choose_kind,
    detect_environment,
    select_strategy,
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


def test_tpu_vm_without_a_tpu_fails_clearly_with_the_real_resolver():
    with pytest.raises(StrategyUnavailable, match="could not connect to TPU 'local'"):
        select_strategy("tpu", env=Environment(on_tpu_vm=True))


def test_auto_falls_back_when_the_tpu_hint_was_wrong():
    strategy, kind = select_strategy(
        "auto", env=Environment(on_tpu_vm=True), resolver_factory=RecordingResolver
    )
    assert kind == "default" and strategy.num_replicas_in_sync == 1
