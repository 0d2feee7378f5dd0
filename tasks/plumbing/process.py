"""What every task body does first in its process."""

from tasks.plumbing.logs import setup_logging
from tasks.plumbing.storage import flyte_storage_as_fsspec_defaults


def begin_task() -> None:
    """The project's log lines on the pod's output, and flytekit's storage settings (an S3-compatible
    endpoint and keys: MinIO, the demo cluster) as fsspec's defaults, because tasks/core opens the
    splits, datasets, bundles and outputs by URI with fsspec, which does not read Flyte's settings."""
    setup_logging()
    flyte_storage_as_fsspec_defaults()


def running_locally() -> bool:
    """A local run (`pyflyte run` without --remote, or calling the workflow in Python), where pyflyte
    prints the workflow's outputs itself; a pod's log has only what its task prints."""
    from flytekit import FlyteContextManager

    return bool(FlyteContextManager.current_context().execution_state.is_local_execution())
