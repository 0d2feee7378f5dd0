"""Choosing the `tf.distribute` strategy for the machine a TensorFlow task lands on, and the checks a
task on a cluster makes before it reads any data: `require_tpu` and `require_gpus` raise
AcceleratorUnavailable (tasks/core/accelerators/rule.py) rather than let it train on the host CPU.

Rules, in order (with `requested="auto"`):
  1. a TPU is reachable (TPU_NAME set, or a GKE TPU VM)  -> TPUStrategy
  2. TF_CONFIG describes a multi-worker cluster (TFJob)  -> MultiWorkerMirroredStrategy
  3. one or more GPUs (or a CPU split into logical devices) -> MirroredStrategy
  4. otherwise                                           -> the default strategy
A strategy requested by name that cannot be had raises StrategyUnavailable, unless
`allow_fallback` is set, in which case the rules above pick another one and say so. The TPU target
requests 'tpu' on a cluster (`tpu_target_strategy`), so there a slice that does not connect fails.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from tasks.core.accelerators.nvidia_driver import DriverLibraries, driver_libraries
from tasks.core.accelerators.rule import AcceleratorUnavailable
from tasks.core.messages import raise_for
from tasks.core.training.config import TF_STRATEGIES

log = logging.getLogger(__name__)

# Set by GKE on TPU VM nodes; /dev/accel* (v4, v5e) and /dev/vfio (v5p, v6e) are the TPU devices.
TPU_VM_ENV = ("TPU_WORKER_ID", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES")
TPU_DEVICE_GLOBS = ("/dev/accel*", "/dev/vfio/[0-9]*")
# TensorFlow reaches TPU v5e, v5p and v6e through libtpu's PJRT plugin, which it loads at import only
# when these are set.
PJRT_LIBRARY = "TF_PLUGGABLE_DEVICE_LIBRARY_PATH"
PJRT_VARIABLES = ("NEXT_PLUGGABLE_DEVICE_USE_C_API", PJRT_LIBRARY, "PJRT_DEVICE")


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


def on_tpu_vm(environ: Mapping[str, str] = os.environ) -> bool:
    return any(name in environ for name in TPU_VM_ENV) or any(
        any(Path("/").glob(pattern.lstrip("/"))) for pattern in TPU_DEVICE_GLOBS
    )


def tpu_environment(environ: Mapping[str, str] = os.environ) -> Environment:
    """The TPU half of the environment, read without importing TensorFlow."""
    return Environment(tpu_name=environ.get("TPU_NAME") or None, on_tpu_vm=on_tpu_vm(environ))


def detect_environment(
    environ: Mapping[str, str] = os.environ, gpu_count: int | None = None, cpu_devices: int | None = None
) -> Environment:
    if gpu_count is None or cpu_devices is None:
        import tensorflow as tf

        gpu_count = len(tf.config.list_physical_devices("GPU")) if gpu_count is None else gpu_count
        cpu_devices = len(tf.config.list_logical_devices("CPU")) if cpu_devices is None else cpu_devices
    return replace(
        tpu_environment(environ),
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


# The tpu target trains with TPUStrategy on its slice; any other strategy would leave the slice idle.
TPU_TARGET_STRATEGIES = ("auto", "tpu")


def tpu_target_problems(requested: str) -> list[str]:
    if requested in TPU_TARGET_STRATEGIES:
        return []
    return [
        f"input 'hyperparameters.tf_strategy' = {requested!r}: the tpu target trains with TPUStrategy on "
        f"its slice; pass 'auto' or 'tpu', or --target gpu-tf for {requested!r}"
    ]


def tpu_target_strategy(requested: str, on_cluster: bool) -> str:
    """'tpu' on a cluster, where a slice that does not connect must fail the task rather than leave
    it on the host CPU; locally the user's 'auto' (with its CPU fallback) or 'tpu'."""
    raise_for(tpu_target_problems(requested))
    return "tpu" if on_cluster else requested


def libtpu_library() -> Path | None:
    """libtpu.so, which the libtpu package ships in its own folder; found without importing it."""
    spec = importlib.util.find_spec("libtpu")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / "libtpu.so").is_file():
            return Path(folder) / "libtpu.so"
    return None


def set_pjrt_defaults(
    environ: MutableMapping[str, str] = os.environ, find_library: Callable[[], Path | None] = libtpu_library
) -> None:
    """On a TPU VM, sets the PJRT variables that the image left unset, for the installed libtpu.
    TensorFlow reads them once, at import: call this before anything imports it."""
    if not on_tpu_vm(environ) or (library := find_library()) is None:
        return
    defaults = {"NEXT_PLUGGABLE_DEVICE_USE_C_API": "true", PJRT_LIBRARY: str(library), "PJRT_DEVICE": "TPU"}
    for name, value in defaults.items():
        environ.setdefault(name, value)


def pjrt_state(environ: Mapping[str, str] = os.environ) -> str:
    missing = [name for name in PJRT_VARIABLES if not environ.get(name)]
    if missing:
        unset = ", ".join(missing)
        return f"the PJRT variables {unset} are unset (without them TensorFlow does not load libtpu)"
    return f"the PJRT variables are set ({PJRT_LIBRARY}={environ[PJRT_LIBRARY]})"


def require_tpu(
    expected: str, environ: Mapping[str, str] = os.environ, resolver_factory: Callable | None = None
) -> None:
    """Connects to the TPU the task declared (`expected`, in words), or raises AcceleratorUnavailable
    naming what was found instead."""
    env = tpu_environment(environ)
    try:
        if not env.tpu_hint:
            raise StrategyUnavailable(unavailable_reason("tpu", env))
        connect_tpu(env, resolver_factory)
    except StrategyUnavailable as err:
        raise AcceleratorUnavailable(expected, tpu_found(err, environ)) from err


def tpu_found(err: StrategyUnavailable, environ: Mapping[str, str] = os.environ) -> str:
    node = environ.get("TPU_ACCELERATOR_TYPE")
    node_says = f"; the node says TPU_ACCELERATOR_TYPE={node}" if node else ""
    return f"{err}{node_says}; {pjrt_state(environ)}"


def require_gpus(expected: str, count: int, environ: Mapping[str, str] = os.environ) -> None:
    """Raises AcceleratorUnavailable unless TensorFlow sees the `count` GPUs the task declared."""
    import tensorflow as tf

    seen = len(tf.config.list_physical_devices("GPU"))
    if seen < count:
        found = gpus_found(seen, tf.sysconfig.get_build_info(), environ, driver_libraries(environ))
        raise AcceleratorUnavailable(expected, found)


def gpus_found(
    seen: int,
    build: Mapping,
    environ: Mapping[str, str] = os.environ,
    libraries: DriverLibraries | None = None,
) -> str:
    """What TensorFlow can say about the GPUs it does not see, from `tf.sysconfig.get_build_info()`,
    and, for a CUDA build, which driver libraries could not be loaded."""
    sees = f"TensorFlow sees {seen or 'no'} GPU{'s' if seen > 1 else ''}"
    if not build.get("is_cuda_build"):
        return f"{sees}: this TensorFlow build has no CUDA support (a CPU build, not tensorflow[and-cuda])"
    built = f"built for CUDA {build.get('cuda_version', '?')} and cuDNN {build.get('cudnn_version', '?')}"
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    restricted = f", CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
    missing = f"; {libraries.describe()}" if libraries and libraries.unloadable else ""
    return f"{sees} ({built}{restricted}; the node's NVIDIA driver must support that CUDA version){missing}"


# TPU systems this process initialised, by target: the task checks its slice before it builds the
# strategy, and initialising a TPU system again repeats its set-up and loses variables already on it.
_connected_tpus: dict[str, object] = {}


def connect_tpu(env: Environment, resolver_factory: Callable | None = None):
    """Resolve and initialise the TPU system, once per target; StrategyUnavailable with the cause if
    that fails."""
    target = env.tpu_name or "local"
    if target in _connected_tpus:
        return _connected_tpus[target]
    import tensorflow as tf

    resolver_factory = resolver_factory or tf.distribute.cluster_resolver.TPUClusterResolver
    try:
        resolver = resolver_factory(tpu=target)
        if target != "local":
            tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except Exception as err:  # the resolver raises several unrelated types (URLError, NotFoundError, ...)
        raise StrategyUnavailable(
            f"could not connect to TPU '{target}': {type(err).__name__}: {err}"
        ) from err
    _connected_tpus[target] = resolver
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
