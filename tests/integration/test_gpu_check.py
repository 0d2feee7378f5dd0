"""`make gpu-check` on a machine without CUDA, in processes of its own: every step skipped saying why,
the summary printed, nothing imported that needs flytekit, its pytest step failing where the CUDA tests
only skip, and its DDP steps' workers training over gloo (the logic that judges figures and checks:
tests/unit/benchmarks/test_gpu_check.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from benchmarks import gpu_check
from benchmarks import gpu_figures as gpu
from benchmarks.measure import REPO
from tasks.core.models.plugins import mlp_spec
from tasks.core.training.config import TrainConfig
from tests.unit.benchmarks.test_gpu_check import (  # noqa: F401 - the autouse fixture
    STEP_NAMES,
    no_cuda,
    no_full_collection_between_steps,
)

# The GPU check's harness run in processes of its own: heavy, as the unit module is (`HEAVY_MODULES` in
# tests/conftest.py).

# What the minimal GPU machine lacks: a module set to None in sys.modules cannot be imported.
UNIMPORTABLE = ["flytekit", "flytekitplugins", "pytest", "psutil", "pynvml", "tensorflow"]


def run_gpu_check(*args: str, blocked: list[str] = ()) -> subprocess.CompletedProcess:
    code = (
        "import sys\n"
        f"for name in {list(blocked)!r}:\n"
        "    sys.modules[name] = None\n"
        "from benchmarks.gpu_check import main\n"
        f"code = main({list(args)!r})\n"
        "print('IMPORTED', sorted(m for m in sys.modules if m.startswith(('tasks.', 'benchmarks.'))))\n"
        "sys.exit(code)\n"
    )
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@no_cuda
def test_runs_without_flytekit_pytest_and_nvml_and_without_cuda_skips_every_step_saying_why(tmp_path):
    """As on a bare GPU machine, less its GPU: none of the blocked modules is needed, and the summary
    and its JSON say why each step was skipped."""
    report = tmp_path / "gpu-check.json"
    done = run_gpu_check("--smoke", "--json", str(report), blocked=UNIMPORTABLE)
    assert done.returncode == 0, done.stderr
    assert "== gpu-check summary ==" in done.stdout
    assert "device: no CUDA device" in done.stdout
    assert f"torch: {torch.__version__}" in done.stdout
    for name in STEP_NAMES:
        assert re.search(
            rf"\| {re.escape(name)} \| skipped \| [\d.]+ \| {re.escape(gpu.NO_CUDA)} \|", done.stdout
        )
    assert f"steps: 0 passed, 0 failed, {len(STEP_NAMES)} skipped" in done.stdout
    written = json.loads(report.read_text())
    assert written["exit_code"] == 0 and written["machine"]["device"] == "no CUDA device"
    assert [(s["name"], s["status"], s["detail"]) for s in written["steps"]] == [
        (name, "skipped", gpu.NO_CUDA) for name in STEP_NAMES
    ]
    imported = done.stdout.split("IMPORTED", 1)[1]
    # Every module the GPU steps run was imported, so none of them needs what was blocked.
    for module in (
        "benchmarks.gpu_figures",
        "tasks.core.training.torch_training",
        "tasks.core.models.memory",
        "benchmarks.loop_bench",
        "benchmarks.gpu_scoring",
        "tasks.core.scoring.piece",
    ):
        assert f"'{module}'" in imported


def test_a_blocked_module_really_fails_to_import():
    done = run_gpu_check("--smoke", blocked=["torch"])
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr


@pytest.mark.slow
def test_the_cuda_test_modules_run_without_flytekit():
    """The GPU machine has no Flyte: the modules holding CUDA tests, the fixtures they use and
    conftest.py must work without it. Here their CPU tests run (the CUDA ones skip) with flytekit
    unimportable."""
    code = (
        "import sys; sys.modules['flytekit'] = None; import pytest; "
        f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-p', 'no:xdist', *{gpu_check.cuda_test_files()!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert re.search(r"\d+ passed", done.stdout), done.stdout[-3000:]


@pytest.mark.slow
@no_cuda
def test_the_pytest_step_fails_when_its_cuda_tests_only_skip(monkeypatch):
    """Its pytest run, on CPU: the marked tests are selected, and their skipping is no pass."""
    monkeypatch.setattr(gpu, "require_cuda", lambda: None)
    result = gpu_check.run_step(gpu_check.Step("tests", gpu_check.cuda_tests))
    assert result.status == gpu_check.FAIL
    assert re.search(r"not every CUDA test ran: \d+ skipped", result.detail), result.detail


@pytest.mark.slow
def test_the_one_rank_group_runs_the_project_loop_as_ddp_on_gloo(tmp_path):
    """The NCCL step's worker, on CPU: the project's loop takes a group of one as distributed."""
    splits = gpu.Workspace(tmp_path, gpu.SMOKE).memory_splits
    config = TrainConfig(epochs=2, batch_size=512, grad_accum_steps=2, model=mlp_spec([32]))
    run = gpu.launch_workers(gpu.train_on_one_rank_group, config, splits, "gloo")[0]
    assert gpu.ddp_finding(run, config, backend="gloo").startswith("DDP over gloo, 1 rank on cpu")


@pytest.mark.slow
def test_the_two_rank_worker_trains_ddp_over_gloo_in_step(tmp_path):
    """The two-rank step's workers, on CPU and uncapped: they train in step over gloo, and without an
    out-of-memory error the check says so."""
    splits = gpu.Workspace(tmp_path, gpu.SMOKE).memory_splits
    config = TrainConfig(epochs=1, batch_size=1024, model=mlp_spec([32]))
    ranks = gpu.launch_workers(gpu.train_two_ranks_on_one_gpu, config, splits, 1, None, nproc=2)
    assert [run["backend"] for run in ranks] == ["gloo", "gloo"]
    with pytest.raises(gpu.CheckFailed, match="no out-of-memory error: the per-rank micro-batch 512 fit"):
        gpu.collective_guard_finding(ranks, config, expected_steps=gpu.table_rows(splits.train) // 1024)
