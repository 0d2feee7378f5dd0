"""Publishing a run's model bundle under a prefix that scoring (and the scheduled scoring) reads."""

from __future__ import annotations

from flytekit import task
from flytekit.types.directory import FlyteDirectory

from tasks.core.serving.publish import publish_bundle
from tasks.hardware import ML_CPU_IMAGE, SMALL_CPU, guaranteed
from tasks.plumbing.process import begin_task


# ml-cpu: publishing names bundles as tasks.core.serving.bundle does, whose loader imports either framework.
@task(container_image=ML_CPU_IMAGE, **guaranteed(SMALL_CPU))
def publish_model(bundle: FlyteDirectory, prefix: str) -> str:
    """Copy the bundle to `<prefix>/<version>/`, then point `<prefix>/LATEST` at it; returns the
    version's URI. An empty prefix publishes nothing and returns "". A failure names the run's bundle,
    which stays where the run wrote it."""
    if not prefix:
        return ""
    begin_task()
    uri = publish_bundle(bundle.download(), prefix, origin=lasting_path(bundle))
    print(f"published the model bundle as {uri}", flush=True)
    return uri


def lasting_path(bundle: FlyteDirectory) -> str:
    """Where the run's bundle lasts: its URI in the run's outputs, not this pod's downloaded copy."""
    return getattr(bundle, "remote_source", None) or str(bundle.path)
