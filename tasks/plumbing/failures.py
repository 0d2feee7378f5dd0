"""Which failures of a training task Flyte retries, and which end the node at once: one table.

flytekit's entrypoint writes the error document of a task that raised (flytekit/bin/entrypoint.py,
`_dispatch_execute`): kind RECOVERABLE only when the exception is a `FlyteRecoverableException`,
NON_RECOVERABLE for any other exception from the task's code. Propeller retries a recoverable user
error against the task's `retries` and fails the node on a non-recoverable one (flyteorg/flyte v1.16.8,
flytepropeller/pkg/controller/nodes/task/handler.go). So a transient failure has to reach flytekit as
a `FlyteRecoverableException`: `retried_as_recoverable` raises it as one, by the row of the nearest
class in its hierarchy. Deterministic failures keep their own type and message, and are not retried.

Classes are named, not imported, so that the table needs neither torch nor TensorFlow.
docs/reliability.md renders it; tests/unit/plumbing/test_failures.py raises each row through the tasks and reads
the kind flytekit writes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from flytekit.exceptions.user import FlyteRecoverableException


@dataclass(frozen=True)
class Failure:
    exception: str  # "module.Class"; its subclasses too, unless a row names them
    retried: bool
    what: str


FAILURES = (
    # Transient: another attempt may well succeed.
    Failure(
        "tasks.core.training.job_completion.RankZeroSilent",
        True,
        "a PyTorchJob pod's workers finished, but the pod holding rank 0 wrote no outputs in time",
    ),
    Failure(
        "torch.distributed.elastic.rendezvous.api.RendezvousError",
        True,
        "a node did not join the rendezvous in time (scale-up, image pull, quota)",
    ),
    Failure(
        "tasks.core.training.launch.WorkerKilled",
        True,
        "a DDP worker died by a signal, without a Python error (its peer lost, NCCL's watchdog)",
    ),
    Failure(
        "tasks.core.training.preemption.Preempted",
        True,
        "a DDP worker stopped on the preemption notice and saved its checkpoint",
    ),
    Failure(
        "flytekit.exceptions.system.FlyteDownloadDataException",
        True,
        "reading Flyte's storage failed (inputs, a checkpoint)",
    ),
    Failure(
        "flytekit.exceptions.system.FlyteUploadDataException",
        True,
        "writing Flyte's storage failed (a checkpoint, outputs)",
    ),
    Failure("builtins.ConnectionError", True, "a connection to storage dropped or was refused"),
    Failure("builtins.TimeoutError", True, "a call to storage timed out"),
    # Deterministic: another attempt would fail the same way.
    Failure("tasks.core.models.plugins.TrainingDiverged", False, "the training loss became NaN or infinite"),
    Failure(
        "tasks.core.training.torch_ddp.SetUpFailed",
        False,
        "a rank failed to read its shard or build the model",
    ),
    Failure(
        "tasks.core.training.torch_step.OutOfMemoryOnFastPath",
        True,
        "a DDP worker ran out of memory on the fast path; the retry replays the step guarded",
    ),
    Failure(
        "tasks.core.training.launch.WorkerFailed",
        False,
        "a DDP worker raised an error (bad data on its shard, a bug), named with its rank",
    ),
    Failure(
        "tasks.core.training.launch.MissingPyTorchJob",
        False,
        "a multi-node task ran as one pod: the cluster lacks the pytorch plugin",
    ),
    Failure(
        "tasks.core.accelerators.rule.AcceleratorUnavailable",
        False,
        "the declared GPU or TPU is not usable in the pod (driver, node pool, image)",
    ),
    Failure(
        "builtins.ValueError",
        False,
        "bad input: the configuration, the data, the model (InputError, DatasetError, ModelError)",
    ),
    Failure("builtins.Exception", False, "anything else: a bug, which a retry would repeat"),
)
ROWS = {failure.exception: failure for failure in FAILURES}


def failure_of(error: BaseException) -> Failure:
    """The row of the nearest class in `error`'s hierarchy that the table names."""
    for cls in type(error).__mro__:
        row = ROWS.get(f"{cls.__module__}.{cls.__qualname__}")
        if row is not None:
            return row
    return ROWS["builtins.Exception"]


@contextlib.contextmanager
def retried_as_recoverable() -> Iterator[None]:
    """Raises a failure the table retries as `FlyteRecoverableException`; any other passes unchanged."""
    try:
        yield
    except FlyteRecoverableException:
        raise
    except Exception as error:
        failure = failure_of(error)
        if failure.retried:
            message = f"{type(error).__name__}: {error} (retried: {failure.what})"
            raise FlyteRecoverableException(message) from error
        raise
