"""How a global batch splits over workers and accumulation steps: what the planner sizes and both
training loops run, one rule for both."""

from __future__ import annotations

# `TrainConfig.min_micro_batch_size` by default, which the planner's `Workload` also defaults to.
MIN_MICRO_BATCH_SIZE = 4


def micro_batch(batch_size: int, workers: int, grad_accum_steps: int) -> int | None:
    """Each worker's micro-batch when the global batch splits evenly over `workers` x `grad_accum_steps`
    accumulation steps, else None: the training loops give every micro-batch the same number of rows."""
    per_step = workers * grad_accum_steps
    return batch_size // per_step if per_step > 0 and batch_size % per_step == 0 else None
