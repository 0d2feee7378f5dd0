"""Evaluation on CPU: write the model bundle, then score the held-out test split through it.

The test split holds the input's raw feature columns with the types they had (text, booleans, dates,
missing values), read as they are stored; the bundle's loader encodes and standardises them as a user's
scoring of the same rows later does, through the same code: the report and that scoring cannot
disagree. The split is streamed one row group at a time, as scoring streams its input: memory does not
grow with the split.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

import numpy as np
from flytekit import current_context, task
from flytekit.types.directory import FlyteDirectory

from tasks.core.bundle.int8 import add_int8_export
from tasks.core.bundle.loading import load_bundle
from tasks.core.bundle.manifest import BundleRecord, CodeVersion, Provenance, SplitSettings, data_hash
from tasks.core.bundle.metric_records import ClassificationMetrics, RegressionMetrics
from tasks.core.bundle.model_card import write_model_card
from tasks.core.bundle.writing import add_metrics, write_bundle
from tasks.core.data.prepare import PreparedTable
from tasks.core.evaluation.split_metrics import regression_split_metrics, split_metrics, split_numbers
from tasks.core.training.records import Hardware
from tasks.hardware import CPU_RETRIES, ML_CPU_IMAGE, SMALL_CPU, guaranteed
from tasks.plumbing.code_version import git_checkout, source_tree_hash
from tasks.plumbing.decks import DECKS, evaluation_deck
from tasks.plumbing.process import begin_task, running_locally
from tasks.plumbing.storage import local_path
from tasks.types import EvaluationReport, PreparedData, ResourcePlan, TrainedModel

log = logging.getLogger(__name__)


def billed_hardware(trained: TrainedModel, plan: ResourcePlan | None) -> tuple[Hardware, list[str]]:
    """What the run is billed for, and a note where that is only the declaration. A training task
    reports its declared hardware; where the planner put it on other hardware (a 1-chip TPU slice, a
    MIG slice), the applied plan says what ran. Local runs on CPU are billed as CPU worker processes."""
    if trained.run.on_cpu:
        return trained.declared, []
    if plan is None or not plan.applied:
        return trained.declared, ["no resource plan was applied: billed as declared in tasks/hardware.py"]
    choice = plan.training.choice
    return Hardware(
        choice.device, choice.devices, choice.partition, choice.price_per_hour / choice.devices
    ), []


def run_provenance(prepared: PreparedData) -> Provenance:
    """The split (as the prepared table carries the settings preprocessing split by), the code and the
    data's hash. In a pod the code has no git checkout: the version its task was registered under
    names the commit (`make register` names the version after it, with "-dirty-" and a hash where the
    tree had uncommitted changes)."""
    task_id = None if running_locally() else current_context().task_id
    registered = task_id.version if task_id else ""
    return Provenance(
        split=SplitSettings.of(prepared.table),
        code=CodeVersion.of(source_tree_hash(), git_checkout(), registered),
        data=data_hash(prepared.table.source),
    )


LOCAL_MODELS = "MIXEDML_LOCAL_MODELS"


def bundle_folder(fingerprint: str) -> str:
    """Where the bundle is written. In a pod, the task's working directory, from which flytekit uploads
    it. In a local run, a folder that outlasts the run, one per run, named by the time and the data's
    fingerprint, under $MIXEDML_LOCAL_MODELS or else ./mixedml-models: flytekit keeps a local run's
    outputs in its temporary folders, so the path pyflyte prints would otherwise be one of those."""
    if not running_locally():
        return str(Path(current_context().working_directory) / "model")
    root = Path(os.environ.get(LOCAL_MODELS) or "mixedml-models").absolute()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    return str(root / f"{stamp}-{fingerprint[:8]}")


def test_metrics(
    bundle, test: str, table: PreparedTable, points: tuple[np.ndarray, np.ndarray] | None
) -> ClassificationMetrics | RegressionMetrics:
    """The test split's figures as the bundle scores its raw rows: a regression's from its `points`
    (`split_numbers`: actual, predicted)."""
    if points is not None:
        return regression_split_metrics(bundle, *points)
    return split_metrics(bundle, test, table.label_column, table.class_labels)


# A run's outputs: the report, and the model bundle (tasks/core/bundle/). The functional form keeps the
# field types real classes, as flytekit reads them, under postponed annotations.
Evaluated = NamedTuple("Evaluated", [("report", EvaluationReport), ("model", FlyteDirectory)])  # noqa: UP014


# The ml-cpu image has the CPU builds of both frameworks: a model from either is rebuilt without CUDA.
@task(
    container_image=ML_CPU_IMAGE,
    **guaranteed(SMALL_CPU),
    **DECKS,
    retries=CPU_RETRIES,
)
def evaluate(
    prepared: PreparedData, trained: TrainedModel, plan: ResourcePlan | None = None, int8_export: bool = False
) -> Evaluated:
    """The model bundle of the run, and the test split's metrics as that bundle scores it; with
    `int8_export`, also an int8 ONNX file where it keeps the test accuracy and scores faster."""
    begin_task()
    billed, notes = billed_hardware(trained, plan)
    folder = bundle_folder(prepared.fingerprint)
    record = BundleRecord.of(prepared.table, trained.run, billed, prepared.fingerprint)
    write_bundle(folder, trained.artifact.download(), record, run_provenance(prepared))
    own_builder = trained.run.config.model.builder
    bundle = load_bundle(folder, trusted_builders=[own_builder])
    notes.extend(bundle.manifest.export_notes)  # an export left out, and why, in the report too
    test = local_path(prepared.test, "test split")
    points = (
        split_numbers(bundle, test, prepared.table.label_column) if prepared.table.target.regression else None
    )
    metrics = test_metrics(bundle, test, prepared.table, points)
    add_metrics(folder, metrics)
    regression = isinstance(metrics, RegressionMetrics)
    int8 = add_int8_export(
        folder,
        test,
        prepared.table.label_column,
        train_rows=prepared.splits_in_place().train,  # read in place: only the calibration sample's rows
        enabled=int8_export and not regression,
    )
    if int8.check is not None:
        notes.append(f"int8 ONNX export {'kept' if int8.kept else 'not kept'}: {int8.why}")
    elif int8_export and regression:
        notes.append(
            "int8 ONNX export not attempted: its keep rule compares test accuracy, which a regression has not"
        )
    write_model_card(folder)  # once the metrics and the exports are in the manifest
    report = EvaluationReport(
        metrics=None if regression else metrics,
        regression=metrics if regression else None,
        target=prepared.table.target,
        class_labels=prepared.table.class_labels,
        training=trained.run,
        billed=billed,
        dataset=prepared.table.source,
        resource_plan=plan,
        notes=notes + prepared.table.notes + metrics.notes(),
    )
    evaluation_deck(report, points)
    if not running_locally():  # where pyflyte prints the outputs, the report would appear twice
        print(report.summary(), flush=True)
    return Evaluated(report, FlyteDirectory(folder))
