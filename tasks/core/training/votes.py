"""What the ranks of the torch loop exchange around each optimizer step: their votes, and the average
of their gradients.

The votes run on the context's own gloo group (`DistributedContext.vote_group`): CPU tensors, so a
vote never waits on a CUDA stream. A step on the loop's guarded path takes two, in the same order
on every rank:

- `StepVotes.after_backward`, synchronous, before the optimizer steps: did any rank run out of
  memory in this step, and was any rank's last recorded loss not finite? It returns both flags; the
  loop drops the step or raises.
- `StepVotes.stop_after_step`, asynchronous and read one step later: did a preemption notice reach
  any rank?

Between the two, `average_gradients` averages the gradients over the ranks, bucket by bucket.

A step on the fast path (DDP's synced backward, which averages the gradients as it goes) takes no
synchronous vote: `StepVotes.record_loss` launches the vote on the previous step's loss
asynchronously and reads it one step later (`LossVote`), and the preemption vote is as above.
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


@dataclass(frozen=True)
class Divergence:
    """Where the ranks found a loss that was not finite: `epoch` and `step` count from 0, `loss` is
    this rank's loss, None where only another rank's was not finite."""

    epoch: int
    step: int
    loss: float | None


class StepVotes:
    """The votes every step of the loop takes part in (the module's docstring says which, and when).

    `group` is the gloo group to vote on, None where there is no one to vote with; `notice`, where
    given, is the preemption notice whose arrival on any rank stops every rank."""

    def __init__(self, group: dist.ProcessGroup | None, notice: PreemptionNotice | None = None):
        self.group = group
        self.losses = LossWatch()
        self.loss_vote = LossVote(group)
        self.stop = StopVote(notice, group) if notice is not None else None

    @property
    def notice(self) -> PreemptionNotice | None:
        return self.stop.notice if self.stop is not None else None

    def record_loss(
        self, epoch: int, step: int, loss_sum: torch.Tensor, n_rows: int, synced: bool = False
    ) -> Divergence | None:
        """The mean loss of the step just done, checked at the next `after_backward`; or, after a
        `synced` step (the fast path), the previous step's loss voted on asynchronously, and the
        result of the vote launched one step earlier returned (`LossVote`)."""
        checked = self.losses.take() if synced else None
        self.losses.record(epoch, step, loss_sum, n_rows)
        return self.loss_vote.launch(*checked) if checked is not None else None

    def after_backward(self, out_of_memory: bool) -> tuple[bool, Divergence | None]:
        """Every rank's vote on the step it runs (out of memory here?) and on its last recorded loss
        (finite?): whether any rank ran out of memory, and, where any rank's loss was not finite,
        where. Every rank gets the same answer. A loss vote still pending from a fast step is read
        first, and decides alone where it found a divergence."""
        earlier = self.loss_vote.read()
        if earlier is not None:
            return False, earlier
        epoch, step, loss = self.losses.take()
        diverged_here = loss is not None and not math.isfinite(loss)
        out_of_memory, diverged = any_rank((out_of_memory, diverged_here), self.group)
        return out_of_memory, Divergence(epoch, step, loss if diverged_here else None) if diverged else None

    def last_loss_vote(self) -> Divergence | None:
        """The same vote between steps, where no rank can have run out of memory: only the last
        recorded loss counts."""
        _, diverged = self.after_backward(out_of_memory=False)
        return diverged

    def stop_after_step(self) -> bool:
        """Whether every rank stops after the step just done; False, with no vote, without a notice."""
        return self.stop is not None and self.stop.stop_now()

    def close(self) -> None:
        self.loss_vote.read()  # every rank waits for its last vote; the result is the next run's concern
        if self.stop is not None:
            self.stop.close()


def any_rank(flags: tuple[bool, ...], group: dist.ProcessGroup | None) -> tuple[bool, ...]:
    """Whether each flag is set on any rank: one synchronous all-reduce on the CPU vote `group`."""
    if group is None:
        return flags
    vote = torch.tensor([int(flag) for flag in flags], dtype=torch.int32)
    dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=group)
    return tuple(bool(flag) for flag in vote.tolist())


class LossWatch:
    """This rank's step losses, each checked at the next vote: the loss is copied to the host without
    waiting for the device, so the check never stalls a step (on CPU the copy is immediate)."""

    def __init__(self):
        self.pending: tuple[int, int, torch.Tensor, object | None] | None = None

    def record(self, epoch: int, step: int, loss_sum: torch.Tensor, n_rows: int) -> None:
        loss = (loss_sum / n_rows).to("cpu", non_blocking=True)
        event = family_of(loss_sum.device).completion_event()
        self.pending = (epoch, step, loss, event)

    def take(self) -> tuple[int, int, float | None]:
        if self.pending is None:
            return 0, 0, None
        epoch, step, loss, event = self.pending
        self.pending = None
        if event is not None:
            event.synchronize()
        return epoch, step, loss.item()


class LossVote:
    """The fast path's vote on the previous step's loss: launched asynchronously after a step and
    read after the next one, so that no step waits on a CPU collective for it. Every rank launches
    and reads the same votes after the same steps, so all raise at the same step. A divergence is
    thus acted on two steps after the step whose loss was not finite, before any save
    (`StepVotes.after_backward` reads a pending vote first)."""

    def __init__(self, group: dist.ProcessGroup | None):
        self.group = group
        self.pending: tuple | None = None

    def launch(self, epoch: int, step: int, loss: float | None) -> Divergence | None:
        decided = self.read()
        diverged_here = loss is not None and not math.isfinite(loss)
        vote = torch.tensor([int(diverged_here)], dtype=torch.int32)
        work = None
        if self.group is not None:
            work = dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        self.pending = (work, vote, Divergence(epoch, step, loss if diverged_here else None))
        return decided

    def read(self) -> Divergence | None:
        """The result of the vote pending, if any: where a loss was not finite, on any rank."""
        if self.pending is None:
            return None
        work, vote, where = self.pending
        self.pending = None
        if work is not None:
            work.wait()
        return where if vote.item() else None


class StopVote:
    """Whether every rank stops after this step, on the preemption notice of any of them.

    A notice may reach only some ranks (one node of several is reclaimed), so the ranks vote: one
    4-byte all-reduce per step on the gloo vote group, read one step later so that it overlaps
    the next step instead of stalling it (and never syncs a CUDA stream). Every rank reads the same
    result after the same step, so no rank is left waiting in a collective.
    """

    def __init__(self, notice: PreemptionNotice, group: dist.ProcessGroup | None):
        self.notice = notice
        self.group = group
        self.pending: tuple | None = None

    def stop_now(self) -> bool:
        if self.group is None:
            return self.notice.received
        decided = False
        if self.pending is not None:
            work, tally = self.pending
            work.wait()
            decided = bool(tally.item())
        vote = torch.tensor([int(self.notice.received)], dtype=torch.int32)
        self.pending = (dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=self.group, async_op=True), vote)
        return decided

    def close(self) -> None:
        if self.pending is not None:
            self.pending[0].wait()
            self.pending = None


def average_gradients(model: nn.Module, world_size: int) -> None:
    """Average every gradient over the ranks: one all-reduce per flat bucket of at most
    GRADIENT_REDUCE_BUCKET_BYTES, so the copies never cost more than one bucket of memory."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    for bucket in gradient_buckets(grads, GRADIENT_REDUCE_BUCKET_BYTES):
        alone = len(bucket) == 1 and bucket[0].is_contiguous()
        flat = bucket[0] if alone else torch.cat([grad.reshape(-1) for grad in bucket])
        dist.all_reduce(flat)
        flat.div_(world_size)
        if not alone:
            for grad, reduced in zip(bucket, flat.split([grad.numel() for grad in bucket]), strict=True):
                grad.copy_(reduced.view_as(grad))


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
