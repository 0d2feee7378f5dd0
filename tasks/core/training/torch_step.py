"""The parts of a torch step: the optimizer, autocast, the micro-batch halved on out-of-memory, the running
totals, the class-weighted loss, a shard's evaluation and the TensorBoard scalars."""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tasks.core.data.files import parquet_split
from tasks.core.data.splits import SplitPaths
from tasks.core.models.precision import for_torch
from tasks.core.training.config import TrainConfig, class_weights, describe_class_weights
from tasks.core.training.devices import family_of
from tasks.core.training.records import EpochMetrics
from tasks.core.training.torch_ddp import DistributedContext

log = logging.getLogger(__name__)


def build_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        model.parameters(),
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
        fused=family_of(device).fused_adamw,
    )


def autocast_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """The dtype autocast computes in on `device` for `precision` (`tasks.core.models.precision.for_torch`);
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


# Micro-batches whose right answers `Totals` holds before counting them: a step then launches no
# kernel of its own for the count, and what waits is at most FLUSH_STEPS micro-batches' booleans.
FLUSH_STEPS = 64


class Totals:
    """A running loss sum and count of correct predictions, kept on the device.

    float32 stops counting at 2**24 rows (2**24 + 1 rounds to 2**24), so the count is int64 and the
    loss sum float64. Adding never syncs with the host; `all_reduced` and `read` read both back at
    once. The loss sum takes each step as it comes, in order, so that a run resumed from a save in
    mid-epoch adds up to the uninterrupted run's sum bit for bit; the count, exact in any order,
    counts FLUSH_STEPS micro-batches' answers at a time.
    """

    def __init__(self, device: torch.device, loss_sum: float = 0.0, correct: int = 0):
        # `full`, not `tensor`: a fill on the device rather than a copy from the host.
        self.loss_sum = torch.full((), loss_sum, dtype=torch.float64, device=device)
        self.correct = torch.full((), correct, dtype=torch.int64, device=device)
        self.hits: list[torch.Tensor] = []  # micro-batches' right answers (booleans), not yet counted

    def add(self, loss_sum: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> None:
        """Add a batch: its summed loss, and its predictions checked against the labels `y`."""
        self.loss_sum += loss_sum.detach()
        if not y.is_floating_point():  # a regression has no correct answers to count
            self.correct += (logits.argmax(1) == y).sum()

    def add_step(self, sums: StepSums, rows: int) -> None:
        """Add an optimizer step of `rows` rows that ran to the end (`StepSums`)."""
        self.loss_sum.add_(sums.loss, alpha=rows)
        self.hits += sums.hits
        if len(self.hits) >= FLUSH_STEPS:
            self.flush()

    def flush(self) -> None:
        """The answers waiting, counted: two kernels for FLUSH_STEPS micro-batches."""
        if self.hits:
            self.correct += torch.cat(self.hits).sum()
            self.hits = []

    def read(self) -> tuple[float, int]:
        """(loss sum, correct) on this rank, on the host."""
        self.flush()
        loss_sum, correct = torch.stack([self.loss_sum, self.correct.double()]).tolist()
        return loss_sum, int(correct)

    def all_reduced(self, n_rows: int, ctx: DistributedContext) -> tuple[float, float, int]:
        """(loss sum, correct, rows) over all ranks: one all-reduce, one transfer to the host."""
        self.flush()
        # float64 holds integers exactly up to 2**53, so the counts survive the conversion.
        rows_here = torch.full((), n_rows, dtype=torch.float64, device=self.loss_sum.device)
        sums = torch.stack([self.loss_sum, self.correct.double(), rows_here])
        if ctx.is_distributed:
            dist.all_reduce(sums)
        loss_sum, correct, seen = sums.tolist()
        return loss_sum, correct, int(seen)


class StepSums:
    """One optimizer step's sums on this rank, as its micro-batches run: its mean loss (their shares
    of it added up, a device scalar; None before the first) and each micro-batch's right answers.
    `Totals.add_step` takes them once the step has run to the end, so a dropped step adds nothing."""

    __slots__ = ("loss", "hits")

    def __init__(self):
        self.loss: torch.Tensor | None = None
        self.hits: list[torch.Tensor] = []

    def add(self, share: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> None:
        """A micro-batch: its `share` of the step's mean loss, and its predictions checked against `y`."""
        share = share.detach()
        self.loss = share if self.loss is None else self.loss + share
        if not y.is_floating_point():  # a regression has no correct answers to count
            self.hits.append(logits.argmax(1) == y)


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
