"""The PyTorch training loop: one function per rank, DDP when launched with several workers.

Run under torchrun / torch elastic (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR set) it joins the
process group: NCCL on CUDA, gloo on CPU. Run as a plain process it trains alone.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import types
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tasks.core.checkpoint import TrainingCheckpoint
from tasks.core.config import EpochMetrics, SplitPaths, TrainConfig, TrainingRun
from tasks.core.data import read_shard
from tasks.core.models import build, input_spec_for
from tasks.core.preemption import PreemptionNotice
from tasks.core.progress import ProgressReporter
from tasks.core.torch_models import save_torch_artifact

log = logging.getLogger(__name__)


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

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(timeout_s: int) -> DistributedContext:
    """Join the process group that torchrun / torch elastic described in the environment."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return DistributedContext(rank, world_size, device, backend if world_size > 1 else "none")


def autocast_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """The autocast dtype for CUDA; None (full float32) on CPU or when fp32 is asked for."""
    if precision == "fp32" or device.type != "cuda":
        return None
    if precision == "fp16":
        return torch.float16
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise ValueError(
            f"precision='bf16' asked for but {torch.cuda.get_device_name(device)} has no bf16 support"
        )
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def all_reduce_sums(values: list[float], ctx: DistributedContext) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    if ctx.is_distributed:
        dist.all_reduce(tensor)
    return tensor.tolist()


@torch.no_grad()
def evaluate_shard(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, ctx, dtype, batch: int
) -> tuple[float, float]:
    model.eval()
    loss_sum, correct = 0.0, 0.0
    for xb, yb in zip(x.split(batch), y.split(batch), strict=True):
        with torch.autocast(ctx.device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(xb)
        loss_sum += F.cross_entropy(logits.float(), yb, reduction="sum").item()
        correct += (logits.argmax(1) == yb).sum().item()
    loss_sum, correct, count = all_reduce_sums([loss_sum, correct, float(len(y))], ctx)
    return loss_sum / count, correct / count


@dataclass
class Progress:
    """Where the run is: what a checkpoint must hold besides model and optimizer state."""

    epoch: int = 0
    step: int = 0  # optimizer steps done in `epoch`
    loss_sum: float = 0.0  # this rank's running sums over those steps
    correct: float = 0.0
    optimizer_steps: int = 0
    history: list[EpochMetrics] = field(default_factory=list)

    def next_epoch(self) -> None:
        self.epoch, self.step, self.loss_sum, self.correct = self.epoch + 1, 0, 0.0, 0.0


def gather(value, ctx: DistributedContext) -> list:
    if not ctx.is_distributed:
        return [value]
    gathered = [None] * ctx.world_size
    dist.all_gather_object(gathered, value)
    return gathered


def rng_state(ctx: DistributedContext) -> dict:
    cuda = (
        torch.cuda.get_rng_state(ctx.device)
        if ctx.device.type == "cuda"
        else torch.empty(0, dtype=torch.uint8)
    )
    return {"cpu": torch.get_rng_state(), "cuda": cuda}


def training_state(
    model, optimizer, scaler, micro: MicroBatch, progress: Progress, partial, ctx
) -> dict | None:
    """Collective: every rank contributes its RNG state and running sums; rank 0 gets the state."""
    ranks = gather({**rng_state(ctx), "loss_sum": partial[0], "correct": partial[1]}, ctx)
    if ctx.rank != 0:
        return None
    return {
        "model": {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "epoch": progress.epoch,
        "step": progress.step,
        "optimizer_steps": progress.optimizer_steps,
        "micro_batch": micro.size,
        "history": [asdict(epoch) for epoch in progress.history],
        "world_size": ctx.world_size,
        "ranks": ranks,
    }


def restore(state: dict | None, model, optimizer, scaler, micro: MicroBatch, progress: Progress, ctx) -> None:
    if state is None:
        return
    if state["world_size"] != ctx.world_size:
        raise ValueError(
            f"the checkpoint was written by {state['world_size']} workers but {ctx.world_size} are running; "
            "resume with the same number of workers"
        )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    micro.size = state["micro_batch"]
    mine = state["ranks"][ctx.rank]
    torch.set_rng_state(mine["cpu"])
    if ctx.device.type == "cuda" and mine["cuda"].numel():
        torch.cuda.set_rng_state(mine["cuda"], ctx.device)
    progress.epoch, progress.step = state["epoch"], state["step"]
    progress.loss_sum, progress.correct = mine["loss_sum"], mine["correct"]
    progress.optimizer_steps = state["optimizer_steps"]
    progress.history = [EpochMetrics(**epoch) for epoch in state["history"]]


class MicroBatch:
    """The micro-batch size, halved on CUDA out-of-memory while the effective batch stays fixed."""

    def __init__(self, size: int, minimum: int):
        self.size, self.minimum = size, minimum

    def halve(self, error: Exception, step: int, per_step: int) -> None:
        if self.size // 2 < self.minimum:
            raise RuntimeError(
                f"CUDA out of memory at step {step} even with micro-batch {self.size} "
                f"(minimum {self.minimum}); use a larger accelerator or a smaller model"
            ) from error
        before = self.size
        self.size //= 2
        log.warning(
            "CUDA out of memory at step %d: micro-batch %d -> %d, accumulation %d -> %d steps "
            "(effective batch unchanged); retrying the step",
            step, before, self.size, -(-per_step // before), -(-per_step // self.size),
        )  # fmt: skip


class StopVote:
    """Whether every rank stops after this step, on the preemption notice of any of them.

    A notice may reach only some ranks (one node of several is reclaimed), so the ranks vote: one
    4-byte all-reduce per step on a gloo group of its own, read one step later so that it overlaps
    the next step instead of stalling it (and never syncs a CUDA stream). Every rank reads the same
    result after the same step, so no rank is left waiting in a collective.
    """

    def __init__(self, notice: PreemptionNotice, ctx: DistributedContext):
        self.notice = notice
        self.group = dist.new_group(backend="gloo") if ctx.is_distributed else None
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


def optimizer_step(model, optimizer, scaler, x, y, rows, micro: int, ctx, dtype):
    """One optimizer step over `rows`, in micro-batches of `micro`, gradients synced on the last.

    Returns (summed loss, correct predictions) as device tensors: no host sync per step.
    """
    chunks = rows.split(micro)
    loss_sum = correct = 0
    # Per-step Python and small-op overhead shows on fast devices: no autocast context, sync
    # context or loss rescaling unless they do something.
    autocast = torch.autocast(ctx.device.type, dtype=dtype) if dtype is not None else nullcontext()
    for index, chunk in enumerate(chunks):
        last = index == len(chunks) - 1
        sync = nullcontext() if last or not ctx.is_distributed else model.no_sync()
        with sync:
            with autocast:
                logits = model(x[chunk])
                loss = F.cross_entropy(logits.float(), y[chunk])
            share = loss if len(chunks) == 1 else loss * (len(chunk) / len(rows))
            scaler.scale(share).backward()
        loss_sum = loss_sum + loss.detach() * len(chunk)
        correct = correct + (logits.argmax(1) == y[chunk]).sum()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, correct


def train_epoch(
    model,
    optimizer,
    scaler,
    x,
    y,
    config: TrainConfig,
    ctx,
    dtype,
    epoch: int,
    micro: MicroBatch,
    progress,
    on_step,
):
    """One pass over this rank's shard, from `progress.step` on (non-zero when resuming mid-epoch).

    Returns global (mean loss, accuracy, samples) for the whole epoch.
    """
    model.train()
    per_step = config.micro_batch_size(ctx.world_size) * config.grad_accum_steps
    steps = len(y) // per_step
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(config.seed * 1_000 + epoch))
    order = order.to(x.device)
    loss_sum = torch.tensor(progress.loss_sum, device=x.device)
    correct = torch.tensor(progress.correct, device=x.device)
    for step in range(progress.step, steps):
        rows = order[step * per_step : (step + 1) * per_step]
        for group in optimizer.param_groups:
            group["lr"] = config.learning_rate_at(epoch * steps + step, config.epochs * steps)
        while True:
            try:
                step_loss, step_correct = optimizer_step(
                    model, optimizer, scaler, x, y, rows, micro.size, ctx, dtype
                )
                break
            except torch.cuda.OutOfMemoryError as error:
                optimizer.zero_grad(set_to_none=True)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                micro.halve(error, step, per_step)
        loss_sum += step_loss
        correct += step_correct
        progress.step, progress.optimizer_steps = step + 1, progress.optimizer_steps + 1
        on_step(epoch, steps, loss_sum, correct)
    seen = float(steps * per_step)
    loss_total, correct_total, seen = all_reduce_sums([loss_sum.item(), correct.item(), seen], ctx)
    return loss_total / seen, correct_total / seen, int(seen)


def load_shards(splits: SplitPaths, ctx: DistributedContext):
    """This rank's training shard and validation shard, moved to the device once."""
    x, y, rows = read_shard(splits.train, splits.feature_names, splits.label_column, ctx.rank, ctx.world_size)
    vx, vy, _ = read_shard(splits.val, splits.feature_names, splits.label_column, ctx.rank, ctx.world_size)
    to_device = lambda a: torch.from_numpy(a).to(ctx.device, non_blocking=True)  # noqa: E731
    return to_device(x), to_device(y), to_device(vx), to_device(vy), rows


def event_writer(log_dir: str):
    # Imported here: torch's TensorBoard writer imports all of TensorFlow when it is installed.
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir)


def tensorboard_without_tensorflow() -> None:
    """Make TensorBoard's event writer use its own TensorFlow-free file I/O (its `notf` switch).

    Otherwise the first event file imports TensorFlow when installed, as in the GPU image: seconds
    per rank before training starts. Process-wide and final (TensorFlow's own
    `tf.summary` stops working), so only DDP worker processes, which never run TensorFlow, call it.
    """
    if "tensorflow" not in sys.modules:
        sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))


def train(
    config: TrainConfig,
    splits: SplitPaths,
    artifact_path: str | None = None,
    checkpoint: TrainingCheckpoint | None = None,
    log_dir: str | None = None,
    preemption: PreemptionNotice | None = None,
) -> TrainOutcome:
    """Train the MLP on this rank's shard; rank 0 writes the artifact to `artifact_path`.

    With a `checkpoint`, the run resumes from its saved state, if any, and saves after every epoch
    and every `checkpoint.every_steps` optimizer steps. With a `log_dir`, rank 0 writes TensorBoard
    scalars there every epoch. With a `preemption` notice, the ranks stop together after the step
    during which the notice arrived, save that step and raise `Preempted`.
    """
    config.validate()
    ctx = init_distributed(config.collective_timeout_s)
    torch.manual_seed(config.seed)
    if ctx.device.type == "cpu":
        torch.use_deterministic_algorithms(True)
    x, y, vx, vy, shard_rows = load_shards(splits, ctx)
    micro = config.micro_batch_size(ctx.world_size)
    if len(y) < micro * config.grad_accum_steps:
        raise ValueError(
            f"each of {ctx.world_size} ranks holds {len(y)} training rows, fewer than one optimizer step "
            f"({micro} x {config.grad_accum_steps}); lower batch_size"
        )

    n_features = len(splits.feature_names)
    model = build(config.model, n_features, splits.n_classes, "pytorch").to(ctx.device)
    ddp_model = DistributedDataParallel(model) if ctx.is_distributed else model
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    dtype = autocast_dtype(ctx.device, config.precision)
    scaler = torch.amp.GradScaler(ctx.device.type, enabled=dtype == torch.float16)

    micro_batch = MicroBatch(micro, minimum=min(micro, config.min_micro_batch_size))
    progress = Progress()
    if checkpoint is not None:
        restore(checkpoint.load(), model, optimizer, scaler, micro_batch, progress, ctx)

    def save(loss_sum=None, correct=None) -> None:
        partial = (loss_sum.item(), correct.item()) if loss_sum is not None else (0.0, 0.0)
        state = training_state(model, optimizer, scaler, micro_batch, progress, partial, ctx)
        if state is not None:
            checkpoint.save(state)

    per_step = micro * config.grad_accum_steps
    reporter = ProgressReporter(config.epochs, enabled=ctx.rank == 0)
    board = event_writer(log_dir) if log_dir and ctx.rank == 0 else None

    vote = StopVote(preemption, ctx) if preemption is not None else None

    def on_step(epoch, steps, loss_sum, correct) -> None:
        reporter.step(epoch, progress.step, steps, lambda: loss_sum.item() / (progress.step * per_step))
        if vote is not None and vote.stop_now():
            stop_on_notice(loss_sum, correct)
        if checkpoint is not None and checkpoint.due(progress.step):
            save(loss_sum, correct)

    def stop_on_notice(loss_sum, correct) -> None:
        if checkpoint is not None:
            save(loss_sum, correct)
        else:
            log.warning("preemption notice without a checkpoint: the steps done so far are lost")
        vote.close()
        raise preemption.stopped(progress.epoch, progress.step)

    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    samples, training_seconds, start = 0, 0.0, time.perf_counter()
    for epoch in range(progress.epoch, config.epochs):
        epoch_start = time.perf_counter()
        train_loss, train_acc, seen = train_epoch(
            ddp_model, optimizer, scaler, x, y, config, ctx, dtype, epoch, micro_batch, progress, on_step
        )
        training_seconds += time.perf_counter() - epoch_start  # the loop alone: no validation, no saving
        val_loss, val_acc = evaluate_shard(ddp_model, vx, vy, ctx, dtype, batch=max(micro, 1024))
        samples += seen
        progress.history.append(EpochMetrics(epoch + 1, train_loss, train_acc, val_loss, val_acc))
        reporter.epoch_end()
        if board is not None:
            write_epoch_scalars(board, progress.history[-1], samples / max(training_seconds, 1e-9))
        progress.next_epoch()
        if checkpoint is not None:
            save()
        if ctx.rank == 0:
            log.info(
                "epoch %d/%d train_loss=%.4f train_acc=%.4f val_loss=%.4f val_acc=%.4f",
                epoch + 1, config.epochs, train_loss, train_acc, val_loss, val_acc,
            )  # fmt: skip
    if vote is not None:
        vote.close()
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if board is not None:
        board.close()

    if ctx.rank == 0 and artifact_path:
        save_torch_artifact(model, config.model, input_spec_for(config.model, n_features, splits.n_classes),
                            artifact_path)  # fmt: skip
    run = TrainingRun(
        framework="pytorch",
        model=config.model,
        device=describe_device(ctx.device),
        world_size=ctx.world_size,
        backend=ctx.backend,
        precision=str(dtype).removeprefix("torch.") if dtype else "float32",
        strategy="DDP" if ctx.world_size > 1 else "single-process",
        history=progress.history,
        samples_per_second=samples / training_seconds if training_seconds > 0 else 0.0,
        train_seconds=seconds,
        peak_device_memory_bytes=torch.cuda.max_memory_allocated(ctx.device)
        if ctx.device.type == "cuda"
        else 0,
    )
    return TrainOutcome(
        run=run,
        rank=ctx.rank,
        shard_rows=np.asarray(shard_rows).tolist(),
        optimizer_steps=progress.optimizer_steps,
        micro_batch_size=micro_batch.size,
        grad_accum_steps=-(-micro * config.grad_accum_steps // micro_batch.size),
        model=model,
    )


def write_epoch_scalars(board, epoch: EpochMetrics, samples_per_second: float) -> None:
    board.add_scalar("loss/train", epoch.train_loss, epoch.epoch)
    board.add_scalar("loss/val", epoch.val_loss, epoch.epoch)
    board.add_scalar("accuracy/train", epoch.train_accuracy, epoch.epoch)
    board.add_scalar("accuracy/val", epoch.val_accuracy, epoch.epoch)
    board.add_scalar("throughput/samples_per_second", samples_per_second, epoch.epoch)
    board.flush()


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
