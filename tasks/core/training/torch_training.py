"""The PyTorch training loop: one function per rank, DDP when launched with several workers.

Run under torchrun / torch elastic (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR set) it joins the
process group: NCCL on CUDA, gloo on CPU (`tasks.core.training.devices`). Run as a plain process it trains alone.
"""

# Under DDP a step runs on one of two paths (`LoopState.on_fast_path`). The fast path is DDP's own:
# the step's last backward is synced, and DDP all-reduces each gradient bucket as soon as its
# gradients are ready, overlapping the rest of the backward; the optimizer steps; the vote on the
# previous step's loss is launched asynchronously and read a step later. It cannot drop a step
# that ran out of memory on one rank (its peers are inside DDP's all-reduces), so that rank fails
# the attempt (`OutOfMemoryOnFastPath`). The guarded path, below, runs for the first GUARDED_STEPS
# steps of every attempt, for GUARDED_STEPS steps after every out-of-memory halving, and, in an
# attempt resumed from a checkpoint, until its first save: a retry replays guarded the steps in
# which the last attempt ran out of memory. docs/reliability.md has the reasons and the bounds.
#
# One optimizer step on the guarded path, in order (`LoopState.train_epoch`, the votes in
# `tasks.core.training.votes`):
#   1. the learning rate of the step, by the schedule;
#   2. forward and backward over the step's batch in micro-batches, no gradient exchanged yet
#      (`LoopState.accumulate_gradients`);
#   3. the ranks' vote (`StepVotes.after_backward`): did any run out of memory in this step, was any
#      one's last loss not finite? A divergence raises `TrainingDiverged` on every rank; out of memory
#      drops the step on every rank, which halve the micro-batch and retry it (`LoopState.step`);
#   4. the gradients averaged over the ranks (`average_gradients`), the optimizer step, gradients zeroed;
#   5. the step's loss on its way to the host, for the next vote (`StepVotes.record_loss`);
#   6. the preemption vote (`StepVotes.stop_after_step`), then a checkpoint where one is due.
# After each epoch's validation, rank 0 copies the weights aside if the epoch is the best so far, and
# every rank decides alike whether to stop early (`EpochChoice`); at the end the model takes the best
# epoch's weights back (`LoopState.take_kept_weights`).

from __future__ import annotations

import inspect
import logging
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

from tasks.core.data.files import parquet_split
from tasks.core.data.splits import SplitPaths
from tasks.core.messages import one_line
from tasks.core.models.memory import ddp_bucket_cap_mb
from tasks.core.models.plugins import TrainingDiverged, build, input_spec_for
from tasks.core.models.torch_models import save_torch_artifact
from tasks.core.training.checkpoint import TrainingCheckpoint
from tasks.core.training.config import TrainConfig, class_weights, describe_class_weights
from tasks.core.training.devices import DeviceFamily, family_of, local_family
from tasks.core.training.precision import for_torch
from tasks.core.training.preemption import PreemptionNotice
from tasks.core.training.progress import EpochChoice, ProgressReporter, TrainingProgress, log_epoch
from tasks.core.training.rank_part import rank_part
from tasks.core.training.records import EpochMetrics, TrainingRun
from tasks.core.training.rows import TrainingRows, auto_placement
from tasks.core.training.votes import Divergence, StepVotes, average_gradients

log = logging.getLogger(__name__)
T = TypeVar("T")
# Optimizer steps on the guarded path at the start of each attempt and after each out-of-memory
# halving. The planner's micro-batch is measured, and a step's memory peaks from the second step on
# (AdamW allocates its moments in the first), so an out-of-memory error after these is rare.
GUARDED_STEPS = 8


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
    during which the notice arrived, save that step and raise `Preempted`. The model ends with the
    weights of the epoch that `config.keep` names, and the run may stop early (`config.patience`).
    """
    config.validate()  # as the workflow did already; a direct caller's config gets the same message
    ctx = init_distributed(config.collective_timeout_s)
    torch.manual_seed(config.seed)
    if ctx.family.deterministic:
        torch.use_deterministic_algorithms(True)
    training_rows, model = agreed_set_up(lambda: set_up(config, splits, ctx), ctx)
    state = LoopState.start(config, ctx, model, training_rows, checkpoint, preemption)
    state.class_weights = loss_weights(config, splits, ctx)
    progress, eval_batch = state.progress, max(config.micro_batch_size(ctx.world_size), 1024)
    board = event_writer(log_dir) if log_dir and ctx.rank == 0 else None

    ctx.family.reset_peak_memory(ctx.device)
    samples, training_seconds, start = 0, 0.0, time.perf_counter()
    for epoch in range(progress.epoch, config.epochs):
        if state.choice.stops_early(progress.history):  # a resumed run too, saved after its last epoch
            break
        epoch_start = time.perf_counter()
        train_loss, train_acc, seen = state.train_epoch(epoch)
        training_seconds += time.perf_counter() - epoch_start  # the loop alone: no validation, no saving
        share_rank0_buffers(model, ctx)
        val_loss, val_acc = evaluate_shard(
            state.ddp_model, training_rows.validation(eval_batch), ctx, state.dtype, state.class_weights
        )
        samples += seen
        metrics = EpochMetrics(epoch + 1, train_loss, train_acc, val_loss, val_acc)
        progress.finish_epoch(metrics)
        state.copy_if_best()
        state.reporter.epoch_end()
        if board is not None:
            write_epoch_scalars(board, metrics, samples / max(training_seconds, 1e-9))
        if checkpoint is not None:
            state.save()
        if ctx.rank == 0:
            log_epoch(metrics, config.epochs, splits.regression)
    state.close()
    state.take_kept_weights()
    if ctx.rank == 0:
        log.info("kept epoch %d: %s", *state.choice.kept(progress.history))
    ctx.family.synchronize(ctx.device)
    seconds = time.perf_counter() - start
    if board is not None:
        board.close()

    if ctx.rank == 0 and artifact_path:
        spec = input_spec_for(config.model, len(splits.feature_names), splits.n_outputs)
        save_torch_artifact(model, config.model, spec, artifact_path)
    return state.outcome(training_rows.train.row_ids(), samples, training_seconds, seconds, splits.regression)


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


def set_up(
    config: TrainConfig, splits: SplitPaths, ctx: DistributedContext
) -> tuple[TrainingRows, nn.Module]:
    """This rank's rows and its model on the device: what fails, if it does, before any collective."""
    training_rows = load_shards(config, splits, ctx)
    # Refuses a shard too small for one optimizer step.
    config.steps_per_epoch(training_rows.train.rows, ctx.world_size)
    model = build(config.model, len(splits.feature_names), splits.n_outputs, "pytorch").to(ctx.device)
    return training_rows, model


def load_shards(config: TrainConfig, splits: SplitPaths, ctx: DistributedContext) -> TrainingRows:
    """This rank's parts of the training and validation splits, placed as `config.data_placement`
    says ("auto", where no plan for this machine chose: by the memory of the machine it runs on)."""
    train_part, val_part = (rank_part(path, ctx.rank, ctx.world_size) for path in (splits.train, splits.val))
    placement = config.data_placement
    if placement == "auto":
        ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # set by torchrun and torch elastic
        n_rows = train_part.rows + val_part.rows
        placement = auto_placement(n_rows, len(splits.feature_names), ctx.device, ranks_here)
        if ctx.rank == 0:
            log.info("training rows: %s (auto, %s rows a rank on %s)", placement, f"{n_rows:,}", ctx.device)
    columns = (splits.feature_names, splits.label_column)
    return TrainingRows(placement, train_part, val_part, columns, ctx.device)


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

    @property
    def choice(self) -> EpochChoice:
        return EpochChoice.of(self.config)

    @classmethod
    def start(cls, config, ctx, model, training_rows, checkpoint, preemption) -> LoopState:
        """A fresh run of `model` on `training_rows`, resumed from `checkpoint`'s saved state, if any."""
        micro = config.micro_batch_size(ctx.world_size)
        ddp_model = wrap_in_ddp(model, ctx.device) if ctx.is_distributed else model
        optimizer = build_optimizer(model, config, ctx.device)
        dtype = autocast_dtype(ctx.device, config.precision)
        state = cls(
            config, ctx, model, ddp_model, optimizer,
            scaler=torch.amp.GradScaler(ctx.device.type, enabled=dtype == torch.float16),
            dtype=dtype,
            micro=MicroBatch(micro, minimum=min(micro, config.min_micro_batch_size)),
            training_rows=training_rows,
            votes=StepVotes(ctx.vote_group, preemption),
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
        mean_loss = lambda: totals.loss_sum.item() / (progress.step * per_step)  # noqa: E731
        # Closed on a stop or an error too, so that a background reader ends with the epoch.
        with closing(self.training_rows.epoch(config, epoch, progress.step, steps, per_step)) as batches:
            for step, batch in enumerate(batches, start=progress.step):
                for group in self.optimizer.param_groups:
                    group["lr"] = config.learning_rate_at(epoch * steps + step, config.epochs * steps)
                synced = self.on_fast_path()
                done = self.step(batch, step)
                self.raise_if_diverged(self.votes.record_loss(epoch, step, done.loss_sum, per_step, synced))
                totals.add_totals(done)
                progress.step, self.optimizer_steps = step + 1, self.optimizer_steps + 1
                self.reporter.step(epoch, progress.step, steps, mean_loss)
                if self.votes.stop_after_step():
                    self.stop_on_notice(totals)
                if self.checkpoint is not None and self.checkpoint.due(progress.step):
                    self.save(totals)
        self.check_last_loss()  # the epoch's last step, before anything reads or saves its result
        loss_total, correct_total, seen = totals.all_reduced(steps * per_step, ctx)
        return loss_total / seen, correct_total / seen, seen

    def step(self, batch: tuple[torch.Tensor, torch.Tensor], step: int) -> Totals:
        """The optimizer step, retried with half the micro-batch on every rank while any runs out of memory."""
        while True:
            try:
                return self.optimizer_step(batch)
            except StepOutOfMemory as dropped:
                self.micro.halve(dropped.error, step, len(batch[1]))
                self.guarded_until = self.optimizer_steps + GUARDED_STEPS

    def optimizer_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> Totals:
        """One optimizer step over `batch` (x, y) in micro-batches of `micro.size`, on the fast path
        or the guarded one; returns its loss and accuracy sums as device tensors (no host sync per step)."""
        if self.on_fast_path():
            return self.synced_step(batch)
        return self.guarded_step(batch)

    def synced_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> Totals:
        """The fast path: DDP averages the gradients during the step's last backward, and no vote
        waits before the optimizer steps. An out-of-memory error here fails this rank's attempt."""
        try:
            totals = self.accumulate_gradients(batch, self.micro.size)
        except torch.OutOfMemoryError as caught:
            error = caught.with_traceback(None)  # its frames hold the attempt's activations
            raise OutOfMemoryOnFastPath(self.optimizer_steps, self.micro.size) from error
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.zero_gradients()
        return totals

    def guarded_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> Totals:
        """The guarded path: the step's gradients summed on each rank with no communication, then
        the ranks' vote.

        Every rank votes on whether any of them ran out of memory (and, in the same vote, whether the
        previous step's loss was finite). If one did, every rank drops the step (gradients zeroed) and
        raises `StepOutOfMemory`, so that all retry it together; otherwise the gradients are averaged
        over the ranks and the optimizer steps.
        """
        error = None
        try:
            totals = self.accumulate_gradients(batch, self.micro.size)
        except torch.OutOfMemoryError as caught:
            # Kept without its traceback, whose frames hold the failed attempt's activations.
            error = caught.with_traceback(None)
        out_of_memory, diverged = self.votes.after_backward(error is not None)
        self.raise_if_diverged(diverged)
        if out_of_memory:
            self.zero_gradients()
            self.ctx.family.release_cached_memory()
            raise StepOutOfMemory(error)
        if self.ctx.is_distributed:
            average_gradients(self.ddp_model, self.ctx.world_size)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.zero_gradients()
        return totals

    def accumulate_gradients(self, batch: tuple[torch.Tensor, torch.Tensor], micro: int) -> Totals:
        """Forward and backward over `batch` (x, y) in micro-batches of `micro`, gradients summed on
        this rank.

        Under DDP on the guarded path no backward communicates (`no_sync`): a rank that runs out of
        memory mid-step would leave the bucket all-reduces it had started unmatched on its peers. On
        the fast path the last micro-batch's backward is synced: DDP all-reduces the summed gradients
        bucket by bucket as the backward produces them.
        """
        model, dtype = self.ddp_model, self.dtype
        chunks = list(zip(*(column.split(micro) for column in batch), strict=True))
        totals = Totals(self.ctx.device)
        # Per-step Python and small-op overhead shows on fast devices: no autocast context or loss
        # rescaling unless they do something.
        autocast = torch.autocast(self.ctx.device.type, dtype=dtype) if dtype is not None else nullcontext()
        ddp = isinstance(model, DistributedDataParallel)
        last_synced = ddp and self.on_fast_path()
        for index, (x, y) in enumerate(chunks):
            synced = last_synced and index == len(chunks) - 1
            with model.no_sync() if ddp and not synced else nullcontext():
                with autocast:
                    logits = model(x)
                    loss = mean_loss(logits.float(), y, self.class_weights)
                share = loss if len(chunks) == 1 else loss * (len(y) / len(batch[1]))
                self.scaler.scale(share).backward()
            totals.add(loss.detach() * len(y), logits, y)
        return totals

    def zero_gradients(self) -> None:
        # Under DDP the gradients are views of its buckets: zeroed in place, never freed (`wrap_in_ddp`).
        self.optimizer.zero_grad(set_to_none=not self.ctx.is_distributed)

    def check_last_loss(self) -> None:
        """Collective: the vote on the last recorded loss alone (`raise_if_diverged`)."""
        self.raise_if_diverged(self.votes.last_loss_vote())

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
            model=config.model,
            config=config,
            device=ctx.family.describe(ctx.device),
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


def wrap_in_ddp(model: nn.Module, device: torch.device | None = None) -> DistributedDataParallel:
    """DDP for its start-up broadcast of parameters and buffers, its flat gradient buckets, and, on
    the fast path, its overlapped all-reduce of them in a synced backward; on the guarded path the
    loop reduces the gradients itself (`LoopState.guarded_step`).

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


def build_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        model.parameters(),
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
        fused=family_of(device).fused_adamw,
    )


def autocast_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """The dtype autocast computes in on `device` for `precision` (`tasks.core.training.precision.for_torch`);
    None for full float32."""
    family = family_of(device)
    accelerator = family.describe(device) if family.autocasts else None
    chosen = for_torch(precision, accelerator, lambda: family.native_bf16(device)).torch_autocast
    return getattr(torch, chosen) if chosen else None


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


class OutOfMemoryOnFastPath(RuntimeError):
    """A rank ran out of memory on the fast path, inside or before DDP's synced backward, where its
    peers cannot drop the step with it: this attempt fails, and a retry resumes from the last
    checkpoint, replaying guarded the steps after it (docs/reliability.md)."""

    def __init__(self, step: int, micro_batch: int):
        super().__init__(
            f"CUDA out of memory at optimizer step {step} with micro-batch {micro_batch}, on the fast path "
            "(DDP's overlapped all-reduce had begun, so the ranks cannot drop the step together): "
            "the attempt fails, and a retry resumes from the last checkpoint on the guarded path, "
            "which halves the micro-batch on every rank if the step runs out of memory again"
        )
        self.step, self.micro_batch = step, micro_batch


class StepOutOfMemory(Exception):
    """A rank ran out of memory in this step, and every rank dropped it; `error` is this rank's own
    out-of-memory error, None when only other ranks ran out."""

    def __init__(self, error: torch.OutOfMemoryError | None):
        super().__init__(str(error) if error is not None else "out of memory on another rank")
        self.error = error


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
        if not y.is_floating_point():  # a regression has no correct answers to count
            self.correct += (logits.argmax(1) == y).sum()

    def add_totals(self, other: Totals) -> None:
        self.loss_sum += other.loss_sum
        self.correct += other.correct

    def all_reduced(self, n_rows: int, ctx: DistributedContext) -> tuple[float, float, int]:
        """(loss sum, correct, rows) over all ranks: one all-reduce, one transfer to the host."""
        # float64 holds integers exactly up to 2**53, so the counts survive the conversion.
        rows_here = torch.full((), n_rows, dtype=torch.float64, device=self.loss_sum.device)
        sums = torch.stack([self.loss_sum, self.correct.double(), rows_here])
        if ctx.is_distributed:
            dist.all_reduce(sums)
        loss_sum, correct, seen = sums.tolist()
        return loss_sum, correct, int(seen)


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


def loss_weights(config: TrainConfig, splits: SplitPaths, ctx: DistributedContext) -> torch.Tensor | None:
    """The class weights `config.class_weight` asks for, from the whole train split's labels (every
    rank reads them, so all weigh alike); None where no weighting is asked for."""
    if config.class_weight == "none":
        return None
    labels = parquet_split(splits.train).to_table(columns=[splits.label_column])
    counts = np.bincount(labels.column(0).to_numpy(), minlength=splits.n_classes)
    weights = class_weights(config.class_weight, counts)
    if ctx.rank == 0:
        log.info("%s", describe_class_weights(weights))
    return torch.tensor(weights, dtype=torch.float32, device=ctx.device)


def mean_loss(logits: torch.Tensor, y: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """Cross-entropy averaged over the rows; with class `weights`, each row's weighted and the sum
    divided by the rows, not by the weights' sum as torch's weighted mean does: a step's loss is then
    the sum of its micro-batches' shares whatever their split, as out-of-memory halving needs. A
    regression's float labels (standardised) take the mean squared error."""
    if y.is_floating_point():
        return F.mse_loss(logits[:, 0], y)
    if weights is None:
        return F.cross_entropy(logits, y)
    return (F.cross_entropy(logits, y, reduction="none") * weights[y]).mean()


@torch.no_grad()
def evaluate_shard(model: nn.Module, batches, ctx, dtype, weights=None) -> tuple[float, float]:
    """Mean loss and accuracy over every rank's `batches` of (x, y) on the device; with class
    `weights`, the loss weighted as in training (`mean_loss`), so that the two compare."""
    model.eval()
    totals, n_rows = Totals(ctx.device), 0
    for xb, yb in batches:
        with torch.autocast(ctx.device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(xb)
        totals.add(row_losses_sum(logits.float(), yb, weights), logits, yb)
        n_rows += len(yb)
    loss_sum, correct, count = totals.all_reduced(n_rows, ctx)
    return loss_sum / count, correct / count


def row_losses_sum(logits: torch.Tensor, y: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """The summed loss of some rows, as `mean_loss` weighs each."""
    if y.is_floating_point():
        return F.mse_loss(logits[:, 0], y, reduction="sum")
    if weights is None:
        return F.cross_entropy(logits, y, reduction="sum")
    return (F.cross_entropy(logits, y, reduction="none") * weights[y]).sum()


def event_writer(log_dir: str):
    # Imported here: torch's TensorBoard writer imports all of TensorFlow when it is installed.
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir)


def write_epoch_scalars(board, epoch: EpochMetrics, samples_per_second: float) -> None:
    board.add_scalar("loss/train", epoch.train_loss, epoch.epoch)
    board.add_scalar("loss/val", epoch.val_loss, epoch.epoch)
    board.add_scalar("accuracy/train", epoch.train_accuracy, epoch.epoch)
    board.add_scalar("accuracy/val", epoch.val_accuracy, epoch.epoch)
    board.add_scalar("throughput/samples_per_second", samples_per_second, epoch.epoch)
    board.flush()
