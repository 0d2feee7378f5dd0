"""`make gpu-check` on a machine without CUDA: every step skipped saying why, the summary printed,
nothing imported that needs flytekit; and the logic that judges figures and checks."""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks import gpu_check, gpu_scoring
from benchmarks import gpu_figures as gpu
from benchmarks.gpu_profile import ProfileSummary
from tasks.core.scoring.records import GPU_MODEL_SPEEDUP
from tasks.core.training.config import TrainConfig
from tasks.core.training.records import EpochMetrics, TrainingRun
from tasks.core.training.torch_loop import TrainOutcome

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without CUDA")
STEP_NAMES = [step.name for step in gpu_check.gpu_steps(gpu.Workspace(Path("unused"), gpu.SMOKE), 1e15)]


@pytest.fixture(autouse=True)
def no_full_collection_between_steps(monkeypatch):
    """A step's clean-up runs a full garbage collection, half a second in a process holding torch and
    TensorFlow: these tests' steps leave nothing on a device to release."""
    monkeypatch.setattr(gpu, "release_device_memory", lambda: None)


def figure(value: float, baseline: float, **goal) -> gpu.GpuFigure:
    return gpu.GpuFigure("f", value, baseline, "x", **goal)


@pytest.mark.parametrize(
    "goal, ratio, met, text",
    [
        ({"low": 0.9}, 0.95, True, "ratio >= 0.9"),
        ({"low": 0.9}, 0.85, False, "ratio >= 0.9"),
        ({"low": 0.9, "high": 1.35}, 1.2, True, "0.9 <= ratio <= 1.35"),
        ({"low": 0.9, "high": 1.35}, 1.4, False, "0.9 <= ratio <= 1.35"),
        ({"high": 1.15}, 1.1, True, "ratio <= 1.15"),
        ({}, 3.0, None, ""),
    ],
)
def test_a_figure_meets_its_goal_by_its_ratio(goal, ratio, met, text):
    f = figure(ratio * 10, 10, **goal)
    assert (f.met, f.goal) == (met, text)


def test_a_figure_without_a_baseline_meets_no_goal():
    assert figure(1.0, 0.0, low=0.5).met is False


def test_the_cuda_marked_tests_are_found():
    found = gpu_check.cuda_test_files()
    assert {"tests/unit/training/test_cuda.py", "tests/unit/benchmarks/test_gpu_profile.py"} <= set(found)
    assert "tests/unit/benchmarks/test_gpu_check.py" not in found


def test_the_pytest_step_says_what_it_lacks(monkeypatch):
    monkeypatch.setattr(gpu, "require_cuda", lambda: None)
    monkeypatch.setitem(sys.modules, "pytest", None)
    result = gpu_check.run_step(gpu_check.Step("tests", gpu_check.cuda_tests))
    assert result.status == gpu_check.SKIPPED and result.detail.startswith("pytest not installed")


def failing() -> str:
    raise gpu.CheckFailed("the guard lost an optimizer step")


def skipped() -> str:
    raise gpu.Skipped("needs a GPU")


STEPS = [
    gpu_check.Step("check ok", lambda: "all good"),
    gpu_check.Step("figures", lambda: [figure(5, 10, low=0.9), figure(2, 1)]),
    gpu_check.Step("skipped", skipped),
]


def test_a_missed_goal_and_a_skipped_step_still_exit_zero(tmp_path, capsys):
    assert gpu_check.main(["--json", str(tmp_path / "r.json")], steps=STEPS) == 0
    out = capsys.readouterr().out
    assert "| f | 5.000 x | 10.000 x | 0.500 | ratio >= 0.9 | MISSED |" in out
    assert "| f | 2.000 x | 1.000 x | 2.000 |  |  |" in out
    assert re.search(r"\| skipped \| skipped \| [\d.]+ \| needs a GPU \|", out)
    assert "steps: 2 passed, 0 failed, 1 skipped; goals: 0 met, 1 missed" in out
    steps = json.loads((tmp_path / "r.json").read_text())["steps"]
    assert [f["met"] for f in steps[1]["figures"]] == [False, None]
    assert steps[1]["figures"][0]["ratio"] == 0.5


def test_a_failing_check_makes_the_exit_code_non_zero(tmp_path, capsys):
    code = gpu_check.main(
        ["--json", str(tmp_path / "r.json")], steps=[*STEPS, gpu_check.Step("guard", failing)]
    )
    assert code == 1
    failed = r"\| guard \| FAIL \| [\d.]+ \| CheckFailed: the guard lost an optimizer step \|"
    assert re.search(failed, capsys.readouterr().out)
    assert json.loads((tmp_path / "r.json").read_text())["exit_code"] == 1


def test_the_json_holds_every_finished_step_while_the_next_one_runs(tmp_path, capsys):
    """A check stopped part way (a time limit, a hung step) still leaves the steps it finished."""
    report = tmp_path / "r.json"
    seen = []

    def reads_the_report() -> str:
        seen.append([step["name"] for step in json.loads(report.read_text())["steps"]])
        return "read"

    gpu_check.main(["--json", str(report)], steps=[*STEPS, gpu_check.Step("reader", reads_the_report)])
    assert seen == [["check ok", "figures", "skipped"]]
    assert json.loads(report.read_text())["machine"]["torch"] == torch.__version__


def test_an_unexpected_error_in_a_step_fails_it_and_the_next_steps_still_run():
    results = gpu_check.run_all([gpu_check.Step("broken", lambda: 1 / 0), *STEPS])
    assert [r.status for r in results] == ["FAIL", "pass", "pass", "skipped"]
    assert results[0].detail.startswith("ZeroDivisionError")


def outcome(micro: int, accum: int, steps: int, loss: float = 0.5) -> TrainOutcome:
    run = TrainingRun("pytorch", "cuda", "gpu", 1, "none", "bfloat16", "single-process",
                      [EpochMetrics(1, loss, 0.9, loss, 0.9)], 1.0, 1.0, TrainConfig())  # fmt: skip
    return TrainOutcome(run, 0, [], steps, micro, accum)


def test_the_guard_check_passes_a_halved_micro_batch_with_the_same_effective_batch():
    config = TrainConfig(epochs=1, batch_size=4096)
    assert "micro-batch 4096 -> 1024" in gpu.guard_finding(outcome(1024, 4, 8), config, expected_steps=8)


@pytest.mark.parametrize(
    "micro, accum, steps, loss, problem",
    [
        (4096, 1, 8, 0.5, "no out-of-memory error"),
        (1024, 2, 8, 0.5, "effective batch changed"),
        (1024, 4, 7, 0.5, "7 optimizer steps instead of 8"),
        (1024, 4, 8, math.nan, "training losses"),
    ],
)
def test_the_guard_check_fails_what_the_guard_must_not_do(micro, accum, steps, loss, problem):
    with pytest.raises(gpu.CheckFailed, match=problem):
        gpu.guard_finding(outcome(micro, accum, steps, loss), TrainConfig(epochs=1, batch_size=4096), 8)


def ddp_run(backend: str, accuracy: float = 1.0, steps: int = 20) -> dict:
    epoch = {"epoch": 1, "train_loss": 0.1, "train_accuracy": 1.0, "val_loss": 0.1, "val_accuracy": accuracy}
    return {
        "backend": backend,
        "world_size": 1,
        "device_name": "H200",
        "history": [epoch],
        "optimizer_steps": steps,
    }


def test_the_ddp_check_wants_the_backend_and_a_model_that_learned():
    config = TrainConfig(epochs=1, batch_size=64)
    assert gpu.ddp_finding(ddp_run("nccl"), config).startswith("DDP over nccl, 1 rank on H200")
    with pytest.raises(gpu.CheckFailed, match="backend is 'none'"):
        gpu.ddp_finding(ddp_run("none"), config)
    with pytest.raises(gpu.CheckFailed, match="validation accuracy 0.300"):
        gpu.ddp_finding(ddp_run("nccl", accuracy=0.3), config)
    assert "12 of 20 optimizer steps on DDP's overlapped fast path" in gpu.ddp_finding(
        ddp_run("nccl"), config
    )
    with pytest.raises(gpu.CheckFailed, match="the fast path .* never ran"):
        gpu.ddp_finding(ddp_run("nccl", steps=8), config)


def two_ranks(micro=(1024, 1024), accum=4, steps=(8, 8), same=True, backend="gloo") -> list[dict]:
    weights = [np.ones(3), np.ones(3) if same else np.zeros(3)]
    return [
        {"backend": backend, "micro_batch_size": m, "grad_accum_steps": accum, "optimizer_steps": s,
         "losses": [0.5], "parameters": [w]}
        for m, s, w in zip(micro, steps, weights, strict=True)
    ]  # fmt: skip


def test_the_collective_guard_check_wants_both_ranks_halved_together():
    config = TrainConfig(epochs=1, batch_size=8192)  # 4096 a rank
    found = gpu.collective_guard_finding(two_ranks(), config, expected_steps=8)
    assert "per-rank micro-batch 4096 -> 1024 on every rank" in found


@pytest.mark.parametrize(
    "ranks, problem",
    [
        (two_ranks(micro=(1024, 2048)), "different micro-batches: \\[1024, 2048\\]"),
        (two_ranks(micro=(4096, 4096), accum=1), "no out-of-memory error"),
        (two_ranks(accum=2), "effective batch changed"),
        (two_ranks(steps=(8, 7)), "rank 1 took 7 optimizer steps instead of 8"),
        (two_ranks(same=False), "parameters differ"),
        (two_ranks(backend="nccl"), "rank 0 trained over 'nccl'"),
    ],
)
def test_the_collective_guard_check_fails_what_the_guard_must_not_do(ranks, problem):
    with pytest.raises(gpu.CheckFailed, match=problem):
        gpu.collective_guard_finding(ranks, TrainConfig(epochs=1, batch_size=8192), expected_steps=8)


@pytest.mark.slow
def test_the_scoring_figures_run_the_whole_scorer_on_each_side(tmp_path, monkeypatch):
    """On CPU, the CPU standing in for the GPU: each side scores its table through the scorer, the
    one-core figure's goal is the speed-up the scorer predicts for that bundle, and no scored output
    is left behind."""
    monkeypatch.setattr(gpu_scoring, "require_cuda", lambda: None)
    monkeypatch.setattr(gpu_scoring, "gpu_bundle", gpu_scoring.load_bundle)
    monkeypatch.setattr(gpu_scoring, "WIDE_MODEL", [512, 512])  # one CPU thread: the real one takes seconds
    figures = gpu_scoring.scoring_on_gpu(tmp_path, replace(gpu.SMOKE, scoring_rows=4096))
    assert len(figures) == 4
    one_core, all_threads = figures[:2]
    assert 1 < one_core.low < GPU_MODEL_SPEEDUP and f"predicts {one_core.low:.1f}x" in one_core.name
    assert all_threads.low is None and "MLP 256x128" in all_threads.name
    assert "MLP 512x512" in figures[2].name
    assert all(f.value > 0 and f.baseline > 0 for f in figures)
    assert not list(tmp_path.glob("scored-*"))


def as_if_not_installed(monkeypatch, module: str) -> None:
    """`require_modules` then finds no `module`, and every other module as it is."""
    found = gpu.importlib.util.find_spec
    monkeypatch.setattr(gpu.importlib.util, "find_spec", lambda name: None if name == module else found(name))


def test_the_scoring_figures_are_skipped_without_the_manifest_decoder_saying_how_to_install_it(
    tmp_path, monkeypatch
):
    """A GPU machine with torch alone has no mashumaro, which loading a bundle needs: the step says so
    before it writes a table, instead of failing after."""
    monkeypatch.setattr(gpu_scoring, "require_cuda", lambda: None)
    as_if_not_installed(monkeypatch, "mashumaro")
    with pytest.raises(gpu.Skipped, match=r"mashumaro not installed \(loading a bundle .*--no-index"):
        gpu_scoring.scoring_on_gpu(tmp_path, gpu.SMOKE)
    assert not list(tmp_path.iterdir())


def test_only_runs_the_steps_named_and_skips_the_others_saying_so(tmp_path, capsys):
    assert gpu_check.main(["--only", "figures,check"], steps=STEPS) == 0
    written = capsys.readouterr().out
    assert re.search(r"\| check ok \| pass \| [\d.]+ \| all good \|", written)
    assert re.search(r"\| skipped \| skipped \| [\d.]+ \| not selected \(--only figures,check\) \|", written)
    assert "steps: 2 passed, 0 failed, 1 skipped" in written


def hand_made_profile(trace_dir) -> ProfileSummary:
    return ProfileSummary(optimizer_steps=64, wall_s=2.0, device_busy_s=0.5, kernel_launches_per_step=120,
                          host_syncs_per_step=0.0, host_sync_wait_s=0.0, matmul_share=0.7, on_device=True)  # fmt: skip


def missed_and_met(profile) -> list[gpu_check.Step]:
    return [
        gpu_check.Step("missed", lambda: [figure(5, 10, low=0.9)], profile),
        gpu_check.Step("met", lambda: [figure(10, 10, low=0.9)], profile),
    ]


@pytest.mark.parametrize("when, profiled", [("missed", ["missed"]), ("all", ["missed", "met"]), ("none", [])])
def test_a_timed_step_is_profiled_when_its_goal_is_missed_or_when_asked(when, profiled, tmp_path, capsys):
    assert (
        gpu_check.main(
            ["--profile", when, "--json", str(tmp_path / "r.json")], steps=missed_and_met(hand_made_profile)
        )
        == 0
    )
    out = capsys.readouterr().out
    assert [name for name in ("missed", "met") if f"profile of {name}:" in out] == profiled
    written = {
        step["name"]: step["profile"] for step in json.loads((tmp_path / "r.json").read_text())["steps"]
    }
    assert [name for name, profile in written.items() if profile] == profiled
    for name in profiled:
        assert written[name]["verdict"].startswith("launch-bound: the device is busy 25% of the time")
        assert written[name]["kernel_launches_per_step"] == 120


def test_a_profile_that_fails_leaves_the_figures_standing(capsys):
    def broken(trace_dir):
        raise RuntimeError("CUPTI is not available")

    (result,) = gpu_check.run_all(missed_and_met(broken)[:1])
    assert result.status == gpu_check.PASS and result.figures
    assert result.profile["error"] == "RuntimeError: CUPTI is not available"
    assert "profile: profile failed: CUPTI is not available" in capsys.readouterr().out


@pytest.mark.slow
def test_the_loop_figures_profile_the_project_loop_on_their_own_table(tmp_path):
    """The profile the loop steps take: the project loop on the figure's own table (a cost an epoch
    shows at full size only), its parts timed, its trace written where asked."""
    sizes = replace(gpu.SMOKE, rows=4096, batch=64, hidden=(16,), features=8)
    work = gpu.Workspace(tmp_path, sizes)
    steps = {s.name: s for s in gpu_check.gpu_steps(work, 1e15)}
    summary = steps["figure: project loop vs bare loop"].profile(tmp_path / "traces")
    assert summary.optimizer_steps == sizes.rows // sizes.batch
    assert [part.calls for part in summary.loop_parts] == [1, 1, 1]  # one epoch: its order, its end
    assert (tmp_path / "traces" / "project-loop-bf16.json").stat().st_size > 0
    assert not (tmp_path / "profile-train.parquet").exists()  # the cut table is written only when used
