"""The GPU check's trials sharing one GPU: four small tuning trials at once against one after another.

A study plans each trial onto the cheapest catalog option that holds it (`plan_training`). A small
trial gets a MIG slice, a fraction of one GPU priced as its share (a whole H200 holds seven 1g
slices), so one GPU can hold several trials at once. This step plans four trials that differ as a
study's do (the MLP's width), runs them one after another and then all four at once, each in a
process of its own with its allocator capped at its planned option's memory, and reports the
training throughput of the four at once against one after another, and each trial's measured peak
(`torch.cuda.max_memory_allocated`) against its option's memory.

The packing holds when the planned options together fit in the GPU's memory, every trial finished
under its cap without running out of memory (its micro-batch kept) and learned, each measured peak
is within its option's memory, and the four at once trained at least as many samples a second as
one after another: processes sharing the GPU pay. A trial that failed, ran out of memory or learned
nothing fails the step; a missed ratio is reported.

`python -m benchmarks.gpu_trials --trial JSON --result PATH` is the worker: one trial trained in its
own process, its figures written as JSON. Nothing here imports flytekit when imported; the
planner's catalog (tasks/catalog.py) needs it, and the step is skipped without it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from benchmarks.gpu_figures import (
    GIB,
    MIN_ACCURACY,
    GpuFigure,
    Sizes,
    expect,
    require_cuda,
    require_modules,
    table_rows,
)
from benchmarks.measure import REPO
from benchmarks.synthetic import synthetic_splits
from tasks.core.data.splits import SplitPaths
from tasks.core.models.plugins import measure_footprint, mlp_options, mlp_spec
from tasks.core.planning.planner import CatalogEntry, Workload, plan_training
from tasks.core.training import torch_training
from tasks.core.training.config import TrainConfig

TRIAL_WIDTHS = (64, 128, 256, 512)  # one trial each: two hidden layers this wide
TRIAL_ROWS = 200_000  # at full size; fewer where the check's training rows are fewer (--smoke)
TRIAL_FEATURES = 64
TRIAL_EPOCHS = 3
TRIAL_BATCH = 512  # a study's small batch: each trial leaves most of the GPU idle
TRIAL_TIMEOUT_S = 300  # a trial takes seconds; one that hangs must not hold up the other steps
LOG_TAIL_CHARS = 2000
CATALOG_NEEDS = (
    "the planner's catalog, tasks/catalog.py, imports it; `make gpu-wheels` builds the wheels "
    "`make gpu-check` installs it from"
)


@dataclass(frozen=True)
class Device:
    """The GPU the trials share: its name, its memory, and the device type its trials must train on."""

    name: str
    memory_bytes: int
    type: str = "cuda"


@dataclass(frozen=True)
class PlannedTrial:
    """One trial as the planner placed it: its config (the plan's accumulation and row placement
    applied), the option chosen, that option's memory and the planner's estimated peak."""

    name: str
    config: TrainConfig
    option: str
    option_memory_gib: float
    estimated_peak_gib: float
    table: str  # the training table's shape, for the figures' names


def this_gpu() -> Device:
    props = torch.cuda.get_device_properties(0)
    return Device(props.name, props.total_memory)


def trial_rows(sizes: Sizes) -> int:
    return min(TRIAL_ROWS, sizes.rows)


def trial_configs() -> list[TrainConfig]:
    """A study's trials: the same data and batch, networks of different widths."""
    return [
        TrainConfig(epochs=TRIAL_EPOCHS, batch_size=TRIAL_BATCH, model=mlp_spec([width, width]), precision="bf16")
        for width in TRIAL_WIDTHS
    ]  # fmt: skip


def widths(config: TrainConfig) -> str:
    return "x".join(map(str, mlp_options(config.model.options)[0]))


def trial_splits(root: Path, rows: int) -> SplitPaths:
    return synthetic_splits(root, "trials", rows, TRIAL_FEATURES)


def catalog_for(gpu_name: str) -> list[CatalogEntry]:
    """The options a study could place trials on with this GPU: its MIG slices and the whole GPU,
    or every GPU option for a GPU the catalog does not know by name."""
    from tasks.catalog import GPU_OPTIONS
    from tasks.hardware import H100_80GB, H200_141GB

    for family, device in (("H200", H200_141GB.device), ("H100", H100_80GB.device)):
        if family in gpu_name:
            return [entry for entry in GPU_OPTIONS if entry.device == device]
    return list(GPU_OPTIONS)


def plan_trial(config: TrainConfig, splits: SplitPaths, catalog: list[CatalogEntry]) -> PlannedTrial:
    """The cheapest option that holds the trial, as the tuning workflow plans it (tasks/right_sizing.py)."""
    footprint = measure_footprint(
        config.model, len(splits.feature_names), splits.n_outputs, "pytorch", config.precision
    )
    workload = Workload(footprint, config.batch_size, config.grad_accum_steps, table_rows(splits.train),
                        table_rows(splits.val), "pytorch", config.min_micro_batch_size, config.data_placement)  # fmt: skip
    plan = plan_training(workload, catalog)
    planned = replace(config, grad_accum_steps=plan.grad_accum_steps, data_placement=plan.data_placement)
    table = f"{workload.train_rows:,} rows x {len(splits.feature_names)} features"
    return PlannedTrial(f"MLP {widths(config)}", planned, plan.choice.name, plan.choice.memory_gib,
                        plan.estimated_peak_gib, table)  # fmt: skip


def memory_fraction(trial: PlannedTrial, device: Device) -> float | None:
    """The share of the GPU's memory the trial's allocator may hold: its option's (None off CUDA)."""
    if device.type != "cuda":
        return None
    return min(trial.option_memory_gib * GIB / device.memory_bytes, 1.0)


def train_trial(config: TrainConfig, splits: SplitPaths, fraction: float | None) -> dict:
    """One trial in this process, its allocator capped at `fraction` of the GPU (where there is one)."""
    if fraction is not None and torch.cuda.is_available():
        torch.cuda.set_per_process_memory_fraction(fraction)
    started = time.time()  # the wall clock: the trials run at once compare their spans across processes
    outcome = torch_training.train(config, splits)
    ended = time.time()
    run = outcome.run
    return {
        "samples": outcome.optimizer_steps * config.batch_size,
        "samples_per_second": run.samples_per_second,
        "train_seconds": run.train_seconds,
        "wall_seconds": ended - started,
        "started": started,
        "ended": ended,
        "peak_bytes": run.peak_device_memory_bytes,
        "val_accuracy": run.history[-1].val_accuracy,
        "micro_batch_size": outcome.micro_batch_size,
        "device_type": run.device_type,
        "device_name": run.device_name,
    }


def trial_arguments(config: TrainConfig, splits: SplitPaths, fraction: float | None) -> str:
    return json.dumps({"config": asdict(config), "splits": asdict(splits), "memory_fraction": fraction})


def main(argv: list[str] | None = None) -> int:
    """The worker: `--trial` as `trial_arguments` writes it; the result goes to `--result`."""
    parser = argparse.ArgumentParser(description="One tuning trial of the GPU check, in this process.")
    parser.add_argument(
        "--trial", required=True, help="the trial's config, splits and memory fraction (JSON)"
    )
    parser.add_argument("--result", required=True, type=Path, help="where to write the result (JSON)")
    args = parser.parse_args(argv)
    trial = json.loads(args.trial)
    config = TrainConfig.from_json(json.dumps(trial["config"]))
    result = train_trial(config, SplitPaths(**trial["splits"]), trial["memory_fraction"])
    args.result.write_text(json.dumps(result))
    return 0


@dataclass
class TrialProcess:
    """A worker started on one trial: its output goes to `log`, its result to `result`."""

    process: subprocess.Popen
    log: Path
    result: Path

    def finish(self, deadline: float) -> dict:
        """The worker's result with its exit code and the end of its log; {} of a result where it
        failed. A worker still running at `deadline` (time.monotonic) is killed."""
        try:
            code = self.process.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        found = json.loads(self.result.read_text()) if code == 0 and self.result.exists() else {}
        tail = self.log.read_text(errors="replace")[-LOG_TAIL_CHARS:] if self.log.exists() else ""
        return {"exit_code": code, "log_tail": tail, **found}


def start_trial(trial: PlannedTrial, splits: SplitPaths, device: Device, folder: Path) -> TrialProcess:
    folder.mkdir(parents=True, exist_ok=True)
    log, result = folder / "trial.log", folder / "result.json"
    command = [sys.executable, "-m", "benchmarks.gpu_trials", "--result", str(result),
               "--trial", trial_arguments(trial.config, splits, memory_fraction(trial, device))]  # fmt: skip
    # To a file, not a pipe: a worker whose pipe filled would stall while the others trained.
    with log.open("w") as output:
        process = subprocess.Popen(command, cwd=REPO, stdout=output, stderr=subprocess.STDOUT)
    return TrialProcess(process, log, result)


def run_together(trials: list[PlannedTrial], splits: SplitPaths, device: Device, folder: Path) -> list[dict]:
    """The trials' workers started together, each capped at its option's memory; their results in order."""
    started = [start_trial(trial, splits, device, folder / f"trial-{i}") for i, trial in enumerate(trials)]
    deadline = time.monotonic() + TRIAL_TIMEOUT_S
    return [worker.finish(deadline) for worker in started]


def expect_packed(trials: list[PlannedTrial], device: Device) -> None:
    """The options the planner chose fit together in the GPU's memory."""
    planned = sum(trial.option_memory_gib for trial in trials)
    options = ", ".join(trial.option for trial in trials)
    expect(planned * GIB <= device.memory_bytes,
           f"the planned options ({options}) need {planned:.1f} GiB together, more than the "
           f"{device.memory_bytes / GIB:.1f} GiB of {device.name}: the trials do not pack onto it")  # fmt: skip


def expect_trained(trial: PlannedTrial, result: dict, run: str, device: Device) -> None:
    """The trial finished, on the GPU, under its cap without running out of memory, and learned."""
    what = f"trial {trial.name} ({run}, capped at {trial.option}'s {trial.option_memory_gib:g} GiB)"
    expect(result["exit_code"] == 0, f"{what} exited {result['exit_code']}: {result['log_tail']}")
    expect(
        result["device_type"] == device.type, f"{what} trained on {result['device_type']}, not {device.type}"
    )
    micro = trial.config.micro_batch_size(1)
    expect(result["micro_batch_size"] == micro,
           f"{what} ran out of memory: micro-batch {micro} -> {result['micro_batch_size']}")  # fmt: skip
    accuracy = result["val_accuracy"]
    expect(accuracy >= MIN_ACCURACY, f"{what}: validation accuracy {accuracy:.3f} < {MIN_ACCURACY}")


def span_seconds(results: list[dict]) -> float:
    """From the first trial's start to the last one's end."""
    return max(result["ended"] for result in results) - min(result["started"] for result in results)


def samples_per_second(results: list[dict], seconds: float) -> float:
    return sum(result["samples"] for result in results) / seconds


def packing_figures(
    trials: list[PlannedTrial], one_after_another: list[dict], at_once: list[dict], device: Device
) -> list[GpuFigure]:
    """The trials' results judged: the throughput of the trials at once against one after another,
    and each trial's measured peak against its planned option's memory."""
    for trial, alone, shared in zip(trials, one_after_another, at_once, strict=True):
        expect_trained(trial, alone, "one after another", device)
        expect_trained(trial, shared, f"{len(trials)} at once", device)
    # Each side's time training: one after another, the trials' own spans added (not their
    # processes' start-up); at once, the one span that holds them all.
    sequential = samples_per_second(one_after_another, sum(span_seconds([r]) for r in one_after_another))
    concurrent = samples_per_second(at_once, span_seconds(at_once))
    first, last = trials[0].config, trials[-1].config
    what = (f"{trials[0].table}, MLPs {widths(first)} to {widths(last)}, batch {first.batch_size}, "
            f"{first.epochs} epochs, each capped at its planned option's memory")  # fmt: skip
    figures = [
        GpuFigure(f"{len(trials)} trials sharing {device.name} at once vs one after another, training "
                  f"samples/s ({what})", concurrent, sequential, "samples/s", low=1.0),
    ]  # fmt: skip
    for trial, alone, shared in zip(trials, one_after_another, at_once, strict=True):
        peak = max(alone["peak_bytes"], shared["peak_bytes"]) / GIB
        name = (f"trial {trial.name} on its planned {trial.option} (planner's estimate "
                f"{trial.estimated_peak_gib:.2f} GiB): measured peak of its two runs vs the option's memory")  # fmt: skip
        figures.append(GpuFigure(name, peak, trial.option_memory_gib, "GiB", high=1.0))
    return figures


def trials_on(device: Device, root: Path, sizes: Sizes) -> list[GpuFigure]:
    """The step on `device`: the trials planned, run one after another, then all at once, judged."""
    splits = trial_splits(root, trial_rows(sizes))
    catalog = catalog_for(device.name)
    trials = [plan_trial(config, splits, catalog) for config in trial_configs()]
    expect_packed(trials, device)
    # One round of each: a round takes most of a minute, and the GPU check's time is short.
    one_after_another = [
        run_together([trial], splits, device, root / f"alone-{i}")[0] for i, trial in enumerate(trials)
    ]
    at_once = run_together(trials, splits, device, root / "at-once")
    return packing_figures(trials, one_after_another, at_once, device)


def trials_sharing_gpu(root: Path, sizes: Sizes) -> list[GpuFigure]:
    require_cuda()
    require_modules(("flytekit", CATALOG_NEEDS))
    return trials_on(this_gpu(), root, sizes)


if __name__ == "__main__":
    sys.exit(main())
