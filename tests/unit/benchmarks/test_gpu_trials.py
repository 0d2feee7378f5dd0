"""The GPU check's trials sharing one GPU, on CPU: the worker training one trial in a process of its
own, the planner placing small trials on MIG slices, the judging of hand-made results, and the step
skipped where it cannot run, saying why."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch

from benchmarks import gpu_figures as gpu
from benchmarks import gpu_trials
from benchmarks.gpu_trials import Device, PlannedTrial
from benchmarks.measure import REPO
from tasks.core.models.plugins import mlp_spec
from tasks.core.training.config import TrainConfig
from tests.unit.benchmarks.test_gpu_check import as_if_not_installed

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without CUDA")
H200 = Device("NVIDIA H200", 141 * gpu.GIB)
CPU = Device("cpu", 64 * gpu.GIB, "cpu")


def needs_flytekit():
    pytest.importorskip("flytekit", reason="the planner's catalog (tasks/catalog.py) imports flytekit")


def trial(width: int, option: str = "h200-mig-1g.18gb", memory_gib: float = 16.5, **config) -> PlannedTrial:
    settings = {"epochs": 3, "batch_size": 512, "precision": "bf16", "data_placement": "device", **config}
    planned = TrainConfig(model=mlp_spec([width, width]), **settings)
    return PlannedTrial(f"MLP {width}x{width}", planned, option, memory_gib, 0.65, "4,096 rows x 64 features")


def result(started: float, seconds: float, peak_gib: float = 0.5, **changes) -> dict:
    """What a worker that trained 1,000 samples in `seconds` from `started` reports."""
    return {"exit_code": 0, "log_tail": "", "samples": 1000, "samples_per_second": 1000 / seconds,
            "train_seconds": seconds, "wall_seconds": seconds, "started": started, "ended": started + seconds,
            "peak_bytes": int(peak_gib * gpu.GIB), "val_accuracy": 0.99, "micro_batch_size": 512,
            "device_type": "cuda", "device_name": "NVIDIA H200", **changes}  # fmt: skip


TRIALS = [trial(width) for width in (64, 128, 256, 512)]
ONE_AFTER_ANOTHER = [result(started=100.0 * i, seconds=10.0) for i in range(4)]  # 4,000 samples in 40 s
AT_ONCE = [result(started=500.0 + i, seconds=17.0, peak_gib=0.25) for i in range(4)]  # in 20 s


def test_the_figures_compare_the_trials_at_once_with_one_after_another_and_each_peak_with_its_option():
    throughput, *peaks = gpu_trials.packing_figures(TRIALS, ONE_AFTER_ANOTHER, AT_ONCE, H200)
    assert (throughput.value, throughput.baseline, throughput.unit) == (200.0, 100.0, "samples/s")
    assert throughput.met and throughput.goal == "ratio >= 1"
    assert throughput.name.startswith("4 trials sharing NVIDIA H200 at once vs one after another")
    assert "4,096 rows x 64 features, MLPs 64x64 to 512x512, batch 512, 3 epochs" in throughput.name
    assert [figure.name.split(" on ")[0] for figure in peaks] == [f"trial {t.name}" for t in TRIALS]
    # The higher peak of each trial's two runs, against its option's memory.
    assert [(f.value, f.baseline, f.unit, f.met) for f in peaks] == [(0.5, 16.5, "GiB", True)] * 4
    assert "on its planned h200-mig-1g.18gb (planner's estimate 0.65 GiB)" in peaks[0].name


def test_a_slower_packing_and_a_peak_over_the_option_are_reported_as_missed_goals():
    slow = [result(started=500.0, seconds=80.0) for _ in range(4)]  # 4,000 samples in 80 s
    over = [*ONE_AFTER_ANOTHER[:3], result(started=300.0, seconds=10.0, peak_gib=17.0)]
    throughput, *peaks = gpu_trials.packing_figures(TRIALS, over, slow, H200)
    assert throughput.ratio == 0.5 and throughput.met is False
    assert [f.met for f in peaks] == [True, True, True, False] and peaks[3].value == 17.0


@pytest.mark.parametrize(
    "changes, problem",
    [
        ({"exit_code": 1, "log_tail": "Traceback ... OSError"}, r"exited 1: Traceback \.\.\. OSError"),
        ({"micro_batch_size": 256}, "ran out of memory: micro-batch 512 -> 256"),
        ({"val_accuracy": 0.3}, "validation accuracy 0.300 < 0.9"),
        ({"device_type": "cpu"}, "trained on cpu, not cuda"),
    ],
)
@pytest.mark.parametrize("at_once", [False, True])
def test_a_trial_that_failed_ran_out_of_memory_or_learned_nothing_fails_the_step(changes, problem, at_once):
    runs = [list(ONE_AFTER_ANOTHER), list(AT_ONCE)]
    runs[at_once][2] = {**runs[at_once][2], **changes}
    run = "4 at once" if at_once else "one after another"
    with pytest.raises(
        gpu.CheckFailed, match=rf"trial MLP 256x256 \({run}, capped at h200-mig-1g.18gb's 16.5 GiB\)"
    ):
        gpu_trials.packing_figures(TRIALS, *runs, H200)
    with pytest.raises(gpu.CheckFailed, match=problem):
        gpu_trials.packing_figures(TRIALS, *runs, H200)


def test_options_that_do_not_fit_in_the_gpu_together_are_no_packing():
    gpu_trials.expect_packed(TRIALS, H200)  # 4 x 16.5 GiB of 141
    whole = [trial(width, "h200-141gb", 139.8) for width in (64, 128)]
    with pytest.raises(
        gpu.CheckFailed, match=r"\(h200-141gb, h200-141gb\) need 279.6 GiB together, more than the 141.0"
    ):
        gpu_trials.expect_packed(whole, H200)


def test_each_trial_is_capped_at_its_options_share_of_the_gpus_memory_and_not_at_all_off_cuda():
    assert gpu_trials.memory_fraction(TRIALS[0], H200) == pytest.approx(16.5 / 141)
    assert gpu_trials.memory_fraction(trial(64, "h200-141gb", 139.8), Device("H200", 100 * gpu.GIB)) == 1.0
    assert gpu_trials.memory_fraction(TRIALS[0], CPU) is None


def test_the_trials_differ_as_a_studys_do():
    configs = gpu_trials.trial_configs()
    assert [gpu_trials.widths(config) for config in configs] == ["64x64", "128x128", "256x256", "512x512"]
    assert {(c.batch_size, c.epochs, c.precision) for c in configs} == {(512, 3, "bf16")}
    assert gpu_trials.trial_rows(gpu.FULL) == 200_000 and gpu_trials.trial_rows(gpu.SMOKE) == gpu.SMOKE.rows


@pytest.mark.parametrize(
    "name, expected",
    [
        ("NVIDIA H200", {"h200-mig-1g.18gb", "h200-mig-2g.35gb", "h200-mig-3g.71gb", "h200-141gb"}),
        ("NVIDIA H100 80GB HBM3", {"h100-mig-1g.10gb", "h100-mig-2g.20gb", "h100-mig-3g.40gb", "h100-80gb"}),
    ],
)
def test_the_catalog_is_the_gpus_own_slices_and_the_whole_gpu(name, expected):
    needs_flytekit()
    assert {entry.name for entry in gpu_trials.catalog_for(name)} == expected


def test_a_gpu_the_catalog_does_not_name_gets_every_gpu_option():
    needs_flytekit()
    from tasks.catalog import GPU_OPTIONS

    assert gpu_trials.catalog_for("NVIDIA L4") == GPU_OPTIONS


@pytest.mark.slow
def test_the_planner_puts_each_small_trial_on_the_smallest_h200_slice(tmp_path):
    needs_flytekit()
    splits = gpu_trials.trial_splits(tmp_path, 4096)
    catalog = gpu_trials.catalog_for("NVIDIA H200")
    for config in gpu_trials.trial_configs():
        planned = gpu_trials.plan_trial(config, splits, catalog)
        assert (planned.option, planned.option_memory_gib) == ("h200-mig-1g.18gb", 16.5)
        assert 0 < planned.estimated_peak_gib < 16.5 * 0.9
        assert planned.config == replace(config, data_placement="device")
        assert planned.name == f"MLP {gpu_trials.widths(config)}"
        assert planned.table == "4,096 rows x 64 features"
    # A MIG slice is priced as its share of the GPU: seven 1g slices are one H200.
    (slice_,) = [entry for entry in catalog if entry.name == "h200-mig-1g.18gb"]
    (whole,) = [entry for entry in catalog if entry.name == "h200-141gb"]
    assert math.isclose(7 * slice_.price_per_hour, whole.price_per_hour)


@pytest.mark.slow
def test_workers_started_together_train_on_cpu_and_report_in_order_a_failed_one_with_its_log(tmp_path):
    splits = gpu_trials.trial_splits(tmp_path, 4096)
    ok, broken = trial(32, epochs=2, batch_size=128), trial(64, epochs=2, batch_size=128)
    missing = replace(splits, train=str(tmp_path / "missing.parquet"))
    workers = [
        gpu_trials.start_trial(ok, splits, CPU, tmp_path / "ok"),
        gpu_trials.start_trial(broken, missing, CPU, tmp_path / "broken"),
    ]
    trained, failed = (worker.finish(time.monotonic() + 120) for worker in workers)
    assert trained["exit_code"] == 0, trained["log_tail"]
    assert trained["samples"] == 2 * (4096 // 128) * 128
    assert trained["device_type"] == "cpu" and trained["peak_bytes"] == 0  # no cap, no device peak
    assert trained["val_accuracy"] >= gpu.MIN_ACCURACY and trained["micro_batch_size"] == 128
    assert 0 < trained["train_seconds"] <= trained["wall_seconds"] == trained["ended"] - trained["started"]
    assert trained["samples_per_second"] > 0 and trained["device_name"]
    gpu_trials.expect_trained(ok, trained, "alone", CPU)
    assert failed["exit_code"] != 0 and "missing.parquet" in failed["log_tail"]
    assert "samples" not in failed
    with pytest.raises(
        gpu.CheckFailed, match=r"(?s)trial MLP 64x64 \(alone, .*\) exited 1: .*missing.parquet"
    ):
        gpu_trials.expect_trained(broken, failed, "alone", CPU)


def test_a_worker_still_running_at_its_deadline_is_killed_and_fails(tmp_path):
    log = tmp_path / "trial.log"
    log.write_text("epoch 1 ...")
    worker = gpu_trials.TrialProcess(subprocess.Popen(["sleep", "30"]), log, tmp_path / "result.json")
    started = time.monotonic()
    found = worker.finish(deadline=started)
    assert time.monotonic() - started < 5
    assert found == {"exit_code": -9, "log_tail": "epoch 1 ..."}


def test_the_worker_reads_its_trial_as_the_step_writes_it(tmp_path, monkeypatch):
    splits = gpu_trials.trial_splits(tmp_path, 4096)
    seen = []
    monkeypatch.setattr(gpu_trials, "train_trial", lambda *args: seen.append(args) or {"samples": 1})
    arguments = gpu_trials.trial_arguments(TRIALS[1].config, splits, 0.25)
    assert gpu_trials.main(["--trial", arguments, "--result", str(tmp_path / "r.json")]) == 0
    assert seen == [(TRIALS[1].config, splits, 0.25)]
    assert json.loads((tmp_path / "r.json").read_text()) == {"samples": 1}


@pytest.mark.slow
def test_importing_the_step_imports_no_flytekit():
    """The GPU machine may have no flytekit: only the step, when it runs, needs it."""
    code = "import sys\nsys.modules['flytekit'] = None\nimport benchmarks.gpu_trials\n"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@no_cuda
def test_without_cuda_the_step_is_skipped_saying_why_before_it_writes_anything(tmp_path):
    with pytest.raises(gpu.Skipped, match=re.escape(gpu.NO_CUDA)):
        gpu_trials.trials_sharing_gpu(tmp_path, gpu.SMOKE)
    assert not list(tmp_path.iterdir())


def test_without_flytekit_the_step_is_skipped_saying_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_trials, "require_cuda", lambda: None)
    as_if_not_installed(monkeypatch, "flytekit")
    with pytest.raises(gpu.Skipped, match=r"flytekit not installed \(the planner's catalog.*make gpu-wheels"):
        gpu_trials.trials_sharing_gpu(tmp_path, gpu.SMOKE)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.heavy  # the step end to end: eight trial processes on two CPU cores
def test_the_step_end_to_end_on_cpu_with_the_cpu_standing_in_for_an_h200(tmp_path, monkeypatch):
    needs_flytekit()
    monkeypatch.setattr(gpu_trials, "TRIAL_WIDTHS", (32, 64))
    device = Device("NVIDIA H200 (the CPU standing in)", 141 * gpu.GIB, "cpu")
    throughput, *peaks = gpu_trials.trials_on(device, tmp_path, replace(gpu.SMOKE, rows=8192))
    assert throughput.name.startswith("2 trials sharing NVIDIA H200 (the CPU standing in) at once")
    assert "8,192 rows x 64 features, MLPs 32x32 to 64x64" in throughput.name
    assert throughput.value > 0 and throughput.baseline > 0
    assert [(f.value, f.baseline) for f in peaks] == [(0.0, 16.5)] * 2  # no device peak on CPU
    assert all("h200-mig-1g.18gb" in f.name for f in peaks)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["alone-0", "alone-1", "at-once"]
