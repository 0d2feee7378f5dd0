"""Reports bill the hardware that ran: the applied plan's choice, not the training task's declared profile."""

from __future__ import annotations

import pytest
from flytekit.types.file import FlyteFile

from tasks.core.compare import compare_runs
from tasks.core.planner import PreprocessPlan
from tasks.evaluate import billed_hardware
from tasks.hardware import TPU_CATALOG, TRAIN_TPU
from tasks.types import ResourcePlan, TrainedModel


def trained_on_tpu() -> TrainedModel:
    """What train_tf_tpu reports: its declared profile, a 2x2 slice of 4 chips."""
    return TrainedModel(
        artifact=FlyteFile("model.keras"), framework="tensorflow", device="TPU (v5 lite)", world_size=1,
        backend="xla", precision="mixed_bfloat16", strategy="tpu", accelerator=TRAIN_TPU.gke_accelerator,
        accelerator_count=TRAIN_TPU.chips, history=[], samples_per_second=1.0, train_seconds=3600.0,
    )  # fmt: skip


def tpu_plan(applied: bool) -> ResourcePlan:
    (one_chip,) = [entry for entry in TPU_CATALOG if entry.name == "tpu-v5e-1x1"]
    return ResourcePlan(
        applied=applied, target="tpu", framework="tensorflow", choice=one_chip.name, device=one_chip.device,
        partition=one_chip.partition, devices=one_chip.devices, memory_gib=one_chip.memory_gib,
        price_per_hour=one_chip.price_per_hour, estimated_peak_gib=0.5, estimate=None, micro_batch_size=64,
        grad_accum_steps=1, effective_batch_size=64, options=[], preprocess=PreprocessPlan(1, 1, 1, "1", "1Gi"),
    )  # fmt: skip


def test_a_tpu_run_planned_on_a_one_chip_slice_is_billed_for_one_chip_at_its_price():
    billed = billed_hardware(trained_on_tpu(), tpu_plan(applied=True))
    assert (billed["accelerator"], billed["accelerator_partition"]) == ("tpu-v5-lite-podslice", "1x1")
    assert billed["accelerator_count"] == 1 != TRAIN_TPU.chips
    assert billed["planned_price_per_hour"] == pytest.approx(1.20)


def test_without_an_applied_plan_the_declared_hardware_is_billed_and_said_so():
    billed = billed_hardware(trained_on_tpu(), tpu_plan(applied=False))
    assert billed["accelerator_count"] == TRAIN_TPU.chips
    assert "no resource plan was applied" in billed["notes"][0]


def test_a_comparisons_cost_uses_the_applied_plan():
    from tasks.compare import summarise
    from tasks.types import EvaluationReport

    billed = billed_hardware(trained_on_tpu(), tpu_plan(applied=True))
    report = EvaluationReport(
        accuracy=0.9, macro_f1=0.9, confusion_matrix=[], per_class=[], class_labels=[], n_test=1,
        framework="tensorflow", trained_on="TPU", world_size=1, strategy="tpu", samples_per_second=1.0,
        train_seconds=3600.0, dataset="d", **billed,
    )  # fmt: skip
    (row,) = compare_runs([summarise("tpu (tensorflow)", report)], {"tpu-v5-lite-podslice": 99.0}).rows
    assert row.accelerator_hours == pytest.approx(1.0)  # one chip for an hour, not four
    assert row.cost_usd == pytest.approx(1.20)  # the option's catalog price, not the whole-device table
