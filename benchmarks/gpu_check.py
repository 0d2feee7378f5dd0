"""`python -m benchmarks.gpu_check [--smoke] [--json PATH]` (`make gpu-check`): the CUDA code paths on a GPU.

Runs every CUDA-only check and the GPU figures, each figure as a ratio against a baseline measured
in the same run, and prints one summary: the device, torch and CUDA versions, the figures against
their goals, every check as passed, failed or skipped with the reason. Exits non-zero when a check
fails; a missed goal is reported, not a failure. Without CUDA every step is skipped, saying so.

Needs only torch, numpy, pandas, pyarrow and scikit-learn, and no install of this project: nothing
it imports needs flytekit. The CUDA-only pytest tests (which import no flytekit either) run where
pytest is installed; the NVML check where nvidia-ml-py is.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from textwrap import indent

import torch

from benchmarks import gpu_figures as gpu
from benchmarks import gpu_pipeline, gpu_scoring, gpu_trials
from benchmarks.gpu_profile import ProfileSummary, profile_training
from benchmarks.gpu_wheels import use_carried_wheels
from benchmarks.measure import REPO
from tasks.core.data.splits import SplitPaths
from tasks.core.training.config import TrainConfig

PASS, FAIL, SKIPPED = "pass", "FAIL", "skipped"


# When a timed step's project run is profiled: after a missed goal, always, or never.
PROFILE_WHEN = ("missed", "all", "none")


@dataclass
class Step:
    name: str
    run: Callable[[], str | list[gpu.GpuFigure]]  # a check's finding, or a figure step's figures
    # A timed step's project run under torch.profiler (given where to write its trace, or None).
    profile: Callable[[Path | None], ProfileSummary] | None = None


@dataclass
class Result:
    name: str
    status: str
    detail: str = ""
    figures: list[gpu.GpuFigure] = field(default_factory=list)
    seconds: float = 0.0
    profile: dict | None = None  # ProfileSummary.to_json() and its text, or the error that stopped it


def outcome_of(step: Step) -> Result:
    try:
        found = step.run()
    except gpu.Skipped as reason:
        return Result(step.name, SKIPPED, str(reason))
    except Exception as error:  # reported, and the other steps still run
        return Result(step.name, FAIL, f"{type(error).__name__}: {error}")
    finally:
        gpu.release_device_memory()
    if isinstance(found, str):
        return Result(step.name, PASS, found)
    return Result(step.name, PASS, f"{len(found)} figure(s)", list(found))


def wants_profile(step: Step, result: Result, when: str) -> bool:
    missed = any(figure.met is False for figure in result.figures)
    return (
        step.profile is not None
        and result.status == PASS
        and (when == "all" or (when == "missed" and missed))
    )


def profile_of(step: Step, trace_dir: Path | None) -> dict:
    """What limits the step's project run, from torch.profiler: the verdict, the numbers, the top ops."""
    try:
        summary = step.profile(trace_dir)
    except Exception as error:  # the figures stand without it
        return {"error": f"{type(error).__name__}: {error}", "text": f"profile failed: {error}"}
    finally:
        gpu.release_device_memory()
    return {**summary.to_json(), "text": summary.text()}


def run_step(step: Step, profile_when: str = "missed", trace_dir: Path | None = None) -> Result:
    start = time.perf_counter()
    result = outcome_of(step)
    if wants_profile(step, result, profile_when):
        result.profile = profile_of(step, trace_dir)
    result.seconds = time.perf_counter() - start
    return result


def selected(steps: list[Step], only: list[str]) -> list[Step]:
    """The steps whose names contain one of `only` (all where it is empty); the others are skipped,
    saying so, so that a long check can be run in parts."""

    def not_selected() -> str:
        raise gpu.Skipped(f"not selected (--only {','.join(only)})")

    chosen = [step for step in steps if not only or any(part in step.name for part in only)]
    return [step if step in chosen else Step(step.name, not_selected) for step in steps]


def run_all(
    steps: list[Step],
    profile_when: str = "missed",
    trace_dir: Path | None = None,
    after_each: Callable[[list[Result]], None] = lambda results: None,
) -> list[Result]:
    """Each step in turn, its result printed; `after_each` is given the results so far after every step."""
    results = []
    for step in steps:
        result = run_step(step, profile_when, trace_dir)
        print(f"[{result.status}] {result.name} ({result.seconds:.1f} s): {result.detail}", flush=True)
        for figure in result.figures:
            print(f"    {figure.line()}", flush=True)
        if result.profile:
            print(indent(result.profile["text"], "    profile: "), flush=True)
        results.append(result)
        after_each(results)
    return results


def exit_code(results: list[Result]) -> int:
    return 1 if any(result.status == FAIL for result in results) else 0


def cuda_test_files() -> list[str]:
    """The test modules holding tests marked `cuda`."""
    tests = sorted((REPO / "tests").rglob("test_*.py"))
    return [str(path.relative_to(REPO)) for path in tests if "pytest.mark.cuda" in path.read_text()]


def cuda_tests() -> str:
    """The CUDA-only pytest tests (`-m cuda`), in a child process."""
    gpu.require_cuda()
    gpu.require_modules(("pytest", "the other steps check the same without it"))
    files = cuda_test_files()
    gpu.expect(bool(files), "no test module holds a test marked cuda")
    command = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", *files]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    last = (done.stdout.strip().splitlines() or ["no output"])[-1]
    gpu.expect(done.returncode == 0, f"pytest exited {done.returncode}: {last}\n{done.stdout[-4000:]}")
    gpu.expect("passed" in last and "skipped" not in last, f"not every CUDA test ran: {last}")
    return f"{', '.join(files)}: {last}"


def profiled(
    splits: Callable[[], SplitPaths], config: TrainConfig, name: str
) -> Callable[[Path | None], ProfileSummary]:
    """The project loop with `config` under the profiler, on the table `splits` writes (when first needed)."""
    return lambda trace_dir: profile_training(config, splits(), trace_dir=trace_dir, name=name)


def gpu_steps(work: gpu.Workspace, peak_flops: float) -> list[Step]:
    sizes = work.sizes
    # The loop figure's own table: a cost an epoch shows at full size, not on a cut table, where the
    # run's first steps are most of it.
    loop = profiled(lambda: work.loop_splits, gpu.loop_config(sizes), "project-loop-bf16")
    return [
        Step("autocast precision on CUDA", gpu.autocast_precision),
        Step("CUDA-only pytest tests", cuda_tests),
        Step("figure: project loop vs bare loop", lambda: gpu.loop_vs_bare(work.loop_splits, sizes), loop),
        Step("figure: bf16 autocast vs fp32", lambda: gpu.bf16_vs_fp32(work.loop_splits, sizes), loop),
        Step("figure: model FLOP utilisation",
             lambda: gpu.flop_utilisation(work.loop_splits, sizes, peak_flops),
             profiled(lambda: work.profile_splits, gpu.mfu_config(sizes), "model-flop-utilisation")),
        Step("figure: memory estimate vs measured peak", lambda: gpu.memory_estimate(work.memory_splits, sizes)),
        Step("fp16 autocast with the gradient scaler", lambda: gpu.fp16_with_scaler(work.memory_splits)),
        Step("out-of-memory guard on a real CUDA OOM", lambda: gpu.oom_guard(work.memory_splits, sizes)),
        Step("out-of-memory guard, two ranks sharing the GPU",
             lambda: gpu.collective_oom_guard(work.memory_splits, sizes)),
        Step("single-GPU DDP over NCCL, end to end", lambda: gpu.nccl_ddp(work.memory_splits)),
        Step("figure: scoring on the GPU vs the CPU", lambda: gpu_scoring.scoring_on_gpu(work.root, sizes)),
        Step("NVML telemetry", gpu.nvml_telemetry),
        Step("pyflyte run of the pipeline on the GPU: embedded digits", lambda: gpu_pipeline.embedded_digits(work.root)),
        Step("figure: pyflyte run of the pipeline on the GPU, large table",
             lambda: gpu_pipeline.large_table(work.root, sizes)),
        Step("figure: trials sharing one GPU", lambda: gpu_trials.trials_sharing_gpu(work.root, sizes)),
    ]  # fmt: skip


def nvml_driver_version() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
    except Exception:  # no NVML library, no driver: the summary just omits it
        return ""
    return version.decode() if isinstance(version, bytes) else str(version)


def describe_machine() -> dict[str, str]:
    machine = {"device": "no CUDA device"}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        machine["device"] = (
            f"{props.name}, {props.total_memory / 2**30:.0f} GiB ({torch.cuda.device_count()} visible)"
        )
    machine["torch"] = torch.__version__
    machine["cuda"] = torch.version.cuda or "none (a CPU build of torch)"
    if torch.cuda.is_available() and torch.distributed.is_nccl_available():
        version = torch.cuda.nccl.version()  # (major, minor, patch); a number in older torch releases
        machine["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    machine["driver"] = nvml_driver_version() or "unknown (no NVML)"
    machine["python"] = platform.python_version()
    return machine


def number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3f}"


def figure_row(figure: gpu.GpuFigure) -> str:
    met = {True: "met", False: "MISSED", None: ""}[figure.met]
    return (
        f"| {figure.name} | {number(figure.value)} {figure.unit} | {number(figure.baseline)} {figure.unit} "
        f"| {figure.ratio:.3f} | {figure.goal} | {met} |"
    )


def summary(machine: dict[str, str], results: list[Result]) -> str:
    figures = [figure for result in results for figure in result.figures]
    counts = {status: sum(result.status == status for result in results) for status in (PASS, FAIL, SKIPPED)}
    goals = [figure.met for figure in figures if figure.met is not None]
    lines = ["", "== gpu-check summary ==", *(f"{key}: {value}" for key, value in machine.items()), ""]
    lines += ["| figure | value | baseline | ratio | goal | goal met |", "|---|---|---|---|---|---|"]
    lines += [figure_row(figure) for figure in figures] or ["| (no figure taken) | | | | | |"]
    lines += ["", "| step | result | seconds | detail |", "|---|---|---|---|"]
    lines += [
        f"| {r.name} | {r.status} | {r.seconds:.1f} | {r.detail.splitlines()[0] if r.detail else ''} |"
        for r in results
    ]
    for result in results:
        if result.profile:
            lines += ["", f"profile of {result.name}:", result.profile["text"]]
    lines += [
        "",
        f"steps: {counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIPPED]} skipped; "
        f"goals: {sum(goals)} met, {len(goals) - sum(goals)} missed",
    ]
    return "\n".join(lines)


def as_json(machine: dict[str, str], results: list[Result]) -> dict:
    def figure(f: gpu.GpuFigure) -> dict:
        return {**f.__dict__, "ratio": f.ratio, "met": f.met}

    steps = [{**r.__dict__, "figures": [figure(f) for f in r.figures]} for r in results]
    return {"machine": machine, "steps": steps, "exit_code": exit_code(results)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="small sizes: checks the harness, not the GPU")
    parser.add_argument("--json", help="also write the machine, the figures and the steps to this file")
    parser.add_argument(
        "--rows", type=int, help=f"training rows of the loop figures (default {gpu.FULL.rows:,})"
    )
    parser.add_argument(
        "--rounds", type=int, help=f"alternating rounds per figure (default {gpu.FULL.rounds})"
    )
    parser.add_argument(
        "--only",
        default="",
        help="run only the steps whose names contain one of these comma-separated words (e.g. 'figure:,NCCL')",
    )
    parser.add_argument(
        "--profile",
        choices=PROFILE_WHEN,
        default="missed",
        help="profile a timed step's project loop (torch.profiler) when a goal is missed (default), always, or never",
    )
    parser.add_argument("--trace-dir", type=Path, help="also write each profile's Chrome trace here")
    parser.add_argument(
        "--peak-bf16-flops",
        type=float,
        default=gpu.peak_bf16_flops(),
        help="the GPU's dense bf16 FLOP/s (default: MIXEDML_PEAK_BF16_FLOPS, else 989e12, H100/H200 SXM)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, steps: list[Step] | None = None) -> int:
    """`steps` replaces the GPU steps (the tests give their own)."""
    args = parse_args(argv)
    installed = use_carried_wheels()
    if installed:
        print(installed, flush=True)
    sizes = gpu.SMOKE if args.smoke else gpu.FULL
    overrides = {"rows": args.rows, "rounds": args.rounds}
    sizes = replace(sizes, **{key: value for key, value in overrides.items() if value})
    machine = describe_machine()

    def write_json(results: list[Result]) -> None:
        """After every step: a check stopped part way still leaves the steps it finished."""
        if args.json:
            Path(args.json).write_text(json.dumps(as_json(machine, results), indent=2))

    with tempfile.TemporaryDirectory(prefix="mixedml-gpu-check-") as tmp:
        work = gpu.Workspace(Path(tmp), sizes)
        chosen = steps if steps is not None else gpu_steps(work, args.peak_bf16_flops)
        only = [part for part in args.only.split(",") if part]
        results = run_all(selected(chosen, only), args.profile, args.trace_dir, write_json)
    print(summary(machine, results), flush=True)
    write_json(results)
    return exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
