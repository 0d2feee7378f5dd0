"""Publishing a run's model bundle under a prefix that scoring (and the scheduled scoring) reads."""

from __future__ import annotations

from flytekit import task
from flytekit.types.directory import FlyteDirectory

from tasks.core.messages import raise_for
from tasks.core.publish.promotion import ALWAYS, PromotionPolicy, promotion_of, promotion_problems
from tasks.core.publish.versions import publish_bundle
from tasks.hardware import CPU_RETRIES, ML_CPU_IMAGE, SMALL_CPU, guaranteed
from tasks.plumbing.process import begin_task
from tasks.plumbing.storage import local_path
from tasks.types import PreparedData


# ml-cpu: publishing names bundles as tasks.core.bundle.loading does, whose loader imports either framework.
@task(container_image=ML_CPU_IMAGE, **guaranteed(SMALL_CPU), retries=CPU_RETRIES)
def publish_model(
    bundle: FlyteDirectory,
    prefix: str,
    prepared: PreparedData | None = None,
    promotion: PromotionPolicy = ALWAYS,
) -> str:
    """Copy the bundle to `<prefix>/<version>/`, then point `<prefix>/LATEST` at it where `promotion`
    promotes it: always, or by the gate, which scores the run's raw test split (in `prepared`) with
    this bundle and with the one LATEST names (tasks/core/publish/promotion.py). Returns the version's
    URI, promoted or not; the decision is printed with both figures, and recorded in the version's
    PUBLISHED.json. An empty prefix publishes nothing
    and returns "". A failure names the run's bundle, which stays where the run wrote it."""
    raise_for(promotion_problems(promotion))
    if not prefix:
        return ""
    begin_task()
    local = bundle.download()
    decision = promotion_of(local, prefix, *gate_rows(prepared, promotion), promotion)
    uri = publish_bundle(local, prefix, origin=lasting_path(bundle), promote=decision)
    print(f"published the model bundle as {uri}; {decision.reason}", flush=True)
    return uri


def gate_rows(prepared: PreparedData | None, promotion: PromotionPolicy) -> tuple[str, str, list[str]]:
    """The test split on this machine's disk, its label column and class labels, where the gate reads them."""
    if prepared is None or promotion.mode == "always":
        return "", "", []
    table = prepared.table
    return local_path(prepared.test, "test split"), table.label_column, table.class_labels


def lasting_path(bundle: FlyteDirectory) -> str:
    """Where the run's bundle lasts: its URI in the run's outputs, not this pod's downloaded copy."""
    return getattr(bundle, "remote_source", None) or str(bundle.path)
