"""The process group a torch run joins: its context, set-up agreed by every rank, DDP wrapping, and the
state rank 0 shares."""

from __future__ import annotations

import inspect
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tasks.core.messages import one_line
from tasks.core.models.memory import ddp_bucket_cap_mb
from tasks.core.training.devices import DeviceFamily, family_of, local_family

log = logging.getLogger(__name__)


T = TypeVar("T")


@dataclass
class DistributedContext:
    rank: int
    world_size: int
    device: torch.device
    backend: str
    # A gloo group of its own for the set-up vote (`agreed_set_up`): CPU objects, so it never waits
    # on a CUDA stream. The steps' flags ride in the gradient buckets instead (`votes.StepVotes`).
    vote_group: dist.ProcessGroup | None = None

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def family(self) -> DeviceFamily:
        return family_of(self.device)


def init_distributed(timeout_s: int) -> DistributedContext:
    """Join the process group that torchrun / torch elastic described in the environment."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    family = local_family()
    device = family.local_device(int(os.environ.get("LOCAL_RANK", "0")))
    if world_size == 1:
        return DistributedContext(rank, world_size, device, "none")
    if not dist.is_initialized():
        dist.init_process_group(backend=family.backend, timeout=timedelta(seconds=timeout_s))
    return DistributedContext(
        rank, world_size, device, family.backend, vote_group=dist.new_group(backend="gloo")
    )


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class SetUpFailed(ValueError):
    """A rank failed before training; raised alike on every rank, naming the first that failed."""


SET_UP_ERROR_CHARS = 2000  # a builder's error in full, a runaway one bounded


def agreed_set_up(set_up: Callable[[], T], ctx: DistributedContext) -> T:
    """`set_up()` on every rank, then a vote on whether all succeeded, before any rank enters a
    collective of training. Otherwise the ranks that succeeded fail in DDP's first broadcast with a
    connection error from the one that raised, and that error, not the cause, may be the run's.
    On failure every rank raises `SetUpFailed` with the error of the rank that failed first (a
    single process too, so that the DDP worker refuses it alike: `tasks/ddp_worker.py`)."""
    error, failed_at = None, 0.0
    try:
        result = set_up()
    except Exception as caught:  # every kind: a builder is user code
        error, failed_at = caught, time.time()
    mine = (failed_at, ctx.rank, one_line(error, SET_UP_ERROR_CHARS)) if error is not None else None
    failures = [failure for failure in gather(mine, ctx, ctx.vote_group) if failure is not None]
    if failures:
        _, rank, cause = min(failures)
        raise SetUpFailed(f"rank {rank} of {ctx.world_size} failed before training: {cause}") from error
    return result


def gather(value, ctx: DistributedContext, group: dist.ProcessGroup | None = None) -> list:
    if not ctx.is_distributed:
        return [value]
    gathered = [None] * ctx.world_size
    dist.all_gather_object(gathered, value, group=group)
    return gathered


def wrap_in_ddp(model: nn.Module, device: torch.device | None = None) -> DistributedDataParallel:
    """DDP for its start-up broadcast of parameters and buffers, its flat gradient buckets, and, on
    the fast path, its overlapped all-reduce of them in a synced backward; on the guarded path the
    loop reduces the gradients itself, in place in those buckets (`votes.average_gradients`).

    Buckets are sized from the model's gradient (`ddp_bucket_cap_mb`). Forward syncs no buffers: a
    rank that ran out of memory leaves the step at another micro-batch than its peers, and a
    collective in forward would then go unmatched (`share_rank0_buffers` instead, between epochs).
    No `static_graph`: it saves work only for models with unused parameters or reentrant
    checkpointing, which a user's builder may or may not have, and its first synced step
    all-reduces after the backward to learn the graph.
    """
    # DDP turns only gradients that exist when it is built into views of its buckets; later ones
    # would be a second copy until the first synced backward.
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    for parameter in trainable:
        parameter.grad = torch.zeros_like(parameter)
    gradient_bytes = sum(p.numel() * p.element_size() for p in trainable)
    return DistributedDataParallel(
        model,
        device_ids=[device] if device is not None and device.type == "cuda" else None,
        gradient_as_bucket_view=True,
        bucket_cap_mb=ddp_bucket_cap_mb(gradient_bytes),
        **no_forward_buffer_sync(),
    )


def no_forward_buffer_sync() -> dict:
    """torch 2.13 renamed DDP's `broadcast_buffers` to `forward_sync_buffers` (the old name warns);
    earlier releases, as on GPU images built on them, know only the old one."""
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def rng_state(ctx: DistributedContext) -> dict:
    return {"cpu": torch.get_rng_state(), "device": ctx.family.rng_state(ctx.device)}


def share_rank0_buffers(model: nn.Module, ctx: DistributedContext) -> None:
    """Every rank takes rank 0's buffers (batch-norm statistics, say), which are what rank 0 saves.

    Called between epochs, where every rank is sure to take part. Rank 0's buffers follow its own
    batches alone, as they do under DDP's default broadcast before each forward.
    """
    if ctx.is_distributed:
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)
