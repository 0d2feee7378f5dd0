"""What the torch training loop does differently on each family of devices, in one record per family.

The loop reads `family.xxx` and never tests a device type. Supporting another accelerator (ROCm,
XPU) is one more entry in `FAMILIES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

NO_STATE = torch.empty(0, dtype=torch.uint8)


@dataclass(frozen=True)
class DeviceFamily:
    type: str  # torch's device type
    backend: str  # the process group's backend for gradients under DDP
    autocasts: bool  # trains in mixed precision when the precision asks for it; else float32
    fused_adamw: bool  # one kernel for the whole update (and no host sync per step with the fp16 scaler)
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


# Lambdas rather than torch's functions themselves: they look torch up when called, as tests that
# stand in for a GPU expect.
CUDA = DeviceFamily(
    type="cuda",
    backend="nccl",
    autocasts=True,
    fused_adamw=True,
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
)
CPU = DeviceFamily(
    type="cpu",
    backend="gloo",
    autocasts=False,
    fused_adamw=False,
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
)
FAMILIES = (CUDA, CPU)  # in order of preference: the first available trains
BY_TYPE = {family.type: family for family in FAMILIES}


def local_family() -> DeviceFamily:
    return next(family for family in FAMILIES if family.available())


def family_of(device: torch.device) -> DeviceFamily:
    return BY_TYPE[device.type]
