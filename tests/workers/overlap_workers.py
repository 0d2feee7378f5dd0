"""Worker processes for the DDP overlap tests (importable by spawned children): one that records, in
order, when DDP issues each gradient bucket's all-reduce, when the loop reduces gradients itself and
when each backward ends; one that runs out of memory on one rank at a chosen optimizer step."""

from __future__ import annotations

from typing import Any


def train_recording_overlap(config, splits) -> dict[str, Any]:
    """Train, recording per optimizer step its path and, in order, the events of its backward:
    ("bucket", index) when DDP issues a bucket's all-reduce (a communication hook that records, then
    all-reduces as DDP's default one does), "reduce" when the loop's own gradient average starts,
    "backward end" when the first layer's weight, the last gradient of a backward, has been
    accumulated. Also returns whether the flags' parameter took part in the first bucket."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from tasks.core.training import torch_loop, torch_training
    from tests.workers.ddp_workers import train_and_report

    steps: list[dict[str, Any]] = []
    first_buckets: list[bool] = []
    record = lambda event: steps[-1]["events"].append(event)  # noqa: E731
    real_wrap, real_build = torch_loop.wrap_in_ddp, torch_training.build
    real_step, real_average = torch_training.LoopState.optimizer_step, torch_loop.average_gradients

    def recording_hook(carrier, group, bucket):
        record(("bucket", bucket.index()))
        if bucket.index() == 0:
            first_buckets.append(any(p is carrier.flags for p in bucket.parameters()))
        return allreduce_hook(group, bucket)

    def wrap(carrier, device=None):
        ddp = real_wrap(carrier, device)
        ddp.register_comm_hook(None, lambda group, bucket: recording_hook(carrier, group, bucket))
        return ddp

    def build(*args):
        model = real_build(*args)
        model[0].weight.register_post_accumulate_grad_hook(lambda _: record("backward end"))
        return model

    def step(state, *args):
        steps.append({"fast": state.on_fast_path(), "events": []})
        return real_step(state, *args)

    def average(*args):
        record("reduce")
        return real_average(*args)

    torch_loop.wrap_in_ddp, torch_training.build = wrap, build
    torch_training.LoopState.optimizer_step, torch_loop.average_gradients = step, average
    torch.set_num_threads(1)
    return {**train_and_report(config, splits), "steps": steps, "flags_in_first_bucket": first_buckets}


def train_with_oom_at_step(
    config, splits, checkpoint_dir: str, every_steps: int, failing_rank: int, failing_step: int
) -> dict[str, Any]:
    """Train with a checkpoint; on `failing_rank`, the first backward of optimizer step `failing_step`
    raises CUDA's out-of-memory error inside autograd while the micro-batch is the configured one.
    Returns each attempt's step, micro-batch and path, and where the run ended; then, for comparison,
    the same run from scratch without a fault or a checkpoint."""
    import os

    from tasks.core.training import torch_ddp, torch_training
    from tasks.core.training.checkpoint import TrainingCheckpoint

    rank, configured = int(os.environ["RANK"]), config.micro_batch_size(int(os.environ["WORLD_SIZE"]))
    attempts: list[tuple[int, int, bool]] = []
    fault: list[int | None] = [None]
    real_step, real_build = torch_training.LoopState.optimizer_step, torch_training.build

    def step(state, batch, *args):
        attempts.append((state.optimizer_steps, state.micro.size, state.on_fast_path()))
        chosen = (
            rank == failing_rank and state.optimizer_steps == failing_step and state.micro.size == configured
        )
        fault[0] = 1 if chosen else None
        return real_step(state, batch, *args)

    torch_training.LoopState.optimizer_step = step
    torch_training.build = build_faulting_when(real_build, fault)
    try:
        outcome = torch_training.train(
            config, splits, checkpoint=TrainingCheckpoint(checkpoint_dir, every_steps)
        )
        torch_training.build, torch_training.LoopState.optimizer_step = real_build, real_step
        unfaulted = torch_training.train(config, splits)
    finally:
        torch_training.build, torch_training.LoopState.optimizer_step = real_build, real_step
        torch_ddp.shutdown_distributed()
    return {
        "attempts": attempts,
        "optimizer_steps": outcome.optimizer_steps,
        "micro_batch_size": outcome.micro_batch_size,
        "grad_accum_steps": outcome.grad_accum_steps,
        "parameters": [p.detach().numpy().copy() for p in outcome.model.parameters()],
        "unfaulted_steps": unfaulted.optimizer_steps,
        "unfaulted_parameters": [p.detach().numpy().copy() for p in unfaulted.model.parameters()],
    }


def build_faulting_when(real_build, fault: list[int | None]):
    """`real_build`, but a backward through the first layer's output raises CUDA's out-of-memory error
    inside autograd while `fault[0]` is set (once: the flag is cleared as it raises)."""
    import torch

    def raise_if_chosen(grad):
        if fault[0] is not None:
            fault[0] = None
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return grad

    def watch_the_output(layer, inputs, output) -> None:
        if output.requires_grad:  # not in evaluation
            output.register_hook(raise_if_chosen)

    def build(*args):
        model = real_build(*args)
        model[0].register_forward_hook(watch_the_output)
        return model

    return build
