"""Worker processes for the collective out-of-memory tests (importable by spawned children), and the
fault they inject: CUDA's out-of-memory error raised inside autograd, mid-backward."""

from __future__ import annotations

from typing import Any


def build_with_oom_in_backward(real_build, number: int | None, backwards: list[int]):
    """`real_build`, but the `number`-th backward through the first layer's output raises the CUDA
    out-of-memory error inside autograd, after the later layers' gradients, and those of the step's
    earlier micro-batches, were accumulated. Appends each such backward's micro-batch size to
    `backwards`; with `number` None nothing raises."""
    import torch

    def raise_on_the_chosen_backward(grad):
        backwards.append(len(grad))
        if len(backwards) == number:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return grad

    def watch_the_output(layer, inputs, output) -> None:
        if output.requires_grad:  # not in evaluation
            output.register_hook(raise_on_the_chosen_backward)

    def build(*args):
        model = real_build(*args)
        model[0].register_forward_hook(watch_the_output)
        return model

    return build


def train_with_and_without_oom(config, splits, failing_rank: int, failing_backward: int) -> dict[str, Any]:
    """On each rank: average known gradients, train unfaulted, then train again while `failing_rank`
    runs out of memory in its `failing_backward`-th backward. Returns what each part showed."""
    from tasks.core.training import torch_ddp, torch_training

    try:
        ctx = torch_training.init_distributed(config.collective_timeout_s)
        averaged = averaged_gradients(ctx.rank, ctx.world_size)
        unfaulted = train_and_watch(config, splits, None)
        faulted = train_and_watch(config, splits, failing_backward if ctx.rank == failing_rank else None)
    finally:
        torch_ddp.shutdown_distributed()
    return {"rank": ctx.rank, "averaged": averaged, "unfaulted": unfaulted, "faulted": faulted}


def train_and_watch(config, splits, failing_backward: int | None) -> dict[str, Any]:
    from tasks.core.training import torch_training

    real_build, real_accumulate = torch_training.build, torch_training.LoopState.accumulate_gradients
    backwards: list[int] = []
    attempts: list[int] = []  # the micro-batch size of every attempt at an optimizer step

    def accumulate(state, batch, micro, totals):
        attempts.append(micro)
        return real_accumulate(state, batch, micro, totals)

    torch_training.build = build_with_oom_in_backward(real_build, failing_backward, backwards)
    torch_training.LoopState.accumulate_gradients = accumulate
    try:
        outcome = torch_training.train(config, splits)
    finally:
        torch_training.build, torch_training.LoopState.accumulate_gradients = real_build, real_accumulate
    return {
        "attempts": attempts,
        "raised": int(failing_backward is not None and len(backwards) >= failing_backward),
        "micro_batch_size": outcome.micro_batch_size,
        "grad_accum_steps": outcome.grad_accum_steps,
        "optimizer_steps": outcome.optimizer_steps,
        "history": outcome.run.history,
        "parameters": [p.detach().numpy().copy() for p in outcome.model.parameters()],
        "gradient_storages": len({p.grad.untyped_storage().data_ptr() for p in outcome.model.parameters()}),
    }


# Small enough that the model below is reduced in three buckets: [w1], [b1, w2], [b2].
TEST_BUCKET_BYTES = 48


def averaged_gradients(rank: int, world_size: int) -> dict[str, list]:
    """`average_gradients` on a small model whose gradients are (rank + 1) x a pattern + the
    parameter's index; the last one is not contiguous (every other element of its pattern).
    Returns the gradients before and after averaging."""
    import torch

    from tasks.core.training import votes

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    parameters = list(model.parameters())
    for index, parameter in enumerate(parameters):
        stride = 2 if parameter is parameters[-1] else 1
        values = torch.arange(stride * parameter.numel(), dtype=torch.float32) * (rank + 1) + index
        parameter.grad = values[::stride].reshape(parameter.shape)
    assert not parameters[-1].grad.is_contiguous()
    before = [parameter.grad.numpy().copy() for parameter in parameters]
    limit, votes.GRADIENT_REDUCE_BUCKET_BYTES = votes.GRADIENT_REDUCE_BUCKET_BYTES, TEST_BUCKET_BYTES
    try:
        votes.average_gradients(model, world_size)
    finally:
        votes.GRADIENT_REDUCE_BUCKET_BYTES = limit
    return {"before": before, "after": [parameter.grad.numpy().copy() for parameter in parameters]}
