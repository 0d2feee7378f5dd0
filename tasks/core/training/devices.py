"""What the torch training loop does differently on each family of devices, in one record per family.

The loop reads `family.xxx` and never tests a device type. Supporting another accelerator (ROCm,
XPU) is one more entry in `FAMILIES`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

NO_STATE = torch.empty(0, dtype=torch.uint8)


@dataclass(frozen=True)
class DeviceFamily:
    type: str  # torch's device type
    backend: str  # the process group's backend for gradients under DDP
    autocasts: bool  # trains in mixed precision when the precision asks for it; else float32
    fused_adamw: bool  # one kernel for the whole update (and no host sync per step with the fp16 scaler)
    pins_host_memory: bool  # host batches are page-locked so their copies can run asynchronously
    deterministic: bool  # torch.use_deterministic_algorithms: reproducible runs where it costs little
    available: Callable[[], bool]
    local_device: Callable[[int], torch.device]  # the local rank's device, made current
    describe: Callable[[torch.device], str]  # as the run records it
    native_bf16: Callable[[torch.device], bool]
    rng_state: Callable[[torch.device], torch.Tensor]  # the family's own generator; empty if none
    set_rng_state: Callable[[torch.Tensor, torch.device], None]
    completion_event: Callable[[], object | None]  # marks the work queued so far; None: done already
    reset_peak_memory: Callable[[torch.device], None]
    peak_memory: Callable[[torch.device], int]  # bytes allocated at most since the reset
    synchronize: Callable[[torch.device], None]
    release_cached_memory: Callable[[], None]
    # Host batches onto the device, each one's copy issued a step ahead so it overlaps the compute of
    # the step before (on a stream of its own where the family has streams).
    copied_ahead: Callable[
        [Iterable[tuple[torch.Tensor, ...]], torch.device], Iterator[tuple[torch.Tensor, ...]]
    ]


def cuda_device(local_rank: int) -> torch.device:
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def cuda_event() -> torch.cuda.Event:
    event = torch.cuda.Event()
    event.record()
    return event


def nothing(*_) -> None:
    return None


def copied_in_order(batches: Iterable[tuple[torch.Tensor, ...]], device: torch.device) -> Iterator[tuple]:
    for batch in batches:
        yield tuple(column.to(device, non_blocking=True) for column in batch)


def cuda_copied_ahead(batches: Iterable[tuple[torch.Tensor, ...]], device: torch.device) -> Iterator[tuple]:
    """Batch k+1's copy is queued on a side stream before batch k is handed to the loop, so the copy
    engine moves it while the compute stream runs step k; the compute stream waits for a batch's copy
    only when it uses it, and the allocator is told the batch is used there (`record_stream`)."""
    side = torch.cuda.Stream(device)
    staged = None
    for batch in batches:
        with torch.cuda.stream(side):
            copied = tuple(column.to(device, non_blocking=True) for column in batch)
            done = torch.cuda.Event()
            done.record(side)
        if staged is not None:
            yield in_compute_stream(*staged)
        staged = (copied, done)
    if staged is not None:
        yield in_compute_stream(*staged)


def in_compute_stream(copied: tuple[torch.Tensor, ...], done: torch.cuda.Event) -> tuple[torch.Tensor, ...]:
    compute = torch.cuda.current_stream()
    compute.wait_event(done)
    for column in copied:
        column.record_stream(compute)
    return copied


# Lambdas rather than torch's functions themselves: they look torch up when called, as tests that
# stand in for a GPU expect.
CUDA = DeviceFamily(
    type="cuda",
    backend="nccl",
    autocasts=True,
    fused_adamw=True,
    pins_host_memory=True,
    deterministic=False,
    available=lambda: torch.cuda.is_available(),
    local_device=cuda_device,
    describe=lambda device: torch.cuda.get_device_name(device),
    native_bf16=lambda device: torch.cuda.is_bf16_supported(including_emulation=False),
    rng_state=lambda device: torch.cuda.get_rng_state(device),
    set_rng_state=lambda state, device: torch.cuda.set_rng_state(state, device) if state.numel() else None,
    completion_event=cuda_event,
    reset_peak_memory=lambda device: torch.cuda.reset_peak_memory_stats(device),
    peak_memory=lambda device: torch.cuda.max_memory_allocated(device),
    synchronize=lambda device: torch.cuda.synchronize(device),
    release_cached_memory=lambda: torch.cuda.empty_cache(),
    copied_ahead=cuda_copied_ahead,
)
CPU = DeviceFamily(
    type="cpu",
    backend="gloo",
    autocasts=False,
    fused_adamw=False,
    pins_host_memory=False,
    deterministic=True,
    available=lambda: True,
    local_device=lambda local_rank: torch.device("cpu"),
    describe=lambda device: "cpu",
    native_bf16=lambda device: False,
    rng_state=lambda device: NO_STATE,
    set_rng_state=nothing,
    completion_event=nothing,
    reset_peak_memory=nothing,
    peak_memory=lambda device: 0,
    synchronize=nothing,
    release_cached_memory=nothing,
    copied_ahead=copied_in_order,
)
FAMILIES = (CUDA, CPU)  # in order of preference: the first available trains
BY_TYPE = {family.type: family for family in FAMILIES}


def local_family() -> DeviceFamily:
    return next(family for family in FAMILIES if family.available())


def family_of(device: torch.device) -> DeviceFamily:
    return BY_TYPE[device.type]
