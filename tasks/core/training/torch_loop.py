"""The torch loop's state across steps and epochs: the model, its optimizer and precision, this rank's
rows, the votes every step takes part in, the guarded and fast paths, checkpoints and the kept epoch."""

# Under DDP a step runs on one of two paths (`LoopState.on_fast_path`). The fast path is DDP's own:
# the step's last backward is synced, and DDP all-reduces each gradient bucket as soon as its
# gradients are ready, overlapping the rest of the backward, the step's flags (`StepVotes`) riding in
# the first bucket as the gradient of a parameter of their own; the optimizer steps; the flags are
# read a step later. It cannot drop a step that ran out of memory on one rank (its peers are inside
# DDP's all-reduces), so that rank fails the attempt (`OutOfMemoryOnFastPath`). The guarded path,
# below, runs for the first GUARDED_STEPS steps of every attempt, for GUARDED_STEPS steps after every
# out-of-memory halving, and, in an attempt resumed from a checkpoint, until its first save: a retry
# replays guarded the steps in which the last attempt ran out of memory. docs/reliability.md has the
# reasons and the bounds.
#
# One optimizer step on the guarded path, in order (`LoopState.train_epoch`, the flags in
# `tasks.core.training.votes`):
#   1. the learning rate of the step, by the schedule;
#   2. forward and backward over the step's batch in micro-batches, no gradient exchanged yet
#      (`LoopState.accumulate_gradients`);
#   3. the gradients averaged over the ranks in DDP's buckets, in place (`average_gradients`), the
#      step's flags among them: did any rank run out of memory in this step, was any one's loss not
#      finite, has any had a preemption notice? A divergence raises `TrainingDiverged` on every rank;
#      out of memory drops the step on every rank, which halve the micro-batch and retry it
#      (`LoopState.step`);
#   4. the optimizer step, gradients zeroed;
#   5. on a preemption notice every rank saves and stops; else a checkpoint where one is due.
# After each epoch's validation, rank 0 copies the weights aside if the epoch is the best so far, and
# every rank decides alike whether to stop early (`EpochChoice`); at the end the model takes the best
# epoch's weights back (`LoopState.take_kept_weights`).

from __future__ import annotations

import logging
from contextlib import closing, nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function

from tasks.core.models.plugins import TrainingDiverged
from tasks.core.training import ranges
from tasks.core.training.checkpoint import TrainingCheckpoint
from tasks.core.training.config import TrainConfig
from tasks.core.training.progress import EpochChoice, ProgressReporter, TrainingProgress
from tasks.core.training.records import TrainingRun
from tasks.core.training.rows import TrainingRows
from tasks.core.training.torch_ddp import DistributedContext, gather, rng_state, wrap_in_ddp
from tasks.core.training.torch_step import (
    MicroBatch,
    OutOfMemoryOnFastPath,
    StepOutOfMemory,
    StepSums,
    Totals,
    autocast_dtype,
    build_optimizer,
    mean_loss,
)
from tasks.core.training.votes import Divergence, StepVotes, VoteCarrier, average_gradients

log = logging.getLogger(__name__)


# Optimizer steps on the guarded path at the start of each attempt and after each out-of-memory
# halving. The planner's micro-batch is measured, and a step's memory peaks from the second step on
# (AdamW allocates its moments in the first), so an out-of-memory error after these is rare.
GUARDED_STEPS = 8


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
class LoopState:
    """What the training loop needs, in one place: the model, its optimizer and precision, this
    rank's training rows, where the run is, and the votes that every step takes part in.

    `train_epoch` is one pass over the shard; `step` one optimizer step behind the collective
    out-of-memory guard, each attempt an `optimizer_step` over `accumulate_gradients`; and
    `state_dict` / `load_state_dict` the checkpoint, built and restored side by side.
    """

    config: TrainConfig
    ctx: DistributedContext
    model: nn.Module  # what is saved: the module itself, never its DDP wrapper
    ddp_model: nn.Module  # what trains: the DDP wrapper under several ranks, else `model`
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    dtype: torch.dtype | None  # autocast dtype; None for full float32
    micro: MicroBatch
    training_rows: TrainingRows  # this rank's training and validation rows, where the plan placed them
    votes: StepVotes
    reporter: ProgressReporter
    checkpoint: TrainingCheckpoint | None = None
    progress: TrainingProgress = field(default_factory=TrainingProgress)
    optimizer_steps: int = 0  # over the whole run, across attempts
    # This rank's loss sum and correct count over the steps done before a resume in mid-epoch.
    carried: tuple[float, int] = (0.0, 0)
    # A CPU copy of the best epoch's state dict so far, on rank 0 alone (`copy_if_best`).
    best_weights: dict[str, torch.Tensor] | None = None
    # The guarded path runs while `optimizer_steps` is below this, or until the first save of an
    # attempt resumed from a checkpoint (`on_fast_path`).
    guarded_until: int = GUARDED_STEPS
    guarded_until_save: bool = False
    # Each class's loss weight on the device (`config.class_weight`); None: every row weighs alike.
    class_weights: torch.Tensor | None = None
    where: tuple[int, int] = (0, 0)  # the epoch and step running, as the step's flags record them

    @property
    def choice(self) -> EpochChoice:
        return EpochChoice.of(self.config)

    @classmethod
    def start(cls, config, ctx, model, training_rows, checkpoint, preemption) -> LoopState:
        """A fresh run of `model` on `training_rows`, resumed from `checkpoint`'s saved state, if any."""
        micro = config.micro_batch_size(ctx.world_size)
        ddp_model = wrap_in_ddp(VoteCarrier(model), ctx.device) if ctx.is_distributed else model
        optimizer = build_optimizer(model, config, ctx.device)
        dtype = autocast_dtype(ctx.device, config.precision)
        state = cls(
            config, ctx, model, ddp_model, optimizer,
            scaler=torch.amp.GradScaler(ctx.device.type, enabled=dtype == torch.float16),
            dtype=dtype,
            micro=MicroBatch(micro, minimum=min(micro, config.min_micro_batch_size)),
            training_rows=training_rows,
            votes=StepVotes(preemption, ddp_model.module.flags if ctx.is_distributed else None),
            reporter=ProgressReporter(config.epochs, enabled=ctx.rank == 0),
            checkpoint=checkpoint,
        )  # fmt: skip
        if checkpoint is not None:
            saved = checkpoint.load()
            state.load_state_dict(saved)
            state.guarded_until_save = saved is not None
        state.guarded_until = state.optimizer_steps + GUARDED_STEPS
        return state

    def on_fast_path(self) -> bool:
        """Whether this step runs DDP's synced, overlapped backward; the same answer on every rank,
        from the step count and the saves, which all share."""
        return (
            self.ctx.is_distributed
            and not self.guarded_until_save
            and self.optimizer_steps >= self.guarded_until
        )

    def train_epoch(self, epoch: int) -> tuple[float, float, int]:
        """One pass over this rank's shard, from `progress.step` on (non-zero when resuming mid-epoch).

        Returns global (mean loss, accuracy, samples) for the whole epoch.
        """
        config, ctx, progress = self.config, self.ctx, self.progress
        self.ddp_model.train()
        per_step = config.micro_batch_size(ctx.world_size) * config.grad_accum_steps
        steps = config.steps_per_epoch(self.training_rows.train.rows, ctx.world_size)
        totals, self.carried = Totals(ctx.device, *self.carried), (0.0, 0)
        mean_loss = lambda: totals.read()[0] / (progress.step * per_step)  # noqa: E731
        # Closed on a stop or an error too, so that a background reader ends with the epoch.
        with closing(self.training_rows.epoch(config, epoch, progress.step, steps, per_step)) as batches:
            for step, batch in enumerate(batches, start=progress.step):
                for group in self.optimizer.param_groups:
                    group["lr"] = config.learning_rate_at(epoch * steps + step, config.epochs * steps)
                self.where = (epoch, step)
                self.step(batch, step, totals)
                progress.step, self.optimizer_steps = step + 1, self.optimizer_steps + 1
                self.reporter.step(epoch, progress.step, steps, mean_loss)
                self.after_step(totals, self.checkpoint is not None and self.checkpoint.due(progress.step))
        with record_function(ranges.EPOCH_END):
            # The epoch's last flags, before anything reads or saves its result.
            self.after_step(totals, due=False, last=True)
            loss_total, correct_total, seen = totals.all_reduced(steps * per_step, ctx)
        return loss_total / seen, correct_total / seen, seen

    def after_step(self, totals: Totals, due: bool, last: bool = False) -> None:
        """Between steps: every rank stops on a preemption notice, saving the step just done, or
        saves where a checkpoint is `due`; the flags still pending are read first where either
        comes, and at the `last` step of an epoch."""
        if due or last:
            self.check_last_loss()
        if self.votes.stop_agreed:
            self.stop_on_notice(totals)
        if due:
            self.save(totals)

    def step(self, batch: tuple[torch.Tensor, torch.Tensor], step: int, totals: Totals) -> None:
        """The optimizer step, retried with half the micro-batch on every rank while any runs out of memory;
        its loss and correct answers added to the epoch's `totals` once it has run."""
        while True:
            try:
                return self.optimizer_step(batch, totals)
            except StepOutOfMemory as dropped:
                self.micro.halve(dropped.error, step, len(batch[1]))
                self.guarded_until = self.optimizer_steps + GUARDED_STEPS

    def optimizer_step(self, batch: tuple[torch.Tensor, torch.Tensor], totals: Totals) -> None:
        """One optimizer step over `batch` (x, y) in micro-batches of `micro.size`, on the fast path
        or the guarded one; its sums stay on the device (no host sync per step)."""
        if self.on_fast_path():
            return self.synced_step(batch, totals)
        return self.guarded_step(batch, totals)

    def synced_step(self, batch: tuple[torch.Tensor, torch.Tensor], totals: Totals) -> None:
        """The fast path: DDP averages the gradients, and the step's flags, during the step's last
        backward, and no vote waits before the optimizer steps. An out-of-memory error here fails
        this rank's attempt."""
        sums = StepSums()
        try:
            self.accumulate_gradients(batch, self.micro.size, sums)
        except torch.OutOfMemoryError as caught:
            error = caught.with_traceback(None)  # its frames hold the attempt's activations
            raise OutOfMemoryOnFastPath(self.optimizer_steps, self.micro.size) from error
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.zero_gradients()
        totals.add_step(sums, len(batch[1]))
        self.raise_if_diverged(self.votes.synced(*self.where, sums.loss))

    def guarded_step(self, batch: tuple[torch.Tensor, torch.Tensor], totals: Totals) -> None:
        """The guarded path: the step's gradients summed on each rank with no communication, then
        averaged over the ranks with the step's flags.

        Every rank learns whether any of them ran out of memory in this step (and, from the same
        all-reduce, whether any one's loss was not finite). If one did, every rank drops the step
        (gradients zeroed) and raises `StepOutOfMemory`, so that all retry it together; otherwise the
        optimizer steps. Alone, a rank drops the step on its own error and reads its loss a step late.
        """
        sums, error = StepSums(), None
        try:
            self.accumulate_gradients(batch, self.micro.size, sums)
        except torch.OutOfMemoryError as caught:
            # Kept without its traceback, whose frames hold the failed attempt's activations.
            error = caught.with_traceback(None)
        if self.ctx.is_distributed:
            self.votes.ride(sums.loss, error is not None)
            average_gradients(self.ddp_model, self.ctx.world_size)
            out_of_memory, diverged = self.votes.decide_now(*self.where, sums.loss)
        else:
            out_of_memory, diverged = error is not None, self.votes.pend(*self.where, sums.loss)
        self.raise_if_diverged(diverged)
        if out_of_memory:
            self.zero_gradients()
            self.ctx.family.release_cached_memory()
            raise StepOutOfMemory(error)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.zero_gradients()
        totals.add_step(sums, len(batch[1]))

    def accumulate_gradients(
        self, batch: tuple[torch.Tensor, torch.Tensor], micro: int, sums: StepSums
    ) -> None:
        """Forward and backward over `batch` (x, y) in micro-batches of `micro`, gradients summed on
        this rank, the step's loss and correct answers added up in `sums` (those of the micro-batches
        done, where one runs out of memory).

        Under DDP on the guarded path no backward communicates (`no_sync`): a rank that runs out of
        memory mid-step would leave the bucket all-reduces it had started unmatched on its peers. On
        the fast path the last micro-batch's backward is synced: DDP all-reduces the summed gradients
        bucket by bucket as the backward produces them, the step's flags a root of that backward.
        """
        model, dtype, rows = self.ddp_model, self.dtype, len(batch[1])
        # Per-step Python and small-op overhead shows on fast devices: no split, autocast context or
        # loss rescaling unless they do something.
        chunks = (
            [batch] if rows <= micro else list(zip(*(column.split(micro) for column in batch), strict=True))
        )
        autocast = torch.autocast(self.ctx.device.type, dtype=dtype) if dtype is not None else nullcontext()
        last_synced = self.on_fast_path()
        for index, (x, y) in enumerate(chunks):
            synced = last_synced and index == len(chunks) - 1
            with model.no_sync() if self.ctx.is_distributed and not synced else nullcontext():
                with autocast:
                    logits = model(x)
                    loss = mean_loss(logits.float(), y, self.class_weights)
                share = loss if len(chunks) == 1 else loss * (len(y) / rows)
                sums.add(share, logits, y)
                if synced:
                    torch.autograd.backward(*self.votes.roots(self.scaler.scale(share), sums.loss))
                else:
                    self.scaler.scale(share).backward()

    def zero_gradients(self) -> None:
        # Under DDP the gradients are views of its buckets: zeroed in place, never freed (`wrap_in_ddp`);
        # the flags' gradient is zeroed where it is read (`StepVotes`).
        self.optimizer.zero_grad(set_to_none=not self.ctx.is_distributed)

    def check_last_loss(self) -> None:
        """The flags still pending read, alike on every rank (`raise_if_diverged`)."""
        self.raise_if_diverged(self.votes.settle())

    def raise_if_diverged(self, diverged: Divergence | None) -> None:
        """`TrainingDiverged`, raised alike on every rank, where the vote found a loss that was not finite."""
        if diverged is not None:
            raise TrainingDiverged.at(
                diverged.epoch + 1, diverged.step + 1, diverged.loss, self.config.learning_rate
            )

    def stop_on_notice(self, totals: Totals) -> None:
        """Every rank saves the step just done (with a checkpoint) and raises the notice's `Preempted`."""
        if self.checkpoint is not None:
            self.save(totals)
        else:
            log.warning("preemption notice without a checkpoint: the steps done so far are lost")
        self.votes.close()
        raise self.votes.notice.stopped(self.progress.epoch, self.progress.step)

    def save(self, totals: Totals | None = None) -> None:
        """Collective: rank 0 saves the checkpoint; `totals` are the running sums of an unfinished epoch."""
        self.check_last_loss()  # never a checkpoint of a diverged model
        saved = self.state_dict(totals)
        if saved is not None:
            self.checkpoint.save(saved)
        self.guarded_until_save = False

    def state_dict(self, totals: Totals | None = None) -> dict | None:
        """Collective: every rank contributes its RNG state and running sums; rank 0 gets the state."""
        ctx, progress = self.ctx, self.progress
        loss_sum, correct = totals.read() if totals is not None else (0.0, 0)
        ranks = gather({**rng_state(ctx), "loss_sum": loss_sum, "correct": correct}, ctx)
        if ctx.rank != 0:
            return None
        return {
            **progress.to_dict(),
            "model": {name: tensor.detach().cpu() for name, tensor in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "best_weights": self.best_weights,
            "optimizer_steps": self.optimizer_steps,
            "micro_batch": self.micro.size,
            "world_size": ctx.world_size,
            "ranks": ranks,
        }

    def load_state_dict(self, saved: dict | None) -> None:
        """What `state_dict` saved, back in place on this rank; nothing when `saved` is None."""
        if saved is None:
            return
        ctx = self.ctx
        if saved["world_size"] != ctx.world_size:
            raise ValueError(
                f"the checkpoint was written by {saved['world_size']} workers but {ctx.world_size} are running; "
                "resume with the same number of workers"
            )
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scaler.load_state_dict(saved["scaler"])
        self.micro.size = saved["micro_batch"]
        mine = saved["ranks"][ctx.rank]
        torch.set_rng_state(mine["cpu"])
        ctx.family.set_rng_state(mine["device"], ctx.device)
        self.progress = TrainingProgress.from_dict(saved)
        self.best_weights = saved.get("best_weights") if ctx.rank == 0 else None
        self.carried, self.optimizer_steps = (mine["loss_sum"], mine["correct"]), saved["optimizer_steps"]

    def copy_if_best(self) -> None:
        """Rank 0 copies the weights aside when the epoch just validated is the best so far."""
        if self.ctx.rank == 0 and self.choice.keeps_copy(self.progress.history):
            self.best_weights = {
                name: tensor.detach().to("cpu", copy=True) for name, tensor in self.model.state_dict().items()
            }

    def take_kept_weights(self) -> None:
        """Collective: the model takes back the best epoch's weights where a later epoch ended the
        run; rank 0 loads its copy and the other ranks receive it from rank 0."""
        if not self.choice.restores_copy(self.progress.history):
            return
        if self.ctx.rank == 0:
            self.model.load_state_dict(self.best_weights)
        if self.ctx.is_distributed:
            with torch.no_grad():
                for tensor in (*self.model.parameters(), *self.model.buffers()):
                    dist.broadcast(tensor, src=0)

    def close(self) -> None:
        self.votes.close()

    def outcome(
        self, shard_rows, samples: int, training_seconds: float, seconds: float, regression: bool
    ) -> TrainOutcome:
        """What this rank returns: the run's record and where the micro-batch ended."""
        config, ctx, dtype = self.config, self.ctx, self.dtype
        kept_epoch, kept_reason = self.choice.kept(self.progress.history)
        run = TrainingRun(
            framework="pytorch",
            config=config,
            device_type=ctx.family.type,
            device_name=ctx.family.describe(ctx.device),
            world_size=ctx.world_size,
            backend=ctx.backend,
            precision=str(dtype).removeprefix("torch.") if dtype else "float32",
            strategy="DDP" if ctx.world_size > 1 else "single-process",
            history=self.progress.history,
            samples_per_second=samples / training_seconds if training_seconds > 0 else 0.0,
            train_seconds=seconds,
            peak_device_memory_bytes=ctx.family.peak_memory(ctx.device),
            kept_epoch=kept_epoch,
            kept_reason=kept_reason,
            regression=regression,
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
