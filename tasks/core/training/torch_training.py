"""The PyTorch training loop: one function per rank, DDP when launched with several workers.

Run under torchrun / torch elastic (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR set) it joins the
process group: NCCL on CUDA, gloo on CPU (`tasks.core.training.devices`). Run as a plain process it trains alone.
"""

from __future__ import annotations

import logging
import os
import time

import torch
from torch import nn
from torch.profiler import record_function

from tasks.core.data.splits import SplitPaths
from tasks.core.models.plugins import build, input_spec_for
from tasks.core.models.torch_models import save_torch_artifact
from tasks.core.training import ranges
from tasks.core.training.checkpoint import TrainingCheckpoint
from tasks.core.training.config import TrainConfig
from tasks.core.training.preemption import PreemptionNotice
from tasks.core.training.progress import ending_on_divergence, log_epoch
from tasks.core.training.rank_part import rank_part, row_groups
from tasks.core.training.records import EpochMetrics
from tasks.core.training.rows import TrainingRows, auto_placement
from tasks.core.training.torch_ddp import (
    DistributedContext,
    agreed_set_up,
    init_distributed,
    share_rank0_buffers,
)
from tasks.core.training.torch_loop import LoopState, TrainOutcome
from tasks.core.training.torch_step import evaluate_shard, event_writer, loss_weights, write_epoch_scalars

log = logging.getLogger(__name__)


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
    val_rows = sum(rows for *_, rows in row_groups(splits.val)[1])  # the whole split's, every rank's part
    board = event_writer(log_dir) if log_dir and ctx.rank == 0 else None

    ctx.family.reset_peak_memory(ctx.device)
    samples, training_seconds, start = 0, 0.0, time.perf_counter()
    with ending_on_divergence(config) as diverged:
        for epoch in range(progress.epoch, config.last_epoch):
            if state.choice.stops_early(progress.history):  # a resumed run too, saved after its last epoch
                break
            epoch_start = time.perf_counter()
            with record_function(ranges.TRAIN_EPOCH):
                train_loss, train_acc, seen = state.train_epoch(epoch)
            training_seconds += time.perf_counter() - epoch_start  # the loop alone: no validation, no saving
            share_rank0_buffers(model, ctx)
            val_loss, val_acc = evaluate_shard(
                state.ddp_model, training_rows.validation(eval_batch), ctx, state.dtype, state.class_weights
            )
            samples += seen
            metrics = EpochMetrics(epoch + 1, train_loss, train_acc, val_loss, val_acc, val_rows)
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
    done = state.outcome(training_rows.train.row_ids(), samples, training_seconds, seconds, splits.regression)
    done.run.diverged = "".join(diverged)
    return done


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
    # A resumed run starts at a later epoch, whose order is then computed when it starts.
    first_order = (config.seed, 0, config.shuffle_buffer_rows)
    return TrainingRows(placement, train_part, val_part, columns, ctx.device, first_order)
