"""The figures and checks of `benchmarks.gpu_check`: the CUDA code paths, measured on a real GPU.

A figure step returns `GpuFigure`s (a measurement, its baseline from the same run, a goal); a check
step returns a one-line finding. Either raises `Skipped` when it cannot run on this machine and
`CheckFailed` when what it checks is wrong. Nothing here imports flytekit.
"""

from __future__ import annotations

import gc
import importlib.util
import math
import os
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from benchmarks import loop_bench
from benchmarks.measure import Figure, alternating_best_rates
from benchmarks.synthetic import synthetic_splits
from tasks.core.data.splits import SplitPaths
from tasks.core.models.memory import ESTIMATE_HIGH, ESTIMATE_LOW
from tasks.core.models.plugins import measure_footprint, mlp_options, mlp_spec
from tasks.core.training import torch_ddp, torch_loop, torch_step, torch_training
from tasks.core.training.config import TrainConfig

NO_CUDA = "no CUDA device (torch.cuda.is_available() is False)"
# H100 / H200 SXM datasheet, dense (no sparsity); other GPUs: MIXEDML_PEAK_BF16_FLOPS.
DEFAULT_PEAK_BF16_FLOPS = 989e12
# The out-of-memory check caps the allocator at this multiple of the peak the calibration run
# measured: room for that micro-batch (and allocator rounding), not for four times it.
OOM_CAP_OVER_PEAK = 1.5
CAPPED_RANK = 1  # the rank that runs out of memory in the two-rank check; rank 0 has the GPU's memory
# Model FLOP utilisation goals: of the datasheet peak, and of what a bare matmul of the layer's size
# reaches on this GPU in the same run (the part of the gap that is the loop's, not the chip's).
MFU_OF_PEAK, MFU_OF_BARE_MATMUL = 0.50, 0.65
PROFILED_STEPS = 64  # optimizer steps a profiled run takes: enough for a steady state
MIN_ACCURACY = 0.9  # the synthetic clusters are far apart: any working loop gets there
GIB = 2**30


class Skipped(Exception):
    """The step cannot run on this machine; the message says why."""


class CheckFailed(Exception):
    """What the step checks is wrong; the message says how."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def require_cuda() -> None:
    if not torch.cuda.is_available():
        raise Skipped(NO_CUDA)


def require_modules(*modules: tuple[str, str]) -> None:
    """Skip unless each (module, why it is needed) is importable."""
    for module, why in modules:
        if importlib.util.find_spec(module) is None:
            raise Skipped(f"{module} not installed ({why})")


def goal_text(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"{low:g} <= ratio <= {high:g}"
    if low is not None:
        return f"ratio >= {low:g}"
    return f"ratio <= {high:g}" if high is not None else ""


@dataclass
class GpuFigure(Figure):
    """A figure whose goal is a range of its ratio: at least `low`, at most `high`."""

    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        self.goal = self.goal or goal_text(self.low, self.high)

    @property
    def met(self) -> bool | None:
        """None when the figure has no goal."""
        if self.low is None and self.high is None:
            return None
        ratio = self.ratio  # NaN (no baseline) meets no goal
        return (self.low is None or ratio >= self.low) and (self.high is None or ratio <= self.high)


@dataclass(frozen=True)
class Sizes:
    rows: int  # training rows of the loop figures, all held on the device
    features: int
    batch: int
    hidden: tuple[int, ...]
    mfu_hidden: int  # two layers this wide: a compute-bound model
    mfu_batch: int
    memory_rows: int  # the model-dominated runs: memory estimate, out-of-memory guard, fp16, NCCL
    memory_batch: int
    memory_hidden: int
    scoring_rows: int  # the table the GPU scores (the CPU side scores a tenth of it)
    rounds: int
    pipeline_rows: int = 4_000_000  # the table `pyflyte run` of the pipeline preprocesses and trains on


# 4M x 256 float32 features: about 4 GB on the device; a step is milliseconds, far past launch overhead.
FULL = Sizes(4_000_000, 256, 8192, (4096, 4096), 8192, 8192, 131_072, 16_384, 8192, 1_000_000, rounds=3)
SMOKE = Sizes(
    32_768, 64, 1024, (512, 512), 1024, 1024, 16_384, 2048, 2048, 40_960, rounds=1, pipeline_rows=32_768
)


def peak_bf16_flops() -> float:
    return float(os.environ.get("MIXEDML_PEAK_BF16_FLOPS", DEFAULT_PEAK_BF16_FLOPS))


class Workspace:
    """The synthetic tables, written under `root` when a step first needs them."""

    def __init__(self, root: Path, sizes: Sizes):
        self.root, self.sizes = root, sizes

    @cached_property
    def loop_splits(self) -> SplitPaths:
        return self._splits("loop", self.sizes.rows)

    @cached_property
    def memory_splits(self) -> SplitPaths:
        return self._splits("memory", self.sizes.memory_rows)

    @cached_property
    def profile_splits(self) -> SplitPaths:
        """The loop table's shape, cut to PROFILED_STEPS batches: a profile grows with the run."""
        return self._splits("profile", PROFILED_STEPS * self.sizes.batch)

    def _splits(self, name: str, rows: int) -> SplitPaths:
        return synthetic_splits(self.root, name, rows, self.sizes.features)


def table_rows(path: str) -> int:
    return pq.ParquetFile(path).metadata.num_rows


def release_device_memory() -> None:
    """Between steps: what one step left in the allocator's cache must not serve the next."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def learned(run, what: str) -> None:
    """A fast loop that learns nothing is no figure."""
    losses = [epoch.train_loss for epoch in run.history]
    expect(bool(losses) and all(map(math.isfinite, losses)), f"{what}: training losses {losses}")
    accuracy = run.history[-1].val_accuracy
    expect(accuracy >= MIN_ACCURACY, f"{what}: validation accuracy {accuracy:.3f} < {MIN_ACCURACY}")


def project_rate(splits: SplitPaths, config: TrainConfig) -> float:
    run = torch_training.train(config, splits).run
    learned(run, f"project loop, {config.precision}")
    return run.samples_per_second


def loop_config(sizes: Sizes, precision: str = "bf16") -> TrainConfig:
    return TrainConfig(
        epochs=1, batch_size=sizes.batch, model=mlp_spec(list(sizes.hidden)), precision=precision
    )


def shape(splits: SplitPaths, config: TrainConfig) -> str:
    rows, features = table_rows(splits.train), len(splits.feature_names)
    widths = "x".join(map(str, mlp_options(config.model.options)[0]))
    return f"{rows:,} rows x {features} features, MLP {widths}, batch {config.batch_size}"


def loop_vs_bare(splits: SplitPaths, sizes: Sizes) -> list[GpuFigure]:
    require_cuda()
    config = loop_config(sizes)
    project, bare = alternating_best_rates(
        lambda: project_rate(splits, config),
        lambda: loop_bench.bare_torch_samples_per_second(splits, config, device="cuda", amp=True),
        sizes.rounds,
    )
    name = f"torch loop on CUDA, bf16: project loop vs bare loop ({shape(splits, config)})"
    return [GpuFigure(name, project, bare, "samples/s", low=0.9)]


def bf16_vs_fp32(splits: SplitPaths, sizes: Sizes) -> list[GpuFigure]:
    require_cuda()
    bf16, fp32 = loop_config(sizes, "bf16"), loop_config(sizes, "fp32")
    rates = alternating_best_rates(
        lambda: project_rate(splits, bf16), lambda: project_rate(splits, fp32), sizes.rounds
    )
    name = f"project loop on CUDA: bf16 autocast vs fp32 ({shape(splits, bf16)})"
    return [GpuFigure(name, *rates, "samples/s", low=2.0)]


def matmul_flops(n: int, repeats: int = 50) -> float:
    """FLOP/s of a bare n x n x n bf16 matmul: what this GPU achieves without any model around it."""
    a, b, out = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for _ in range(3):
        torch.mm(a, b, out=out)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b, out=out)
    torch.cuda.synchronize()
    return 2.0 * n**3 * repeats / (time.perf_counter() - start)


def mfu_config(sizes: Sizes) -> TrainConfig:
    """A compute-bound MLP: two wide layers, no dropout."""
    return TrainConfig(
        epochs=1, batch_size=sizes.mfu_batch, model=mlp_spec([sizes.mfu_hidden] * 2, 0.0), precision="bf16"
    )


def flop_utilisation(splits: SplitPaths, sizes: Sizes, peak_flops: float) -> list[GpuFigure]:
    require_cuda()
    config = mfu_config(sizes)
    rate = max(project_rate(splits, config) for _ in range(sizes.rounds))
    flops_per_sample = loop_bench.model_flops_per_sample(
        len(splits.feature_names), [sizes.mfu_hidden] * 2, splits.n_classes
    )
    achieved = rate * flops_per_sample / 1e12
    matmul = matmul_flops(sizes.mfu_hidden) / 1e12
    what = f"model FLOP utilisation, project loop, bf16 ({shape(splits, config)})"
    return [
        GpuFigure(f"{what} vs the dense bf16 peak of {torch.cuda.get_device_name()}", achieved,
                  peak_flops / 1e12, "TFLOP/s", low=MFU_OF_PEAK),
        GpuFigure(f"{what} vs a bare {sizes.mfu_hidden}^3 bf16 matmul in this run", achieved, matmul, "TFLOP/s",
                  low=MFU_OF_BARE_MATMUL),
    ]  # fmt: skip


def memory_config(sizes: Sizes, precision: str, batch: int | None = None) -> TrainConfig:
    return TrainConfig(epochs=1, batch_size=batch or sizes.memory_batch, model=mlp_spec([sizes.memory_hidden] * 2, 0.1),
                       precision=precision)  # fmt: skip


def measured_peak(splits: SplitPaths, config: TrainConfig) -> int:
    """torch.cuda.max_memory_allocated over a run of the project loop, as the run reports it."""
    run = torch_training.train(config, splits).run
    expect(run.peak_device_memory_bytes > 0, "the run reported no peak device memory")
    return run.peak_device_memory_bytes


def memory_estimate(splits: SplitPaths, sizes: Sizes) -> list[GpuFigure]:
    """The planner's estimate against the allocator's peak, in full and in mixed precision."""
    require_cuda()
    resident = table_rows(splits.train) + table_rows(splits.val)
    figures = []
    for precision in ("fp32", "bf16"):
        config = memory_config(sizes, precision)
        measured = measured_peak(splits, config)
        # The footprint the planner sizes hardware by: parameters counted, activations probed on CPU.
        footprint = measure_footprint(
            config.model, len(splits.feature_names), splits.n_classes, "pytorch", precision
        )
        estimate = footprint.estimate(config.batch_size, resident_rows=resident)
        name = f"memory estimate vs torch.cuda.max_memory_allocated, {precision} ({shape(splits, config)})"
        figures.append(
            GpuFigure(
                name, estimate.tensor_bytes / GIB, measured / GIB, "GiB", low=ESTIMATE_LOW, high=ESTIMATE_HIGH
            )
        )
        release_device_memory()
    return figures


def autocast_precision() -> str:
    """What tests/unit/training/test_torch_training.py's CUDA test checks, without pytest."""
    require_cuda()
    cuda = torch.device("cuda")
    auto = torch_step.autocast_dtype(cuda, "auto")
    expected = torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    expect(auto == expected, f"precision 'auto' autocasts to {auto}, expected {expected}")
    expect(torch_step.autocast_dtype(cuda, "fp16") == torch.float16, "precision 'fp16' is not float16")
    expect(torch_step.autocast_dtype(cuda, "fp32") is None, "precision 'fp32' still autocasts")
    return f"auto -> {auto}, fp16 -> torch.float16, fp32 -> no autocast"


def fp16_with_scaler(splits: SplitPaths) -> str:
    """fp16 autocast with the gradient scaler, the path of GPUs without bf16."""
    require_cuda()
    config = TrainConfig(epochs=2, batch_size=1024, model=mlp_spec([512, 512]), precision="fp16")
    run = torch_training.train(config, splits).run
    expect(run.precision == "float16", f"the run trained in {run.precision}, not float16")
    learned(run, "fp16 with the gradient scaler")
    return f"2 epochs in float16 with the scaler, validation accuracy {run.history[-1].val_accuracy:.3f}"


@contextmanager
def memory_cap(cap_bytes: int):
    """Let the caching allocator hold at most `cap_bytes` of this GPU, so a large micro-batch
    really runs out of memory."""
    release_device_memory()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(cap_bytes / total, 1.0))
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        release_device_memory()


def guard_finding(outcome: torch_training.TrainOutcome, config: TrainConfig, expected_steps: int) -> str:
    """What a run that started with a micro-batch too large for the device must show."""
    micro, accum, batch = outcome.micro_batch_size, outcome.grad_accum_steps, config.batch_size
    expect(micro < batch, f"no out-of-memory error: micro-batch {batch} fit under the cap")
    expect(micro * accum == batch, f"the effective batch changed: {micro} x {accum} steps != {batch}")
    expect(
        outcome.optimizer_steps == expected_steps,
        f"{outcome.optimizer_steps} optimizer steps instead of {expected_steps}",
    )
    losses = [epoch.train_loss for epoch in outcome.run.history]
    expect(bool(losses) and all(map(math.isfinite, losses)), f"training losses {losses}")
    return (
        f"micro-batch {batch} -> {micro} after CUDA out-of-memory, {accum} accumulation steps: "
        f"effective batch {batch} kept, all {expected_steps} optimizer steps done"
    )


def oom_guard(splits: SplitPaths, sizes: Sizes) -> str:
    """A real torch.cuda.OutOfMemoryError in training, recovered by the loop's guard."""
    require_cuda()
    fits = memory_config(sizes, "bf16")
    cap = int(OOM_CAP_OVER_PEAK * measured_peak(splits, fits))
    config = memory_config(sizes, "bf16", batch=4 * fits.batch_size)
    with memory_cap(cap):
        outcome = torch_training.train(config, splits)
    steps = table_rows(splits.train) // config.batch_size * config.epochs
    return guard_finding(outcome, config, steps) + f" (allocator capped at {cap / GIB:.2f} GiB)"


@dataclass
class OneRankGroup(torch_training.DistributedContext):
    """A process group of one rank, which `DistributedContext` takes for no group at all."""

    @property
    def is_distributed(self) -> bool:
        return True


def train_on_one_rank_group(config: TrainConfig, splits: SplitPaths, backend: str = "nccl") -> dict:
    """Worker process: the project's `train` as DDP on a one-rank process group.

    The loop forms a process group only for more than one worker (one GPU needs none), so this
    worker joins a group of one and hands it to the loop: DDP's gradient all-reduce, `no_sync`
    under accumulation and the loop's own collectives then all run on `backend`.
    """
    plain = torch_training.init_distributed

    def one_rank_group(timeout_s: int) -> torch_training.DistributedContext:
        ctx = plain(timeout_s)  # picks and sets this worker's device
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        return OneRankGroup(ctx.rank, ctx.world_size, ctx.device, dist.get_backend())

    torch_training.init_distributed = one_rank_group
    try:
        outcome = torch_training.train(config, splits)
    finally:
        torch_ddp.shutdown_distributed()
    return {**asdict(outcome.run), "optimizer_steps": outcome.optimizer_steps}


def launch_workers(entrypoint, *args, nproc: int = 1) -> list:
    """`entrypoint(*args)` in `nproc` workers started as torchrun starts them; their results by rank."""
    launch = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id="gpu-check", rdzv_backend="c10d",
                          rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1, start_method="spawn")  # fmt: skip
    results = elastic_launch(launch, entrypoint)(*args)
    return [results[rank] for rank in range(nproc)]


def ddp_finding(run: dict, config: TrainConfig, backend: str = "nccl") -> str:
    expect(run["backend"] == backend, f"the run's backend is {run['backend']!r}, not {backend!r}")
    expect(len(run["history"]) == config.epochs, f"{len(run['history'])} epochs instead of {config.epochs}")
    losses = [epoch["train_loss"] for epoch in run["history"]]
    expect(all(math.isfinite(loss) for loss in losses), f"training losses {losses}")
    accuracy = run["history"][-1]["val_accuracy"]
    expect(accuracy >= MIN_ACCURACY, f"validation accuracy {accuracy:.3f} < {MIN_ACCURACY}")
    fast = run["optimizer_steps"] - torch_loop.GUARDED_STEPS
    expect(fast > 0, f"{run['optimizer_steps']} optimizer steps: the fast path (after the first "
                     f"{torch_loop.GUARDED_STEPS}, guarded) never ran")  # fmt: skip
    return (
        f"DDP over {backend}, {run['world_size']} rank on {run['device_name']}: {config.epochs} epochs with "
        f"{config.grad_accum_steps} accumulation steps, {fast} of {run['optimizer_steps']} optimizer steps "
        f"on DDP's overlapped fast path, validation accuracy {accuracy:.3f}"
    )


def nccl_ddp(splits: SplitPaths) -> str:
    """One worker started as torchrun starts it, training DDP over a one-rank NCCL group."""
    require_cuda()
    expect(dist.is_nccl_available(), "this torch build has no NCCL")
    config = TrainConfig(epochs=2, batch_size=2048, grad_accum_steps=2, model=mlp_spec([512, 512]))
    return ddp_finding(launch_workers(train_on_one_rank_group, config, splits, "nccl")[0], config)


def train_two_ranks_on_one_gpu(
    config: TrainConfig, splits: SplitPaths, capped_rank: int, cap_bytes: int | None
) -> dict:
    """Worker process: one of two ranks training DDP on the same GPU, `capped_rank`'s allocator held
    to `cap_bytes` (None: no cap, where there is no GPU to cap).

    Over gloo, which all-reduces CUDA tensors through host memory: NCCL refuses two ranks on one
    device ("Duplicate GPU detected", ncclInvalidUsage, at the communicator's set-up). The loop puts
    local rank 1 on device 1 modulo the device count, so both ranks share the one GPU.
    """
    plain = torch_training.init_distributed

    def gloo_group(timeout_s: int) -> torch_training.DistributedContext:
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
        return replace(plain(timeout_s), backend=dist.get_backend())

    torch_training.init_distributed = gloo_group
    capped = int(os.environ["RANK"]) == capped_rank and cap_bytes is not None
    try:
        with memory_cap(cap_bytes) if capped else nullcontext():
            outcome = torch_training.train(config, splits)
    finally:
        torch_ddp.shutdown_distributed()
    return {
        "backend": outcome.run.backend,
        "micro_batch_size": outcome.micro_batch_size,
        "grad_accum_steps": outcome.grad_accum_steps,
        "optimizer_steps": outcome.optimizer_steps,
        "losses": [epoch.train_loss for epoch in outcome.run.history],
        "parameters": [p.detach().cpu().numpy() for p in outcome.model.parameters()],
    }


def collective_guard_finding(ranks: list[dict], config: TrainConfig, expected_steps: int) -> str:
    """What two ranks must show when one of them ran out of memory: the same smaller micro-batch on
    both, the effective batch and every optimizer step kept, the same parameters."""
    per_rank = config.batch_size // len(ranks)
    for rank, run in enumerate(ranks):
        expect(run["backend"] == "gloo", f"rank {rank} trained over {run['backend']!r}, not gloo")
        expect(all(map(math.isfinite, run["losses"])), f"rank {rank}'s training losses {run['losses']}")
        expect(run["optimizer_steps"] == expected_steps,
               f"rank {rank} took {run['optimizer_steps']} optimizer steps instead of {expected_steps}")  # fmt: skip
    micro = {run["micro_batch_size"] for run in ranks}
    expect(len(micro) == 1, f"the ranks ended on different micro-batches: {sorted(micro)}")
    (micro,) = micro
    expect(micro < per_rank, f"no out-of-memory error: the per-rank micro-batch {per_rank} fit")
    accum = ranks[0]["grad_accum_steps"]
    expect(micro * accum == per_rank, f"the effective batch changed: {micro} x {accum} != {per_rank} a rank")
    same = all(
        np.array_equal(a, b) for a, b in zip(ranks[0]["parameters"], ranks[1]["parameters"], strict=True)
    )
    expect(same, "the ranks' parameters differ after the run")
    return (
        f"{len(ranks)} ranks on one GPU over gloo: per-rank micro-batch {per_rank} -> {micro} on every rank, "
        f"{accum} accumulation steps, effective batch {config.batch_size} and all {expected_steps} optimizer "
        "steps kept, parameters identical across ranks"
    )


def collective_oom_guard(splits: SplitPaths, sizes: Sizes) -> str:
    """Two ranks sharing the GPU; one is capped so that its micro-batch really runs out of memory, and
    both must drop the step and halve together."""
    require_cuda()
    fits = memory_config(sizes, "bf16")
    cap = int(OOM_CAP_OVER_PEAK * measured_peak(splits, fits))
    release_device_memory()
    # Four times the micro-batch that fits, on each of the two ranks.
    config = replace(memory_config(sizes, "bf16", batch=2 * 4 * fits.batch_size), epochs=2)
    ranks = launch_workers(train_two_ranks_on_one_gpu, config, splits, CAPPED_RANK, cap, nproc=2)
    steps = table_rows(splits.train) // config.batch_size * config.epochs
    return collective_guard_finding(ranks, config, steps) + (
        f" (rank {CAPPED_RANK}'s allocator capped at {cap / GIB:.2f} GiB, rank 0 uncapped)"
    )


def keep_busy(seconds: float) -> None:
    a = torch.randn(4096, 4096, device="cuda")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            a = torch.tanh(a @ a)
        torch.cuda.synchronize()


def nvml_telemetry() -> str:
    """The Training Deck's GPU telemetry, read through NVML while the GPU works."""
    require_cuda()
    require_modules(("pynvml", "nvidia-ml-py, the GPU telemetry"), ("psutil", "CPU and RAM telemetry"))
    from tasks.core.training.telemetry import UtilisationSampler

    with UtilisationSampler(interval_s=0.2) as sampler:
        keep_busy(seconds=2.0)
    samples = [sample for sample in sampler.samples if sample.gpu_percent]
    expect(samples, "NVML found no GPU to sample")
    busiest = max(max(sample.gpu_percent) for sample in samples)
    used = max(max(sample.gpu_memory_gib) for sample in samples)
    expect(busiest > 0, "NVML read 0% utilisation on every GPU while a matmul loop ran")
    expect(used > 0, "NVML read no GPU memory in use while a matmul loop ran")
    return f"{len(samples)} samples while busy: up to {busiest:.0f}% utilisation, {used:.1f} GiB in use"
