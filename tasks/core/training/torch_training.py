"""The PyTorch training loop: one function per rank, DDP when launched with several workers.

Run under torchrun / torch elastic (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR set) it joins the
process group: NCCL on CUDA, gloo on CPU (`tasks.core.training.devices`). Run as a plain process it trains alone.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import time
from collections.abc import Callable
from contextlib import closing, nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TypeVar

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tasks.core.data.splits import SplitPaths
from tasks.core.messages import one_line
from tasks.core.models.memory import GRADIENT_REDUCE_BUCKET_BYTES
from tasks.core.models.plugins import TrainingDiverged, build, input_spec_for
from tasks.core.models.torch_models import save_torch_artifact
from tasks.core.training.checkpoint import TrainingCheckpoint
from tasks.core.training.config import TrainConfig
from tasks.core.training.devices import DeviceFamily, family_of, local_family
from tasks.core.training.precision import for_torch
from tasks.core.training.preemption import PreemptionNotice
from tasks.core.training.progress import ProgressReporter, TrainingProgress, log_epoch
from tasks.core.training.rank_part import rank_part
from tasks.core.training.records import EpochMetrics, TrainingRun
from tasks.core.training.rows import TrainingRows, auto_placement

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class TrainOutcome:
    """What one rank returns; rank 0's `run` describes the run."""

    run: TrainingRun
    rank: int
    shard_rows: list[int]
    optimizer_steps: int
    micro_batch_size: int  # at the end of the run, after any out-of-memory halving
    grad_accum_steps: int
    model: nn.Module | None = None


@dataclass
class DistributedContext:
    rank: int
    world_size: int
    device: torch.device
    backend: str
    # A gloo group of its own for the ranks' small votes (stop, out of memory): CPU tensors, so a
    # vote never waits on a CUDA stream. None where there is no one to vote with.
    votes: dist.ProcessGroup | None = None

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
    return DistributedContext(rank, world_size, device, family.backend, votes=dist.new_group(backend="gloo"))


def autocast_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """The dtype autocast computes in on `device` for `precision` (`tasks.core.training.precision.for_torch`);
    None for full float32."""
    family = family_of(device)
    accelerator = family.describe(device) if family.autocasts else None
    chosen = for_torch(precision, accelerator, lambda: family.native_bf16(device)).torch_autocast
    return getattr(torch, chosen) if chosen else None


def build_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        model.parameters(),
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
        fused=family_of(device).fused_adamw,
    )


class Totals:
    """A running loss sum and count of correct predictions, kept on the device.

    float32 stops counting at 2**24 rows (2**24 + 1 rounds to 2**24), so the count is int64 and the
    loss sum float64. Adding never syncs with the host; `all_reduced` reads both back at once.
    """

    def __init__(self, device: torch.device, loss_sum: float = 0.0, correct: int = 0):
        # `full`, not `tensor`: a fill on the device rather than a copy from the host.
        self.loss_sum = torch.full((), loss_sum, dtype=torch.float64, device=device)
        self.correct = torch.full((), correct, dtype=torch.int64, device=device)

    def add(self, loss_sum: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> None:
        """Add a batch: its summed loss, and its predictions checked against the labels `y`."""
        self.loss_sum += loss_sum.detach()
        self.correct += (logits.argmax(1) == y).sum()

    def add_totals(self, other: Totals) -> None:
        self.loss_sum += other.loss_sum
        self.correct += other.correct

    def all_reduced(self, rows: int, ctx: DistributedContext) -> tuple[float, float, int]:
        """(loss sum, correct, rows) over all ranks: one all-reduce, one transfer to the host."""
        # float64 holds integers exactly up to 2**53, so the counts survive the conversion.
        rows_here = torch.full((), rows, dtype=torch.float64, device=self.loss_sum.device)
        sums = torch.stack([self.loss_sum, self.correct.double(), rows_here])
        if ctx.is_distributed:
            dist.all_reduce(sums)
        loss_sum, correct, seen = sums.tolist()
        return loss_sum, correct, int(seen)


@torch.no_grad()
def evaluate_shard(model: nn.Module, batches, ctx, dtype) -> tuple[float, float]:
    """Mean loss and accuracy over every rank's `batches` of (x, y) on the device."""
    model.eval()
    totals, rows = Totals(ctx.device), 0
    for xb, yb in batches:
        with torch.autocast(ctx.device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(xb)
        totals.add(F.cross_entropy(logits.float(), yb, reduction="sum"), logits, yb)
        rows += len(yb)
    loss_sum, correct, count = totals.all_reduced(rows, ctx)
    return loss_sum / count, correct / count


def gather(value, ctx: DistributedContext, group: dist.ProcessGroup | None = None) -> list:
    if not ctx.is_distributed:
        return [value]
    gathered = [None] * ctx.world_size
    dist.all_gather_object(gathered, value, group=group)
    return gathered


def rng_state(ctx: DistributedContext) -> dict:
    return {"cpu": torch.get_rng_state(), "device": ctx.family.rng_state(ctx.device)}


class MicroBatch:
    """The micro-batch size, halved on CUDA out-of-memory while the effective batch stays fixed.

    Under DDP every rank halves at the same step, so all ranks keep the same size."""

    def __init__(self, size: int, minimum: int):
        self.size, self.minimum = size, minimum

    def halve(self, error: Exception | None, step: int, per_step: int) -> None:
        """Halve after the step ran out of memory: on this rank (`error`) or on another (None)."""
        where = "" if error is not None else " on another rank"
        if self.size // 2 < self.minimum:
            raise RuntimeError(
                f"CUDA out of memory at step {step} even with micro-batch {self.size} "
                f"(minimum {self.minimum}){where}; use a larger accelerator or a smaller model"
            ) from error
        before = self.size
        self.size //= 2
        log.warning(
            "CUDA out of memory at step %d%s: micro-batch %d -> %d, accumulation %d -> %d steps "
            "(effective batch unchanged); every rank retries the step",
            step, where, before, self.size, -(-per_step // before), -(-per_step // self.size),
        )  # fmt: skip


class StepOutOfMemory(Exception):
    """A rank ran out of memory in this step, and every rank dropped it; `error` is this rank's own
    out-of-memory error, None when only other ranks ran out."""

    def __init__(self, error: torch.OutOfMemoryError | None):
        super().__init__(str(error) if error is not None else "out of memory on another rank")
        self.error = error


def any_rank(flags: tuple[bool, ...], ctx: DistributedContext) -> tuple[bool, ...]:
    """Whether each flag is set on any rank: one synchronous all-reduce on the CPU vote group."""
    if ctx.votes is None:
        return flags
    vote = torch.tensor([int(flag) for flag in flags], dtype=torch.int32)
    dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=ctx.votes)
    return tuple(bool(flag) for flag in vote.tolist())


class LossWatch:
    """This rank's step losses, each checked at the next vote: the loss is copied to the host without
    waiting for the device, so the check never stalls a step (on CPU the copy is immediate)."""

    def __init__(self, learning_rate: float):
        self.learning_rate = learning_rate
        self.pending: tuple[int, int, torch.Tensor, object | None] | None = None

    def record(self, epoch: int, step: int, step_totals: Totals, rows: int) -> None:
        loss = (step_totals.loss_sum / rows).to("cpu", non_blocking=True)
        event = family_of(step_totals.loss_sum.device).completion_event()
        self.pending = (epoch, step, loss, event)

    def vote(self, out_of_memory: bool, ctx: DistributedContext) -> bool:
        """Every rank's vote on the step it runs (out of memory?) and on its last recorded loss
        (finite?). Raises `TrainingDiverged` on every rank alike when any rank's loss was not finite;
        otherwise returns whether any rank ran out of memory."""
        epoch, step, loss = self.take()
        diverged_here = loss is not None and not math.isfinite(loss)
        out_of_memory, diverged = any_rank((out_of_memory, diverged_here), ctx)
        if diverged:
            raise TrainingDiverged.at(
                epoch + 1, step + 1, loss if diverged_here else None, self.learning_rate
            )
        return out_of_memory

    def take(self) -> tuple[int, int, float | None]:
        if self.pending is None:
            return 0, 0, None
        epoch, step, loss, event = self.pending
        self.pending = None
        if event is not None:
            event.synchronize()
        return epoch, step, loss.item()


class StopVote:
    """Whether every rank stops after this step, on the preemption notice of any of them.

    A notice may reach only some ranks (one node of several is reclaimed), so the ranks vote: one
    4-byte all-reduce per step on the gloo vote group, read one step later so that it overlaps
    the next step instead of stalling it (and never syncs a CUDA stream). Every rank reads the same
    result after the same step, so no rank is left waiting in a collective.
    """

    def __init__(self, notice: PreemptionNotice, ctx: DistributedContext):
        self.notice = notice
        self.group = ctx.votes
        self.pending: tuple | None = None

    def stop_now(self) -> bool:
        if self.group is None:
            return self.notice.received
        decided = False
        if self.pending is not None:
            work, votes = self.pending
            work.wait()
            decided = bool(votes.item())
        vote = torch.tensor([int(self.notice.received)], dtype=torch.int32)
        self.pending = (dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=self.group, async_op=True), vote)
        return decided

    def close(self) -> None:
        if self.pending is not None:
            self.pending[0].wait()
            self.pending = None


def wrap_in_ddp(model: nn.Module) -> DistributedDataParallel:
    """DDP for its start-up broadcast of parameters and buffers and its flat gradient buckets; the
    loop reduces the gradients itself (`optimizer_step`), so DDP never communicates after that.

    Forward syncs no buffers: a rank that ran out of memory leaves the step at another micro-batch
    than its peers, and a collective in forward would then go unmatched (`share_rank0_buffers`
    instead, between epochs).
    """
    # DDP turns only gradients that exist when it is built into views of its buckets; later ones
    # become views in a synced backward, which this loop never runs, and would be a second copy.
    for parameter in model.parameters():
        if parameter.requires_grad:
            parameter.grad = torch.zeros_like(parameter)
    return DistributedDataParallel(model, gradient_as_bucket_view=True, **no_forward_buffer_sync())


def no_forward_buffer_sync() -> dict:
    """torch 2.13 renamed DDP's `broadcast_buffers` to `forward_sync_buffers` (the old name warns);
    earlier releases, as on GPU images built on them, know only the old one."""
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def accumulate_gradients(run: LoopState, rows: tuple[torch.Tensor, torch.Tensor], micro: int) -> Totals:
    """Forward and backward over the step's `rows` (x, y) in micro-batches of `micro`, gradients
    summed on this rank.

    Under DDP no backward communicates (`no_sync`): a rank that runs out of memory mid-step would
    leave the bucket all-reduces it had started unmatched on its peers.
    """
    model, dtype = run.ddp_model, run.dtype
    chunks = list(zip(*(column.split(micro) for column in rows), strict=True))
    totals = Totals(run.ctx.device)
    # Per-step Python and small-op overhead shows on fast devices: no autocast context or loss
    # rescaling unless they do something.
    autocast = torch.autocast(run.ctx.device.type, dtype=dtype) if dtype is not None else nullcontext()
    local = model.no_sync() if isinstance(model, DistributedDataParallel) else nullcontext()
    with local:
        for x, y in chunks:
            with autocast:
                logits = model(x)
                loss = F.cross_entropy(logits.float(), y)
            share = loss if len(chunks) == 1 else loss * (len(y) / len(rows[1]))
            run.scaler.scale(share).backward()
            totals.add(loss.detach() * len(y), logits, y)
    return totals


def optimizer_step(run: LoopState, rows: tuple[torch.Tensor, torch.Tensor]) -> Totals:
    """One optimizer step over `rows` (x, y), in micro-batches of `run.micro.size`; returns its loss and
    accuracy sums as device tensors (no host sync per step).

    Every rank votes on whether any of them ran out of memory (and, in the same vote, whether the
    previous step's loss was finite: `LossWatch`). If one did, every rank drops the step (gradients
    zeroed) and raises `StepOutOfMemory`, so that all retry it together; otherwise the gradients are
    averaged over the ranks and the optimizer steps.
    """
    ctx, optimizer, scaler = run.ctx, run.optimizer, run.scaler
    error = None
    try:
        totals = accumulate_gradients(run, rows, run.micro.size)
    except torch.OutOfMemoryError as caught:
        # Kept without its traceback, whose frames hold the failed attempt's activations.
        error = caught.with_traceback(None)
    if run.watch.vote(error is not None, ctx):
        zero_gradients(optimizer, ctx)
        ctx.family.release_cached_memory()
        raise StepOutOfMemory(error)
    if ctx.is_distributed:
        average_gradients(run.ddp_model, ctx.world_size)
    scaler.step(optimizer)
    scaler.update()
    zero_gradients(optimizer, ctx)
    return totals


def zero_gradients(optimizer, ctx: DistributedContext) -> None:
    # Under DDP the gradients are views of its buckets: zeroed in place, never freed (`wrap_in_ddp`).
    optimizer.zero_grad(set_to_none=not ctx.is_distributed)


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


def share_rank0_buffers(model: nn.Module, ctx: DistributedContext) -> None:
    """Every rank takes rank 0's buffers (batch-norm statistics, say), which are what rank 0 saves.

    Called between epochs, where every rank is sure to take part. Rank 0's buffers follow its own
    batches alone, as they do under DDP's default broadcast before each forward.
    """
    if ctx.is_distributed:
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)


@dataclass
class LoopState:
    """What the training loop needs, in one place: the model, its optimizer and precision, this
    rank's training rows, where the run is, and the votes that every step takes part in.

    `step` is one optimizer step behind the collective out-of-memory guard, `train_epoch` one pass
    over the shard, and `state_dict` / `load_state_dict` the checkpoint, built and restored side by side.
    """

    config: TrainConfig
    ctx: DistributedContext
    model: nn.Module  # what is saved: the module itself, never its DDP wrapper
    ddp_model: nn.Module  # what trains: the DDP wrapper under several ranks, else `model`
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    dtype: torch.dtype | None  # autocast dtype; None for full float32
    micro: MicroBatch
    rows: TrainingRows  # this rank's training and validation rows, where the plan placed them
    watch: LossWatch
    reporter: ProgressReporter
    checkpoint: TrainingCheckpoint | None = None
    stop: StopVote | None = None
    progress: TrainingProgress = field(default_factory=TrainingProgress)
    optimizer_steps: int = 0  # over the whole run, across attempts
    # This rank's loss sum and correct count over the steps done before a resume in mid-epoch.
    carried: tuple[float, int] = (0.0, 0)

    @classmethod
    def start(cls, config, ctx, model, rows, checkpoint, preemption) -> LoopState:
        """A fresh run of `model` on `rows` (`TrainingRows`), resumed from `checkpoint`'s saved state, if any."""
        micro = config.micro_batch_size(ctx.world_size)
        ddp_model = wrap_in_ddp(model) if ctx.is_distributed else model
        optimizer = build_optimizer(model, config, ctx.device)
        dtype = autocast_dtype(ctx.device, config.precision)
        run = cls(
            config, ctx, model, ddp_model, optimizer,
            scaler=torch.amp.GradScaler(ctx.device.type, enabled=dtype == torch.float16),
            dtype=dtype,
            micro=MicroBatch(micro, minimum=min(micro, config.min_micro_batch_size)),
            rows=rows,
            watch=LossWatch(config.learning_rate),
            reporter=ProgressReporter(config.epochs, enabled=ctx.rank == 0),
            checkpoint=checkpoint,
            stop=StopVote(preemption, ctx) if preemption is not None else None,
        )  # fmt: skip
        if checkpoint is not None:
            run.load_state_dict(checkpoint.load())
        return run

    def step(self, rows: tuple[torch.Tensor, torch.Tensor], step: int) -> Totals:
        """The optimizer step, retried with half the micro-batch on every rank while any runs out of memory."""
        while True:
            try:
                return optimizer_step(self, rows)
            except StepOutOfMemory as dropped:
                self.micro.halve(dropped.error, step, len(rows[1]))

    def train_epoch(self, epoch: int) -> tuple[float, float, int]:
        """One pass over this rank's shard, from `progress.step` on (non-zero when resuming mid-epoch).

        Returns global (mean loss, accuracy, samples) for the whole epoch.
        """
        config, ctx, progress = self.config, self.ctx, self.progress
        self.ddp_model.train()
        per_step = config.micro_batch_size(ctx.world_size) * config.grad_accum_steps
        steps = config.steps_per_epoch(self.rows.rows, ctx.world_size)
        totals, self.carried = Totals(ctx.device, *self.carried), (0.0, 0)
        mean_loss = lambda: totals.loss_sum.item() / (progress.step * per_step)  # noqa: E731
        # Closed on a stop or an error too, so that a background reader ends with the epoch.
        with closing(self.rows.epoch(config, epoch, progress.step, steps, per_step)) as batches:
            for step, rows in enumerate(batches, start=progress.step):
                for group in self.optimizer.param_groups:
                    group["lr"] = config.learning_rate_at(epoch * steps + step, config.epochs * steps)
                done = self.step(rows, step)
                self.watch.record(epoch, step, done, per_step)
                totals.add_totals(done)
                progress.step, self.optimizer_steps = step + 1, self.optimizer_steps + 1
                self.reporter.step(epoch, progress.step, steps, mean_loss)
                if self.stop is not None and self.stop.stop_now():
                    self.stop_on_notice(totals)
                if self.checkpoint is not None and self.checkpoint.due(progress.step):
                    self.save(totals)
        self.watch.vote(False, ctx)  # the epoch's last step, before anything reads or saves its result
        loss_total, correct_total, seen = totals.all_reduced(steps * per_step, ctx)
        return loss_total / seen, correct_total / seen, seen

    def stop_on_notice(self, totals: Totals) -> None:
        """Every rank saves the step just done (with a checkpoint) and raises the notice's `Preempted`."""
        if self.checkpoint is not None:
            self.save(totals)
        else:
            log.warning("preemption notice without a checkpoint: the steps done so far are lost")
        self.stop.close()
        raise self.stop.notice.stopped(self.progress.epoch, self.progress.step)

    def save(self, totals: Totals | None = None) -> None:
        """Collective: rank 0 saves the checkpoint; `totals` are the running sums of an unfinished epoch."""
        self.watch.vote(False, self.ctx)  # never a checkpoint of a diverged model
        state = self.state_dict(totals)
        if state is not None:
            self.checkpoint.save(state)

    def state_dict(self, totals: Totals | None = None) -> dict | None:
        """Collective: every rank contributes its RNG state and running sums; rank 0 gets the state."""
        ctx, progress = self.ctx, self.progress
        loss_sum, correct = (
            (totals.loss_sum.item(), totals.correct.item()) if totals is not None else (0.0, 0)
        )
        ranks = gather({**rng_state(ctx), "loss_sum": loss_sum, "correct": correct}, ctx)
        if ctx.rank != 0:
            return None
        return {
            **progress.to_dict(),
            "model": {name: tensor.detach().cpu() for name, tensor in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "optimizer_steps": self.optimizer_steps,
            "micro_batch": self.micro.size,
            "world_size": ctx.world_size,
            "ranks": ranks,
        }

    def load_state_dict(self, state: dict | None) -> None:
        """What `state_dict` saved, back in place on this rank; nothing when `state` is None."""
        if state is None:
            return
        ctx = self.ctx
        if state["world_size"] != ctx.world_size:
            raise ValueError(
                f"the checkpoint was written by {state['world_size']} workers but {ctx.world_size} are running; "
                "resume with the same number of workers"
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.micro.size = state["micro_batch"]
        mine = state["ranks"][ctx.rank]
        torch.set_rng_state(mine["cpu"])
        ctx.family.set_rng_state(mine["device"], ctx.device)
        self.progress = TrainingProgress.from_dict(state)
        self.carried, self.optimizer_steps = (mine["loss_sum"], mine["correct"]), state["optimizer_steps"]

    def close(self) -> None:
        if self.stop is not None:
            self.stop.close()

    def outcome(self, shard_rows, samples: int, training_seconds: float, seconds: float) -> TrainOutcome:
        """What this rank returns: the run's record and where the micro-batch ended."""
        config, ctx, dtype = self.config, self.ctx, self.dtype
        run = TrainingRun(
            framework="pytorch",
            model=config.model,
            device=ctx.family.describe(ctx.device),
            world_size=ctx.world_size,
            backend=ctx.backend,
            precision=str(dtype).removeprefix("torch.") if dtype else "float32",
            strategy="DDP" if ctx.world_size > 1 else "single-process",
            history=self.progress.history,
            samples_per_second=samples / training_seconds if training_seconds > 0 else 0.0,
            train_seconds=seconds,
            peak_device_memory_bytes=ctx.family.peak_memory(ctx.device),
        )
        return TrainOutcome(
            run=run,
            rank=ctx.rank,
            shard_rows=np.asarray(shard_rows).tolist(),
            optimizer_steps=self.optimizer_steps,
            micro_batch_size=self.micro.size,
            grad_accum_steps=-(
                -config.micro_batch_size(ctx.world_size) * config.grad_accum_steps // self.micro.size
            ),
            model=self.model,
        )


def load_shards(config: TrainConfig, splits: SplitPaths, ctx: DistributedContext) -> TrainingRows:
    """This rank's parts of the training and validation splits, placed as `config.data_placement`
    says ("auto", where no plan for this machine chose: by the memory of the machine it runs on)."""
    train_part, val_part = (rank_part(path, ctx.rank, ctx.world_size) for path in (splits.train, splits.val))
    placement = config.data_placement
    if placement == "auto":
        ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # set by torchrun and torch elastic
        rows = train_part.rows + val_part.rows
        placement = auto_placement(rows, len(splits.feature_names), ctx.device, ranks_here)
        if ctx.rank == 0:
            log.info("training rows: %s (auto, %s rows a rank on %s)", placement, f"{rows:,}", ctx.device)
    columns = (splits.feature_names, splits.label_column)
    return TrainingRows(placement, train_part, val_part, columns, ctx.device)


def set_up(config: TrainConfig, splits: SplitPaths, ctx: DistributedContext):
    """This rank's rows and its model on the device: what fails, if it does, before any collective."""
    rows = load_shards(config, splits, ctx)
    config.steps_per_epoch(rows.rows, ctx.world_size)  # refuses a shard too small for one optimizer step
    model = build(config.model, len(splits.feature_names), splits.n_classes, "pytorch").to(ctx.device)
    return rows, model


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
    failures = [failure for failure in gather(mine, ctx, ctx.votes) if failure is not None]
    if failures:
        _, rank, cause = min(failures)
        raise SetUpFailed(f"rank {rank} of {ctx.world_size} failed before training: {cause}") from error
    return result


def event_writer(log_dir: str):
    # Imported here: torch's TensorBoard writer imports all of TensorFlow when it is installed.
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir)


def train(
    config: TrainConfig,
    splits: SplitPaths,
    artifact_path: str | None = None,
    checkpoint: TrainingCheckpoint | None = None,
    log_dir: str | None = None,
    preemption: PreemptionNotice | None = None,
) -> TrainOutcome:
    """Train the model `config.model` names on this rank's shard; rank 0 writes the artifact to `artifact_path`.

    With a `checkpoint`, the run resumes from its saved state, if any, and saves after every epoch
    and every `checkpoint.every_steps` optimizer steps. With a `log_dir`, rank 0 writes TensorBoard
    scalars there every epoch. With a `preemption` notice, the ranks stop together after the step
    during which the notice arrived, save that step and raise `Preempted`.
    """
    config.validate()  # as the workflow did already; a direct caller's config gets the same message
    ctx = init_distributed(config.collective_timeout_s)
    torch.manual_seed(config.seed)
    if ctx.family.deterministic:
        torch.use_deterministic_algorithms(True)
    rows, model = agreed_set_up(lambda: set_up(config, splits, ctx), ctx)
    run = LoopState.start(config, ctx, model, rows, checkpoint, preemption)
    progress, eval_batch = run.progress, max(config.micro_batch_size(ctx.world_size), 1024)
    board = event_writer(log_dir) if log_dir and ctx.rank == 0 else None

    ctx.family.reset_peak_memory(ctx.device)
    samples, training_seconds, start = 0, 0.0, time.perf_counter()
    for epoch in range(progress.epoch, config.epochs):
        epoch_start = time.perf_counter()
        train_loss, train_acc, seen = run.train_epoch(epoch)
        training_seconds += time.perf_counter() - epoch_start  # the loop alone: no validation, no saving
        share_rank0_buffers(model, ctx)
        val_loss, val_acc = evaluate_shard(run.ddp_model, rows.validation(eval_batch), ctx, run.dtype)
        samples += seen
        metrics = EpochMetrics(epoch + 1, train_loss, train_acc, val_loss, val_acc)
        progress.finish_epoch(metrics)
        run.reporter.epoch_end()
        if board is not None:
            write_epoch_scalars(board, metrics, samples / max(training_seconds, 1e-9))
        if checkpoint is not None:
            run.save()
        if ctx.rank == 0:
            log_epoch(metrics, config.epochs)
    run.close()
    ctx.family.synchronize(ctx.device)
    seconds = time.perf_counter() - start
    if board is not None:
        board.close()

    if ctx.rank == 0 and artifact_path:
        spec = input_spec_for(config.model, len(splits.feature_names), splits.n_classes)
        save_torch_artifact(model, config.model, spec, artifact_path)
    return run.outcome(rows.train.row_ids(), samples, training_seconds, seconds)


def write_epoch_scalars(board, epoch: EpochMetrics, samples_per_second: float) -> None:
    board.add_scalar("loss/train", epoch.train_loss, epoch.epoch)
    board.add_scalar("loss/val", epoch.val_loss, epoch.epoch)
    board.add_scalar("accuracy/train", epoch.train_accuracy, epoch.epoch)
    board.add_scalar("accuracy/val", epoch.val_accuracy, epoch.epoch)
    board.add_scalar("throughput/samples_per_second", samples_per_second, epoch.epoch)
    board.flush()


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
