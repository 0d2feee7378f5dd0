"""What the ranks of the torch loop exchange around each optimizer step: their flags, and the average
of their gradients.

Every step carries three flags, summed over the ranks (`FLAGS`): did a rank run out of memory in
this step, was a rank's loss of this step not finite, has a preemption notice reached a rank? They
ride in the step's own gradient all-reduce, so no step takes a collective of its own for them:

- On the guarded path, in the first bucket of `average_gradients`, read on the host before the
  optimizer steps (`StepVotes.decide_now`): the loop drops the step, raises or steps.
- On the fast path, in DDP's first gradient bucket (`StepVotes.hook`, a communication hook), copied
  to the host without waiting for the device and read after the next step (`StepVotes.pend`).
- Without peers (one process), the flags are this rank's own, read after the next step likewise.

A divergence is thus acted on at the latest one step after the step it came from, a preemption
notice at the latest two, and always before a save (`StepVotes.settle` reads what is pending).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from tasks.core.models.memory import GRADIENT_REDUCE_BUCKET_BYTES
from tasks.core.training.devices import family_of
from tasks.core.training.preemption import PreemptionNotice

FLAGS = ("out of memory", "loss not finite", "preemption notice")
OUT_OF_MEMORY, DIVERGED, STOP = range(len(FLAGS))
CARRY_BYTES = 2**20  # DDP's first bucket is capped at 1 MiB unless one gradient alone is larger


@dataclass(frozen=True)
class Divergence:
    """Where the ranks found a loss that was not finite: `epoch` and `step` count from 0, `loss` is
    this rank's loss, None where only another rank's was not finite."""

    epoch: int
    step: int
    loss: float | None


@dataclass
class Flagged:
    """One step's flags on their way to a decision: where the step was, this rank's own flags and
    mean loss (device tensors), and the flags summed over the ranks, copied to the host."""

    epoch: int
    step: int
    mean_loss: torch.Tensor
    summed: torch.Tensor | None = None
    copied: object | None = None  # the device event after which `summed` is on the host

    def divergence(self, values: list[float]) -> Divergence | None:
        if not values[DIVERGED]:
            return None
        loss = self.mean_loss.item()
        return Divergence(self.epoch, self.step, None if math.isfinite(loss) else loss)


class StepVotes:
    """The flags every step of the loop carries (the module's docstring says where, and when each
    is read). `notice`, where given, is the preemption notice whose arrival on any rank stops every
    rank; `stop_agreed` turns True, alike on every rank, after the step at which they stop."""

    def __init__(self, notice: PreemptionNotice | None = None, world_size: int = 1):
        self.notice, self.world_size = notice, world_size
        self.stop_agreed = False
        self.armed: tuple[Flagged, torch.Tensor] | None = None  # for the next synced backward
        self.arrived: Flagged | None = None  # this step's summed flags, from the hook
        self.pending: Flagged | None = None  # the previous step's, read after this one

    def flags(self, epoch: int, step: int, loss_sum: torch.Tensor, rows: int, out_of_memory: bool = False):
        """This step's flags on the loss's device, with no host sync: (its record, the flags)."""
        flags = torch.zeros(len(FLAGS), dtype=torch.float32, device=loss_sum.device)
        flags[OUT_OF_MEMORY] = float(out_of_memory)
        flags[DIVERGED] = ~torch.isfinite(loss_sum)
        flags[STOP] = float(self.notice is not None and self.notice.received)
        return Flagged(epoch, step, loss_sum.detach() / rows), flags

    def arm(self, epoch: int, step: int, loss_sum: torch.Tensor, rows: int) -> None:
        """The flags the next synced backward's first bucket carries (`hook`)."""
        self.armed = self.flags(epoch, step, loss_sum, rows)

    def hook(self, group, bucket):  # unannotated: DDP refuses annotations that are strings
        """DDP's communication hook (a `dist.GradBucket` in, a future of its averaged gradients out):
        each bucket averaged over the ranks as DDP's default hook does; the first also carries the
        armed flags, summed, which `advance` reads after the step. A first bucket of up to
        CARRY_BYTES takes them in its own all-reduce (a copy of the bucket costs less than another
        collective); a larger one has them all-reduced beside it (the copy would cost more)."""
        grads = bucket.buffer().div_(self.world_size)
        if bucket.index() != 0 or self.armed is None:
            return dist.all_reduce(grads, group=group, async_op=True).get_future().then(first)
        (flagged, flags), self.armed = self.armed, None
        flags = flags.to(grads.dtype)

        def arrived(summed: torch.Tensor) -> None:
            flagged.summed = summed.float()
            self.arrived = copied_to_host(flagged)

        if grads.numel() * grads.element_size() > CARRY_BYTES:
            beside = dist.all_reduce(flags, group=group, async_op=True).get_future()
            reduced = dist.all_reduce(grads, group=group, async_op=True).get_future()

            def both_done(_: torch.futures.Future) -> torch.Tensor:
                arrived(beside.value()[0])
                return reduced.value()[0]

            return torch.futures.collect_all([beside, reduced]).then(both_done)

        def unpacked(future: torch.futures.Future) -> torch.Tensor:
            summed = future.value()[0]
            arrived(summed[-len(FLAGS) :])
            return grads.copy_(summed[: -len(FLAGS)])

        flat = torch.cat([grads, flags])
        return dist.all_reduce(flat, group=group, async_op=True).get_future().then(unpacked)

    def decide_now(self, flagged: Flagged, summed: torch.Tensor) -> tuple[bool, Divergence | None]:
        """The guarded path's decision on its own step: whether any rank ran out of memory, and
        where any rank's loss was not finite (a flag still pending from a fast step first)."""
        earlier = self.settle()
        if earlier is not None:
            return False, earlier
        flagged.summed = summed
        return self.read(flagged)

    def pend(self, flagged: Flagged, flags: torch.Tensor) -> Divergence | None:
        """Without peers: this step's own flags become pending, and the previous step's are read."""
        flagged.summed = flags
        self.arrived = copied_to_host(flagged)
        return self.advance()

    def advance(self) -> Divergence | None:
        """After a step: the previous step's flags read, this step's (`arrived`) left pending."""
        earlier = self.read(self.pending)[1] if self.pending is not None else None
        self.pending, self.arrived = self.arrived, None
        return earlier

    def settle(self) -> Divergence | None:
        """Every flag not yet read, read now: where a loss was not finite, on any rank (None if none was)."""
        found = None
        for flagged in (self.pending, self.arrived):
            if flagged is not None:
                found = found or self.read(flagged)[1]
        self.pending = self.arrived = None
        return found

    def read(self, flagged: Flagged) -> tuple[bool, Divergence | None]:
        if flagged.copied is not None:
            flagged.copied.synchronize()
        values = flagged.summed.tolist()
        self.stop_agreed = self.stop_agreed or bool(values[STOP])
        return bool(values[OUT_OF_MEMORY]), flagged.divergence(values)

    def close(self) -> None:
        self.armed = self.pending = self.arrived = None


def first(future: torch.futures.Future) -> torch.Tensor:
    return future.value()[0]


def copied_to_host(flagged: Flagged) -> Flagged:
    """`flagged` with its summed flags on their way to the host, the copy not waited for."""
    device = flagged.summed.device
    flagged.summed = flagged.summed.to("cpu", non_blocking=True)
    flagged.copied = family_of(device).completion_event()
    return flagged


def average_gradients(
    model: nn.Module, world_size: int, flags: torch.Tensor | None = None, staging: torch.Tensor | None = None
) -> torch.Tensor | None:
    """Average every gradient over the ranks: one all-reduce per flat bucket of at most
    GRADIENT_REDUCE_BUCKET_BYTES, so the copies never cost more than one bucket of memory. `flags`
    ride in the first bucket and come back summed over the ranks; `staging` (`staging_buffer`) holds
    each bucket in turn, so that a rank that just ran out of memory allocates nothing here."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    summed = None
    for index, bucket in enumerate(gradient_buckets(grads, GRADIENT_REDUCE_BUCKET_BYTES)):
        carried = [flags.to(bucket[0].dtype)] if flags is not None and index == 0 else []
        parts = [*bucket, *carried]
        alone = len(parts) == 1 and parts[0].is_contiguous()
        flat = parts[0] if alone else flat_copy(parts, staging)
        dist.all_reduce(flat)
        if carried:
            summed = flat[-len(carried[0]) :].float()
        flat.div_(world_size)
        if not alone:
            sizes = [grad.numel() for grad in bucket]
            for grad, reduced in zip(bucket, flat[: sum(sizes)].split(sizes), strict=True):
                grad.copy_(reduced.view_as(grad))
    return summed


def flat_copy(parts: list[torch.Tensor], staging: torch.Tensor | None) -> torch.Tensor:
    numel = sum(part.numel() for part in parts)
    fits = staging is not None and staging.dtype == parts[0].dtype and staging.numel() >= numel
    flat = staging[:numel] if fits else torch.empty(numel, dtype=parts[0].dtype, device=parts[0].device)
    return torch.cat([part.reshape(-1) for part in parts], out=flat)


def staging_buffer(model: nn.Module) -> torch.Tensor | None:
    """A flat buffer for `average_gradients`' largest bucket and the flags, allocated once, before
    any step can run out of memory; None for a model without gradients yet."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    buckets = gradient_buckets(grads, GRADIENT_REDUCE_BUCKET_BYTES)
    if not buckets:
        return None
    numel = max(sum(grad.numel() for grad in bucket) for bucket in buckets) + len(FLAGS)
    return torch.empty(numel, dtype=grads[0].dtype, device=grads[0].device)


def gradient_buckets(tensors: list[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    """Consecutive tensors grouped by dtype and device, at most `limit` bytes a group (a larger
    tensor forms a group of its own)."""
    buckets: list[list[torch.Tensor]] = []
    size, kind = 0, None
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if (tensor.dtype, tensor.device) == kind and size + nbytes <= limit:
            buckets[-1].append(tensor)
            size += nbytes
        else:
            buckets.append([tensor])
            size, kind = nbytes, (tensor.dtype, tensor.device)
    return buckets
