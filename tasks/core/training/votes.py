"""What the ranks of the torch loop exchange around each optimizer step: their flags, and the average
of their gradients.

Every step carries three flags (`FLAGS`): this rank's mean loss of the step (their average over the
ranks is not finite where any rank's loss is not), whether a preemption notice has reached the rank,
and whether it ran out of memory in the step. Under DDP they are the gradient of one more parameter,
`VoteCarrier.flags`, which the optimizer never sees: they travel in a gradient bucket, and no step
takes a collective of its own for them.

- On the fast path the flags are a second root of the step's synced backward (`StepVotes.roots`), so
  DDP's own all-reduce carries them in its first bucket, with no code of the loop's in the
  backward; they are copied to the host without waiting for the device and read after the next
  step (`StepVotes.synced`).
- On the guarded path they are written into that gradient (`StepVotes.ride`), `average_gradients`
  reduces them with the rest, and they are read before the optimizer steps (`StepVotes.decide_now`).
- Without peers (one process) nothing is exchanged: out of memory and a notice are known on the host
  at once, and the rank's own loss is copied to the host and read after the next step (`StepVotes.pend`).

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

FLAGS = ("loss", "preemption notice", "out of memory")
LOSS, STOP, OUT_OF_MEMORY = range(len(FLAGS))


@dataclass(frozen=True)
class Divergence:
    """Where the ranks found a loss that was not finite: `epoch` and `step` count from 0, `loss` is
    this rank's loss, None where only another rank's was not finite."""

    epoch: int
    step: int
    loss: float | None


@dataclass
class Flagged:
    """One step's flags on their way to the host: where the step was, this rank's mean loss of the
    step (a device scalar), and the flags averaged over the ranks (or, alone, that loss): a copy on
    its way from the device, or their values where the device had them ready."""

    epoch: int
    step: int
    loss: torch.Tensor | None
    host: torch.Tensor | list[float] | float
    copied: object | None = None  # the device event after which the copy `host` holds the values


class VoteCarrier(nn.Module):
    """What DDP wraps: the model (`module`) and `flags`, a parameter of zeros whose gradient is a step's
    flags. The loop's optimizer is built over the model alone, so `flags` never changes. It is the last
    of the parameters (in a child registered after the model), so DDP's first bucket, which holds the
    last ones, holds it beside the last layer's gradients, whose dtype it takes."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        trainable = [parameter for parameter in module.parameters() if parameter.requires_grad]
        like = trainable[-1] if trainable else torch.zeros(())
        self.votes = nn.Module()
        self.votes.flags = nn.Parameter(torch.zeros(len(FLAGS), dtype=like.dtype, device=like.device))

    @property
    def flags(self) -> nn.Parameter:
        return self.votes.flags

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


class StepVotes:
    """The flags every step of the loop carries (the module's docstring says where, and when each is
    read). `notice`, where given, is the preemption notice whose arrival on any rank stops every rank;
    `stop_agreed` turns True, alike on every rank, after the step at which they stop. `flags` is the
    `VoteCarrier`'s parameter under DDP, None alone."""

    def __init__(self, notice: PreemptionNotice | None = None, flags: nn.Parameter | None = None):
        self.notice, self.flags = notice, flags
        self.stop_agreed = False
        self.pending: Flagged | None = None  # the previous step's flags, read after this one
        if flags is not None:
            # Every value of the flags after the loss, made once: tails[notice][out of memory].
            made = lambda *values: torch.tensor(values, dtype=flags.dtype, device=flags.device)  # noqa: E731
            self.tails = tuple((made(stop, 0), made(stop, 1)) for stop in (0, 1))
            self.no_loss = made(0)

    @property
    def noticed(self) -> bool:
        return self.notice is not None and self.notice.received

    def values(self, loss: torch.Tensor | None, out_of_memory: bool = False, out=None) -> torch.Tensor:
        """This rank's flags on the device, in one kernel: its step's mean `loss` (None: no micro-batch
        done), in the flags' dtype (a loss beyond its range counts as not finite), then the others."""
        head = self.no_loss if loss is None else loss.reshape(1).to(self.flags.dtype)
        return torch.cat((head, self.tails[self.noticed][out_of_memory]), out=out)

    def roots(self, scaled_loss: torch.Tensor, loss: torch.Tensor) -> tuple[tuple, tuple]:
        """What the fast path's synced backward starts from (`torch.autograd.backward`): the step's
        scaled loss, and the flags parameter with this step's flags as its gradient."""
        return (scaled_loss, self.flags), (None, self.values(loss))

    def synced(self, epoch: int, step: int, loss: torch.Tensor) -> Divergence | None:
        """After a fast step: its flags, averaged by DDP's all-reduce, copied towards the host and the
        gradient zeroed for the next; the previous step's flags read."""
        arrived = copied_to_host(Flagged(epoch, step, loss, self.flags.grad))
        self.flags.grad.zero_()
        return self.advance(arrived)

    def ride(self, loss: torch.Tensor | None, out_of_memory: bool) -> None:
        """On the guarded path, before `average_gradients`: this step's flags written into the flags'
        gradient, in place."""
        self.values(loss, out_of_memory, out=self.flags.grad)

    def decide_now(self, epoch: int, step: int, loss: torch.Tensor | None) -> tuple[bool, Divergence | None]:
        """On the guarded path, after `average_gradients`: whether any rank ran out of memory in this
        step, and where any rank's loss was not finite (a flag still pending from a fast step first)."""
        earlier = self.settle()
        flagged = Flagged(epoch, step, loss, self.flags.grad.tolist())
        self.flags.grad.zero_()
        out_of_memory, diverged = self.read(flagged)
        return (False, earlier) if earlier is not None else (out_of_memory, diverged)

    def pend(self, epoch: int, step: int, loss: torch.Tensor | None) -> Divergence | None:
        """Alone: this step's loss copied towards the host, the previous step's read."""
        return self.advance(copied_to_host(Flagged(epoch, step, loss, loss)) if loss is not None else None)

    def advance(self, arrived: Flagged | None) -> Divergence | None:
        """The previous step's flags read; `arrived`, this step's, left pending."""
        earlier = self.read(self.pending)[1] if self.pending is not None else None
        self.pending = arrived
        return earlier

    def settle(self) -> Divergence | None:
        """What is pending, read now: where a loss was not finite, on any rank (None if none was)."""
        pending, self.pending = self.pending, None
        return self.read(pending)[1] if pending is not None else None

    def read(self, flagged: Flagged) -> tuple[bool, Divergence | None]:
        if flagged.copied is not None:
            flagged.copied.synchronize()
        values = flagged.host.tolist() if isinstance(flagged.host, torch.Tensor) else flagged.host
        if not isinstance(values, list):  # alone: the rank's own loss
            values = [values, self.noticed, 0.0]
        self.stop_agreed = self.stop_agreed or bool(values[STOP])
        diverged = None
        if not math.isfinite(values[LOSS]):
            own = flagged.loss.item() if flagged.loss is not None else 0.0
            diverged = Divergence(flagged.epoch, flagged.step, None if math.isfinite(own) else own)
        return bool(values[OUT_OF_MEMORY]), diverged

    def close(self) -> None:
        self.pending = None


def copied_to_host(flagged: Flagged) -> Flagged:
    """`flagged` with its values on their way to the host, the copy not waited for; read at once
    where the device has no work in flight (`completion_event` None: the host's own memory)."""
    device = flagged.host.device
    host = flagged.host.to("cpu", non_blocking=True)  # the tensor itself where it is on the host
    flagged.copied = family_of(device).completion_event()
    flagged.host = host if flagged.copied is not None else host.tolist()
    return flagged


def average_gradients(model: nn.Module, world_size: int) -> None:
    """Average every gradient over the ranks, in place. Gradients that are views of DDP's flat buckets
    (`wrap_in_ddp`), the flags among them, are all-reduced a bucket at a time where they lie: no copy,
    nothing allocated. Any others go in flat copies of at most GRADIENT_REDUCE_BUCKET_BYTES."""
    grads = [p.grad for p in model.parameters() if p.grad is not None and p.grad.numel()]
    flats, loose = bucket_views(grads)
    for flat in flats:
        dist.all_reduce(flat)
        flat.div_(world_size)
    for bucket in gradient_buckets(loose, GRADIENT_REDUCE_BUCKET_BYTES):
        alone = len(bucket) == 1 and bucket[0].is_contiguous()
        flat = bucket[0] if alone else torch.cat([grad.reshape(-1) for grad in bucket])
        dist.all_reduce(flat)
        flat.div_(world_size)
        if not alone:
            sizes = [grad.numel() for grad in bucket]
            for grad, reduced in zip(bucket, flat.split(sizes), strict=True):
                grad.copy_(reduced.view_as(grad))


def bucket_views(grads: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(a flat view of each storage that gradients tile exactly, end to end, as the gradients that are
    views of DDP's buckets do; the gradients that tile none), in the order of `grads`: the same on
    every rank."""
    by_storage: dict[int, list[torch.Tensor]] = {}
    for grad in grads:
        by_storage.setdefault(grad.untyped_storage().data_ptr(), []).append(grad)
    flats, loose = [], []
    for group in by_storage.values():
        numel = tiled_numel(group)
        if numel is None:
            loose += group
        else:
            flats.append(group[0].as_strided((numel,), (1,), 0))
    return flats, loose


def tiled_numel(group: list[torch.Tensor]) -> int | None:
    """The elements of the storage that `group` (tensors sharing it) fills end to end; None where
    they leave a gap, overlap, differ in dtype or are not contiguous."""
    end, first = 0, group[0]
    for tensor in sorted(group, key=torch.Tensor.storage_offset):
        if not tensor.is_contiguous() or tensor.dtype != first.dtype or tensor.storage_offset() != end:
            return None
        end += tensor.numel()
    return end if end * first.element_size() == first.untyped_storage().nbytes() else None


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
