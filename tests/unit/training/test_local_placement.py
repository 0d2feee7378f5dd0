"""Where the torch loop keeps its training rows when no plan chose for the machine it runs on: a local
run places them by this machine's memory, not by the memory of the GPU the planner chose for a cluster."""

from __future__ import annotations

import logging
from dataclasses import replace
from types import SimpleNamespace

import psutil
import pytest
import torch

from tasks.core.models.plugins import mlp_spec
from tasks.core.planning.planner import CatalogEntry, Workload, plan_training
from tasks.core.training.config import TrainConfig
from tasks.core.training.rows import RESIDENT_SHARE, auto_placement
from tasks.core.training.torch_training import train
from tasks.right_sizing import planned_hyperparameters

CPU = torch.device("cpu")
GIB = 2**30


def free_host_memory(monkeypatch, gib: float) -> None:
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=int(gib * GIB)))


def test_rows_stay_in_memory_while_they_take_a_share_of_what_is_free_and_stream_beyond(monkeypatch):
    free_host_memory(monkeypatch, 16)
    row_bytes = 64 * 4 + 8
    fitting_rows = int(RESIDENT_SHARE * 16 * GIB / row_bytes)
    assert auto_placement(fitting_rows, 64, CPU) == "device"
    assert auto_placement(fitting_rows + 1, 64, CPU) == "stream"
    # Two ranks on one machine share its memory.
    assert auto_placement(fitting_rows // 2 + 1, 64, CPU, ranks_on_machine=2) == "stream"
    assert auto_placement(fitting_rows // 2, 64, CPU, ranks_on_machine=2) == "device"


def test_a_table_larger_than_the_machine_streams_whatever_the_planned_gpu_holds(monkeypatch):
    """The planner's choice for an 80 GB GPU keeps 100M rows on the device; this machine has 8 GiB free."""
    free_host_memory(monkeypatch, 8)
    rows = 100_000_000
    footprint = SimpleNamespace(estimate=lambda *a, **k: SimpleNamespace(total_gib=1.0))
    work = Workload(
        footprint, batch_size=64, grad_accum_steps=1, train_rows=rows, val_rows=0, framework="pytorch"
    )
    plan = plan_training(work, [CatalogEntry("h100", "gpu", "nvidia-h100-80gb", "", 80.0, 1, 10.0)])
    assert plan.data_placement == "device"
    config = TrainConfig(model=mlp_spec([32]))
    assert planned_hyperparameters(config, plan, on_cluster=True).data_placement == "device"
    local = planned_hyperparameters(config, plan, on_cluster=False)
    assert local.data_placement == "auto" and local.grad_accum_steps == plan.grad_accum_steps
    assert auto_placement(rows, 64, CPU) == "stream"


@pytest.mark.parametrize(("free_gib", "placement"), [(64.0, "device"), (1e-6, "stream")])
def test_a_local_run_with_auto_places_its_rows_by_the_free_memory(
    blob_splits, monkeypatch, caplog, free_gib, placement
):
    free_host_memory(monkeypatch, free_gib)
    config = TrainConfig(epochs=1, batch_size=32, model=mlp_spec([8]))
    with caplog.at_level(logging.INFO, logger="tasks.core.training.torch_training"):
        outcome = train(replace(config, data_placement="auto"), blob_splits)
    assert f"training rows: {placement} (auto" in caplog.text
    assert outcome.run.history, "the run trained"
