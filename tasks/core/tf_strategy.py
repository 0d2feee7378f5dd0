"""Choosing the `tf.distribute` strategy for the machine a TensorFlow task lands on.

Rules, in order (with `requested="auto"`):
  1. a TPU is reachable (TPU_NAME set, or a GKE TPU VM)  -> TPUStrategy
  2. TF_CONFIG describes a multi-worker cluster (TFJob)  -> MultiWorkerMirroredStrategy
  3. one or more GPUs (or a CPU split into logical devices) -> MirroredStrategy
  4. otherwise                                           -> the default strategy
A strategy requested by name that cannot be had raises StrategyUnavailable, unless
`allow_fallback` is set, in which case the rules above pick another one and say so.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from tasks.core.config import TF_STRATEGIES

log = logging.getLogger(__name__)

# Set by GKE on TPU VM nodes; /dev/accel* (v4, v5e) and /dev/vfio (v5p, v6e) are the TPU devices.
TPU_VM_ENV = ("TPU_WORKER_ID", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES")
TPU_DEVICE_GLOBS = ("/dev/accel*", "/dev/vfio/[0-9]*")


class StrategyUnavailable(RuntimeError):
    """The requested strategy's hardware or cluster is not there."""


@dataclass
class Environment:
    """What the process can see of its hardware and cluster."""

    tpu_name: str | None = None
    on_tpu_vm: bool = False
    tf_config: str | None = None
    gpu_count: int = 0
    cpu_devices: int = 1  # logical CPU devices; more than one only when split on purpose (tests)

    @property
    def tpu_hint(self) -> bool:
        return bool(self.tpu_name) or self.on_tpu_vm

    @property
    def multi_worker(self) -> bool:
        if not self.tf_config:
            return False
        cluster = json.loads(self.tf_config).get("cluster", {})
        return sum(len(tasks) for tasks in cluster.values()) > 1


@dataclass
class StrategyChoice:
    kind: str
    notes: list[str] = field(default_factory=list)


def detect_environment(
    environ: Mapping[str, str] = os.environ, gpu_count: int | None = None, cpu_devices: int | None = None
) -> Environment:
    if gpu_count is None or cpu_devices is None:
        import tensorflow as tf

        gpu_count = len(tf.config.list_physical_devices("GPU")) if gpu_count is None else gpu_count
        cpu_devices = len(tf.config.list_logical_devices("CPU")) if cpu_devices is None else cpu_devices
    on_tpu_vm = any(name in environ for name in TPU_VM_ENV) or any(
        any(Path("/").glob(pattern.lstrip("/"))) for pattern in TPU_DEVICE_GLOBS
    )
    return Environment(
        tpu_name=environ.get("TPU_NAME") or None,
        on_tpu_vm=on_tpu_vm,
        tf_config=environ.get("TF_CONFIG") or None,
        gpu_count=gpu_count,
        cpu_devices=cpu_devices,
    )


def available_kinds(env: Environment) -> list[str]:
    """Strategies this environment can support, in the order of the rules."""
    kinds = []
    if env.tpu_hint:
        kinds.append("tpu")
    if env.multi_worker:
        kinds.append("multi_worker")
    if env.gpu_count or env.cpu_devices > 1:
        kinds.append("mirrored")
    kinds.append("default")
    return kinds


def choose_kind(requested: str, env: Environment, allow_fallback: bool = False) -> StrategyChoice:
    if requested not in TF_STRATEGIES:
        raise ValueError(f"strategy='{requested}' is not one of {', '.join(TF_STRATEGIES)}")
    kinds = available_kinds(env)
    if requested == "auto":
        return StrategyChoice(kinds[0])
    if requested in kinds:
        return StrategyChoice(requested)
    reason = unavailable_reason(requested, env)
    if not allow_fallback:
        raise StrategyUnavailable(f"strategy '{requested}' was requested but {reason}")
    return StrategyChoice(
        kinds[0], [f"strategy '{requested}' unavailable ({reason}); falling back to '{kinds[0]}'"]
    )


def unavailable_reason(kind: str, env: Environment) -> str:
    return {
        "tpu": "no TPU is reachable (TPU_NAME is unset and this is not a TPU VM)",
        "multi_worker": "TF_CONFIG does not describe a cluster of more than one worker",
        "mirrored": "no GPU is visible to TensorFlow (and the CPU is not split into several devices)",
    }[kind]


def connect_tpu(env: Environment, resolver_factory: Callable | None = None):
    """Resolve and initialise the TPU system; StrategyUnavailable with the cause if it fails."""
    import tensorflow as tf

    resolver_factory = resolver_factory or tf.distribute.cluster_resolver.TPUClusterResolver
    target = env.tpu_name or "local"
    try:
        resolver = resolver_factory(tpu=target)
        if target != "local":
            tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except Exception as err:  # the resolver raises several unrelated types (URLError, NotFoundError, ...)
        raise StrategyUnavailable(
            f"could not connect to TPU '{target}': {type(err).__name__}: {err}"
        ) from err
    return resolver


def build_strategy(kind: str, env: Environment, resolver_factory: Callable | None = None):
    import tensorflow as tf

    if kind == "tpu":
        return tf.distribute.TPUStrategy(connect_tpu(env, resolver_factory))
    if kind == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if kind == "mirrored" and env.gpu_count:
        return tf.distribute.MirroredStrategy()
    if kind == "mirrored":
        return tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
    return tf.distribute.get_strategy()


def select_strategy(
    requested: str = "auto",
    allow_fallback: bool = False,
    env: Environment | None = None,
    resolver_factory: Callable | None = None,
):
    """The strategy object and the kind chosen, following the module's rules."""
    env = env or detect_environment()
    choice = choose_kind(requested, env, allow_fallback)
    for note in choice.notes:
        log.warning(note)
    try:
        strategy = build_strategy(choice.kind, env, resolver_factory)
    except StrategyUnavailable as err:
        if requested == "tpu" and not allow_fallback:
            raise
        fallback = available_kinds(replace(env, tpu_name=None, on_tpu_vm=False))[0]
        log.warning("%s; falling back to '%s'", err, fallback)
        return build_strategy(fallback, env), fallback
    log.info("tf.distribute strategy: %s (%d replicas)", choice.kind, strategy.num_replicas_in_sync)
    return strategy, choice.kind
