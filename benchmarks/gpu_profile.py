"""A profile of the project's torch training loop: what holds up a run whose GPU figure missed its goal.

`profile_training` runs `tasks.core.training.torch_training.train` once under `torch.profiler` and reduces the
profile to a few numbers: how much of the run the device was busy, how many kernel launches and host
synchronisations each optimizer step cost, and which operators took the time. `ProfileSummary.verdict`
turns them into one line: launch-bound, held up by host syncs, held up by other host work, or bound
by the device itself (compute or memory bandwidth). On CPU there is no device timeline: the numbers
are host-side only and the verdict says so. Nothing here imports flytekit.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from tasks.core.data.splits import SplitPaths
from tasks.core.training import ranges, torch_training
from tasks.core.training.config import TrainConfig

# Below this the device idles for more than 40% of the run: the host, not the device, sets the pace.
BUSY_LOW = 0.6
# An eager op costs the host some 5-10 us to dispatch and launch; from about 50 launches a step that
# is a quarter to half a millisecond a step, as long as a step of small layers keeps the device busy.
MANY_LAUNCHES_PER_STEP = 50
# One blocking wait a step already keeps the host from queueing the next step while the device works.
SYNCS_PER_STEP = 1.0
# On a busy device, matmuls taking most of its time mean compute-bound; otherwise the time goes to
# elementwise work and copies, which are bound by memory bandwidth.
COMPUTE_BOUND_MATMUL_SHARE = 0.5
TOP_OPS = 10

# Host calls that launch device work (CUDA runtime and driver API); matched by prefix, so that the
# variants (cudaLaunchKernelExC, cuLaunchKernelEx, ...) count too. A graph launch is one host call.
LAUNCH_CALLS = (
    "cudaLaunchKernel",
    "cuLaunchKernel",
    "cudaLaunchCooperativeKernel",
    "cuLaunchCooperativeKernel",
    "cudaGraphLaunch",
    "cuGraphLaunch",
)
# Host calls that wait for the device; blocking copies (cudaMemcpy, not cudaMemcpyAsync) wait too.
SYNC_CALLS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cuStreamSynchronize",
    "cuCtxSynchronize",
    "cuEventSynchronize",
)
BLOCKING_COPY_CALLS = ("cudaMemcpy", "cuMemcpy")
SCALAR_READ_OP = "aten::_local_scalar_dense"  # what `.item()` runs
MATMUL_OPS = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::_addmm_activation",
        "aten::bmm",
        "aten::baddbmm",
        "aten::matmul",
        "aten::linear",
        "aten::_scaled_mm",
        "aten::convolution",
        "aten::_convolution",
        "aten::cudnn_convolution",
        "aten::convolution_backward",
    }
)


@dataclass(frozen=True)
class OpTime:
    name: str
    calls: int
    self_ms: float  # self device time on CUDA, self CPU time on CPU


@dataclass
class ProfileSummary:
    optimizer_steps: int
    wall_s: float
    device_busy_s: float  # union of the device's kernel and copy intervals: concurrent streams count once
    kernel_launches_per_step: float
    host_syncs_per_step: float
    host_sync_wait_s: float  # the host's time inside those syncs
    matmul_share: float  # of the operators' self time (device time on CUDA, CPU time on CPU)
    top_ops: list[OpTime] = field(default_factory=list)
    on_device: bool = False  # whether CUDA was profiled
    trace_path: str | None = None
    # The loop's own parts (tasks/core/training/ranges.py): host time in each, and the time the device
    # sat idle within the timed epochs, the part of an epoch the samples/s figure pays for nothing.
    loop_parts: list[OpTime] = field(default_factory=list)
    epoch_device_idle_s: float = 0.0

    @property
    def device_busy_fraction(self) -> float:
        return self.device_busy_s / self.wall_s if self.on_device and self.wall_s > 0 else 0.0

    @property
    def host_sync_wait_fraction(self) -> float:
        return self.host_sync_wait_s / self.wall_s if self.wall_s > 0 else 0.0

    def verdict(self) -> str:
        top = self.top_ops[0].name if self.top_ops else "none recorded"
        if not self.on_device:
            return f"host only (no CUDA device profiled): the top operator by self CPU time is {top}"
        busy = f"{self.device_busy_fraction:.0%} of the time"
        launches = f"{self.kernel_launches_per_step:.0f} kernel launches a step"
        syncs = f"{self.host_syncs_per_step:.1f} host syncs a step"
        if self.device_busy_fraction >= BUSY_LOW:
            return f"device-bound, {self.device_limit()}: busy {busy}; the top operator is {top}"
        # Launches first: that many keep the host busy on their own, and a sync a step only adds to it.
        if self.kernel_launches_per_step >= MANY_LAUNCHES_PER_STEP:
            return f"launch-bound: the device is busy {busy}, {launches}, {syncs}"
        if self.host_syncs_per_step >= SYNCS_PER_STEP:
            return (
                f"host syncs: {self.host_syncs_per_step:.1f} per step, the host waits in them "
                f"{self.host_sync_wait_fraction:.0%} of the time; "
                f"the device is busy {busy}, {launches}"
            )
        return (
            f"host-bound: the device is busy {busy} with {launches} and {syncs}: "
            "the host's own work between launches (input pipeline, Python) holds it up"
        )

    def device_limit(self) -> str:
        matmuls = f"matmuls take {self.matmul_share:.0%} of the operators' device time"
        if self.matmul_share >= COMPUTE_BOUND_MATMUL_SHARE:
            return f"compute ({matmuls})"
        return f"memory bandwidth ({matmuls}, the rest is elementwise work and copies)"

    def text(self) -> str:
        timed_by = "device" if self.on_device else "CPU"
        lines = [
            self.verdict(),
            f"{self.optimizer_steps} optimizer steps in {self.wall_s:.2f} s; device busy {self.device_busy_s:.3f} s "
            f"({self.device_busy_fraction:.0%}); {self.kernel_launches_per_step:.1f} kernel launches and "
            f"{self.host_syncs_per_step:.1f} host syncs a step (waiting {self.host_sync_wait_s:.3f} s); "
            f"matmuls {self.matmul_share:.0%} of operator time",
            f"top operators by self {timed_by} time:",
            *(f"  {op.name:<48} {op.calls:>7} calls {op.self_ms:>10.2f} ms" for op in self.top_ops),
        ]
        if self.loop_parts:
            parts = ", ".join(
                f"{op.name.removeprefix(ranges.PREFIX)} {op.calls} x {op.self_ms:.1f} ms"
                for op in self.loop_parts
            )
            idle = (
                f"; the device idle {self.epoch_device_idle_s * 1e3:.1f} ms of the train epochs"
                if self.on_device
                else ""
            )
            lines.append(f"loop parts, host time: {parts}{idle}")
        if self.trace_path:
            lines.append(f"trace: {self.trace_path}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            **asdict(self),
            "device_busy_fraction": self.device_busy_fraction,
            "host_sync_wait_fraction": self.host_sync_wait_fraction,
            "verdict": self.verdict(),
        }


def profile_training(
    config: TrainConfig,
    splits: SplitPaths,
    steps: int | None = None,
    trace_dir: Path | None = None,
    name: str = "torch-loop",
) -> ProfileSummary:
    """One run of the project's torch loop under the profiler, reduced to a `ProfileSummary`.

    The counts are per optimizer step of the run, or per `steps` where the caller counts steps its
    own way. With a `trace_dir`, the Chrome trace is written there as `{name}.json`. Profiling costs
    time and memory in proportion to the run: pass splits small enough for a few hundred steps.
    """
    on_device = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_device else [])]
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        outcome = torch_training.train(config, splits)
        wall_s = time.perf_counter() - start
    events, averages = prof.events(), prof.key_averages()
    per_step = max(steps if steps is not None else outcome.optimizer_steps, 1)
    syncs = host_sync_calls(events, on_device)
    return ProfileSummary(
        optimizer_steps=outcome.optimizer_steps,
        wall_s=wall_s,
        device_busy_s=union_length(device_intervals(events)) / 1e6,
        kernel_launches_per_step=count_launches(events) / per_step,
        host_syncs_per_step=len(syncs) / per_step,
        host_sync_wait_s=sum(call.time_range.end - call.time_range.start for call in syncs) / 1e6,
        matmul_share=matmul_share(averages, on_device),
        top_ops=top_operators(averages, on_device),
        on_device=on_device,
        trace_path=str(export_trace(prof, trace_dir, name)) if trace_dir is not None else None,
        loop_parts=loop_parts(events),
        epoch_device_idle_s=epoch_device_idle(events) / 1e6 if on_device else 0.0,
    )


def annotated(events: Iterable, name: str | None = None) -> list:
    """The host-side ranges the loop marks (`ranges.PREFIX`), or only those called `name`."""
    return [
        event for event in host_calls(events, [name or ranges.PREFIX]) if name is None or event.name == name
    ]


def loop_parts(events: Iterable) -> list[OpTime]:
    """Calls and host milliseconds of each of the loop's marked parts, in the order first entered."""
    parts: dict[str, list[float]] = {}
    for event in sorted(annotated(events), key=lambda event: event.time_range.start):
        parts.setdefault(event.name, []).append(event.time_range.end - event.time_range.start)
    return [OpTime(name, len(lengths), sum(lengths) / 1e3) for name, lengths in parts.items()]


def epoch_device_idle(events: Iterable) -> float:
    """Microseconds within the timed epochs (`ranges.TRAIN_EPOCH`) during which the device ran nothing."""
    events = list(events)
    work = device_intervals(events)
    idle = 0.0
    for epoch in annotated(events, ranges.TRAIN_EPOCH):
        start, end = epoch.time_range.start, epoch.time_range.end
        inside = [(max(a, start), min(b, end)) for a, b in work if b > start and a < end]
        idle += (end - start) - union_length(inside)
    return idle


def export_trace(prof: profile, trace_dir: Path, name: str) -> Path:
    """The profile as a Chrome trace (chrome://tracing, Perfetto) at `trace_dir / f"{name}.json"`."""
    path = Path(trace_dir) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return path


def device_intervals(events: Iterable) -> list[tuple[float, float]]:
    """(start, end) in microseconds of the work on the device: kernels, copies, memsets. The device
    copies of record_function ranges (user annotations) span gaps between kernels, so they are left out."""
    return [
        (event.time_range.start, event.time_range.end)
        for event in events
        if event.device_type == DeviceType.CUDA and not getattr(event, "is_user_annotation", False)
    ]


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of `intervals`: overlapping ones count once."""
    total, covered_until = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > covered_until:
            total += end - max(start, covered_until)
            covered_until = end
    return total


def host_calls(events: Iterable, names: Sequence[str]) -> list:
    """The host-side events whose name starts with one of `names`."""
    prefixes = tuple(names)
    host_events = (event for event in events if event.device_type == DeviceType.CPU)
    return [event for event in host_events if event.name.startswith(prefixes)]


def outermost(events: Iterable) -> list:
    """The events that do not lie within another of `events`: a runtime call that the runtime makes
    through the driver API is one call, not two. Calls from different threads seldom overlap in
    time, so time alone decides."""
    kept, covered_until = [], float("-inf")
    for event in sorted(events, key=lambda event: (event.time_range.start, -event.time_range.end)):
        if event.time_range.end > covered_until:
            kept.append(event)
            covered_until = event.time_range.end
    return kept


def count_launches(events: Iterable) -> int:
    return len(outermost(host_calls(events, LAUNCH_CALLS)))


def host_sync_calls(events: Iterable, on_device: bool) -> list:
    """The points where the host waits for a value from the device.

    On CUDA these are the runtime's waits (a `.item()` of a CUDA tensor makes one); a `.item()` of a
    CPU tensor, such as the optimizer's step count, waits for nothing. On CPU, where nothing is
    synchronised, the `.item()` calls are counted: the reads that would wait on a device.
    """
    events = list(events)
    if not on_device:
        return [event for event in events if event.name == SCALAR_READ_OP]
    blocking_copies = [call for call in host_calls(events, BLOCKING_COPY_CALLS) if "Async" not in call.name]
    return outermost(host_calls(events, SYNC_CALLS) + blocking_copies)


def operator_rows(averages: Iterable) -> list:
    """The operators of `prof.key_averages()`: host-side rows, not device kernels or annotations."""
    return [
        row
        for row in averages
        if row.device_type == DeviceType.CPU and not getattr(row, "is_user_annotation", False)
    ]


def self_time_us(row, on_device: bool) -> float:
    if not on_device:
        return row.self_cpu_time_total
    device_time = getattr(row, "self_device_time_total", None)  # torch 2.x; older: self_cuda_time_total
    return device_time if device_time is not None else getattr(row, "self_cuda_time_total", 0.0)


def top_operators(averages: Iterable, on_device: bool, limit: int = TOP_OPS) -> list[OpTime]:
    rows = sorted(operator_rows(averages), key=lambda row: self_time_us(row, on_device), reverse=True)
    return [OpTime(row.key, row.count, self_time_us(row, on_device) / 1e3) for row in rows[:limit]]


def matmul_share(averages: Iterable, on_device: bool) -> float:
    """The share of the operators' self time that matmuls and convolutions take."""
    times = [(row.key, self_time_us(row, on_device)) for row in operator_rows(averages)]
    total = sum(time_us for _, time_us in times)
    return sum(time_us for key, time_us in times if key in MATMUL_OPS) / total if total > 0 else 0.0
