"""Right-sizing per run: plan the hardware from the data and the model, then run the stage with it.

The two planning tasks are `@dynamic`: they run on a small CPU pod, decide, and launch the real task
with `with_overrides`, so no accelerator is requested until the plan says which one. They use the ml-cpu image (CPU builds of both
frameworks) because this module references the training tasks, whose plugin needs torch to be
constructed. Targets come from the one table in tasks/targets.py.
"""

from __future__ import annotations

import html
import importlib.metadata
import logging
from dataclasses import replace
from functools import partial

from flytekit import Deck, Resources, dynamic

from tasks.core.accelerators.rule import on_flyte_cluster
from tasks.core.data.config import DataConfig
from tasks.core.data.fingerprint import dataset_fingerprint, describe_input
from tasks.core.data.pieces import DataPiece, plan_pieces
from tasks.core.data.reading import BATCH_ROWS
from tasks.core.messages import raise_for
from tasks.core.models.plugins import measure_footprint
from tasks.core.planning.planner import (
    PlanError,
    PreprocessPlan,
    TrainingPlan,
    Workload,
    plan_preprocessing,
    plan_training,
)
from tasks.core.publish.promotion import ALWAYS, PromotionPolicy, promotion_problems
from tasks.core.training.config import TrainConfig
from tasks.core.validation import (
    batch_problems,
    data_problems,
    publish_problems,
    regression_problems,
    training_problems,
)
from tasks.hardware import CPU_NODE, LAUNCHER_RETRIES, ML_CPU_IMAGE, SMALL_CPU, guaranteed
from tasks.plumbing.decks import DECKS
from tasks.plumbing.process import begin_task
from tasks.preprocess import preprocess, preprocess_in_pieces
from tasks.targets import TARGETS
from tasks.types import PreparedData, ResourcePlan, TrainedModel

log = logging.getLogger(__name__)
EMBEDDED_DIGITS_SHAPE = (1797, 65, 600_000)  # rows, columns, bytes as parquet
EMBEDDED_FINGERPRINT = f"embedded-digits-scikit-learn-{importlib.metadata.version('scikit-learn')}"


def size_preprocessing(dataset: str, label_column: str) -> tuple[PreprocessPlan, list[DataPiece]]:
    """The plan, and the pieces that read the input where the plan asks for more than one pod (none
    where one does: an input of a single file and row group is one piece however large)."""
    if not dataset:
        rows, columns, size = EMBEDDED_DIGITS_SHAPE
        return plan_preprocessing(size, rows, columns, BATCH_ROWS, CPU_NODE), []
    stats = describe_input(dataset)
    plan = plan_preprocessing(stats.bytes, stats.rows, stats.columns, BATCH_ROWS, CPU_NODE)
    pieces = plan_pieces(dataset, label_column, plan.pieces) if plan.pieces > 1 else []
    if len(pieces) < 2:
        return replace(plan, pieces=1, piece_mem=""), []
    return replace(plan, pieces=len(pieces)), pieces


@dynamic(container_image=ML_CPU_IMAGE, **guaranteed(SMALL_CPU), **DECKS, retries=LAUNCHER_RETRIES)
def prepare_data(
    data: DataConfig,
    target: str,
    hyperparameters: TrainConfig,
    plan_resources: bool,
    publish_to: str = "",
    promotion: PromotionPolicy | None = None,
) -> tuple[PreparedData, PreprocessPlan]:
    """Check every input, size the preprocessing from the input's metadata, then preprocess: in one
    pod, or in pieces for an input past the planner's PIECE_BYTES or PIECE_ROWS.

    Runs first and on CPU, so a bad input fails here, before any data is read or any accelerator is
    requested.
    """
    begin_task()
    raise_for(
        training_problems(target, hyperparameters, TARGETS)
        + data_problems(data)
        + publish_problems(publish_to)
        + promotion_problems(promotion or ALWAYS)
    )
    plan, pieces = size_preprocessing(data.dataset, data.label_column)
    log.info(
        "preprocess plan: %s CPU, %s for %d rows x %d columns, in %d pieces",
        plan.cpu,
        plan.mem,
        plan.input_rows,
        plan.input_columns,
        plan.pieces,
    )
    # The cache key: the data input and the data's fingerprint, so a change of epochs or learning rate
    # reuses the cached splits and a file rewritten in place is prepared again.
    fingerprint = dataset_fingerprint(data.dataset) if data.dataset else EMBEDDED_FINGERPRINT
    if pieces:
        return preprocess_in_pieces(data, fingerprint, pieces, plan, plan_resources), plan
    prepared = preprocess(data=data, dataset_fingerprint=fingerprint)
    if plan_resources:
        sized = Resources(cpu=plan.cpu, mem=plan.mem)
        prepared = prepared.with_overrides(requests=sized, limits=sized)
    return prepared, plan


def workload(prepared: PreparedData, target: str, config: TrainConfig) -> Workload:
    """The run's demands. Building the model checks it (ModelError naming the reference), on CPU."""
    framework = TARGETS[target].framework
    footprint = measure_footprint(
        config.model,
        len(prepared.table.feature_names),
        prepared.table.n_outputs,
        framework,
        config.precision,
    )
    return Workload(
        footprint=footprint,
        batch_size=config.batch_size,
        grad_accum_steps=config.grad_accum_steps,
        train_rows=prepared.table.rows["train"],
        val_rows=prepared.table.rows["val"],
        framework=framework,
        min_micro_batch=config.min_micro_batch_size,
        data_placement=config.data_placement,
    )


def plan_deck(report: ResourcePlan) -> None:
    Deck("Resource plan", f"<pre>{html.escape(report.summary())}</pre>")


@dynamic(
    container_image=ML_CPU_IMAGE,
    **guaranteed(SMALL_CPU),
    **DECKS,
    retries=LAUNCHER_RETRIES,
)
def train_on_target(
    prepared: PreparedData,
    preprocess_plan: PreprocessPlan,
    target: str,
    hyperparameters: TrainConfig,
    plan_resources: bool,
) -> tuple[TrainedModel, ResourcePlan]:
    """Check the model on CPU rows, estimate its memory, pick the cheapest accelerator that holds it,
    and train there."""
    begin_task()
    # The batch against the prepared rows, before any accelerator; the launcher checks the worker split.
    raise_for(
        batch_problems(hyperparameters, 1, prepared.table.rows["train"])
        + (regression_problems(hyperparameters) if prepared.table.target.regression else [])
    )
    report = plan_report(target, workload(prepared, target, hyperparameters), preprocess_plan, plan_resources)
    if report.applied and not on_flyte_cluster():
        report.notes.append(
            "a local run places its training rows by this machine's memory, not the planned device's"
        )
    log.info("%s", report.summary())
    plan_deck(report)
    if report.applied:
        hyperparameters = planned_hyperparameters(hyperparameters, report.training, on_flyte_cluster())
    training_target = TARGETS[target]
    trained = training_target.task(prepared=prepared, hyperparameters=hyperparameters)
    if report.applied:
        trained = trained.with_overrides(**training_target.profile.overrides_for(report.training.choice))
    return trained, report


def planned_hyperparameters(config: TrainConfig, plan: TrainingPlan, on_cluster: bool) -> TrainConfig:
    """The plan's accumulation, and its placement of the training rows where the planned device is
    the one the run gets: on a cluster. A local run keeps its own ("auto": by the memory of the
    machine it runs on, not the planned GPU's)."""
    placement = plan.data_placement if on_cluster else config.data_placement
    return replace(config, grad_accum_steps=plan.grad_accum_steps, data_placement=placement)


def plan_report(
    target: str, work: Workload, preprocess_plan: PreprocessPlan, plan_resources: bool
) -> ResourcePlan:
    """The plan, applied when `plan_resources`. Raises PlanError when planning is on and nothing fits."""
    report = partial(ResourcePlan, target=target, framework=work.framework, preprocess=preprocess_plan)
    catalog = TARGETS[target].catalog
    if catalog is None:
        note = f"target {target} keeps its declared multi-node profile; the planner sizes single-node targets"
        return report(applied=False, notes=[note])
    try:
        plan = plan_training(work, catalog)
    except PlanError as error:
        if plan_resources:
            raise
        return report(applied=False, notes=[f"planning skipped: {error}"])
    return report(applied=plan_resources, training=plan)
