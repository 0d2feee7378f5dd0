"""Reports bill the hardware that ran: the applied plan's choice, not the training task's declared profile."""

from __future__ import annotations

import pytest
from flytekit.types.file import FlyteFile

from tasks.catalog import TPU_CATALOG
from tasks.core.bundle.metric_records import ClassificationMetrics
from tasks.core.evaluation.compare import compare_runs
from tasks.core.planning.planner import PreprocessPlan, TrainingPlan
from tasks.core.training.config import TrainConfig
from tasks.core.training.records import TrainingRun
from tasks.evaluate import billed_hardware
from tasks.hardware import TRAIN_TPU
from tasks.types import EvaluationReport, ResourcePlan, TrainedModel


def trained_on_tpu() -> TrainedModel:
    """What train_tf_tpu reports: its declared profile, a 2x2 slice of 4 chips."""
    return TrainedModel(
        artifact=FlyteFile("model.keras"),
        run=TrainingRun(framework="tensorflow", device_type="tpu", device_name="TPU (v5 lite)", world_size=1,
                        backend="xla", precision="mixed_bfloat16", strategy="tpu", history=[],
                        samples_per_second=1.0, train_seconds=3600.0, config=TrainConfig()),
        declared=TRAIN_TPU.declared(replicas=1),
    )  # fmt: skip


def tpu_plan(applied: bool) -> ResourcePlan:
    (one_chip,) = [entry for entry in TPU_CATALOG if entry.name == "tpu-v5e-1x1"]
    plan = TrainingPlan(choice=one_chip, estimate=None, estimated_peak_gib=0.5, micro_batch_size=64,
                        grad_accum_steps=1, effective_batch_size=64, options=[])  # fmt: skip
    return ResourcePlan(applied, "tpu", "tensorflow", PreprocessPlan(1, 1, 1, "1", "1Gi"), training=plan)


def report(applied: bool) -> EvaluationReport:
    """What evaluate reports for the TPU run, with or without an applied plan."""
    trained = trained_on_tpu()
    billed, notes = billed_hardware(trained, tpu_plan(applied))
    return EvaluationReport(
        metrics=ClassificationMetrics(accuracy=0.9, macro_f1=0.9, confusion_matrix=[], per_class=[], n_test=1),
        class_labels=[], training=trained.run, billed=billed, dataset="d", notes=notes,
    )  # fmt: skip


def test_a_tpu_run_planned_on_a_one_chip_slice_is_billed_for_one_chip_at_its_price():
    billed, notes = billed_hardware(trained_on_tpu(), tpu_plan(applied=True))
    assert (billed.accelerator, billed.partition) == ("tpu-v5-lite-podslice", "1x1")
    assert billed.count == 1 != TRAIN_TPU.chips
    assert billed.price_per_hour == pytest.approx(1.20)
    assert notes == []


def test_without_an_applied_plan_the_declared_hardware_is_billed_and_said_so():
    billed, notes = billed_hardware(trained_on_tpu(), tpu_plan(applied=False))
    assert billed.count == TRAIN_TPU.chips and billed.price_per_hour is None
    assert "no resource plan was applied" in notes[0]


def test_a_comparisons_cost_uses_the_applied_plan():
    from tasks.compare import summarise

    comparison = compare_runs(
        [summarise("tpu (tensorflow)", report(applied=True))], {"tpu-v5-lite-podslice": 99.0}
    )
    (row,) = comparison.rows
    assert row.accelerator_hours == pytest.approx(1.0)  # one chip for an hour, not four
    assert row.cost_usd == pytest.approx(1.20)  # the option's catalog price, not the whole-device table
    assert "tpu-v5-lite-podslice 1x1 x1" in comparison.table()  # the table names the partition that ran
    assert comparison.notes == []


def test_a_comparison_says_which_runs_were_priced_without_an_applied_plan():
    from tasks.compare import summarise

    comparison = compare_runs([summarise("tpu", report(applied=False))], {"tpu-v5-lite-podslice": 1.5})
    assert comparison.rows[0].cost_usd == pytest.approx(1.5 * TRAIN_TPU.chips)
    assert "tpu: no resource plan was applied" in comparison.notes[0]
