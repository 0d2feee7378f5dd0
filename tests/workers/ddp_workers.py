"""Entry points for worker processes started by the DDP tests (importable by spawned children)."""

from __future__ import annotations

from typing import Any

from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from tasks.core.models.torch_startup import rendezvous_events_named_without_stack_walks


def train_and_report(config, splits) -> dict[str, Any]:
    from tasks.core.training.torch_ddp import shutdown_distributed
    from tasks.core.training.torch_training import train

    try:
        outcome = train(config, splits)
    finally:
        shutdown_distributed()
    return {
        "rank": outcome.rank,
        "world_size": outcome.run.world_size,
        "backend": outcome.run.backend,
        "shard_rows": outcome.shard_rows,
        "history": outcome.run.history,
        "parameters": [p.detach().cpu().numpy().copy() for p in outcome.model.parameters()],
    }


def launch_local(entrypoint, *args, nproc: int = 2, run_id: str = "test") -> dict[int, Any]:
    """Start `nproc` workers on this machine the way torchrun does and return each rank's result."""
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=run_id,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
    )
    with rendezvous_events_named_without_stack_walks():  # as the training task launches
        return elastic_launch(config, entrypoint)(*args)


def train_with_failing_rank(config, splits, failing_rank: int, how: str) -> dict[str, Any]:
    """Train, but on `failing_rank` fail at the third optimizer step: raise, or die by SIGKILL.

    The other ranks wait 2 s before that step's all-reduce. Without it, the connection reset that the
    failure causes ends them within milliseconds, and when the agent's next poll finds two dead
    workers, torch reports the first it lists (`ProcessContext.join` in torch/multiprocessing/spawn.py),
    which may be a rank that only lost its peer."""
    import os
    import signal
    import time

    from tasks.core.training import torch_training

    real_step, calls = torch_training.LoopState.optimizer_step, []

    def step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            if int(os.environ["RANK"]) != failing_rank:
                time.sleep(2)
            elif how == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            else:
                raise ValueError(f"bad data on the shard of rank {failing_rank}")
        return real_step(*args, **kwargs)

    torch_training.LoopState.optimizer_step = step
    return train_and_report(config, splits)


def train_until_one_rank_is_signalled(
    config, splits, checkpoint_dir: str, signalled_rank: int
) -> dict[str, Any]:
    """Train with a preemption notice; only `signalled_rank` gets SIGTERM, at its fifth optimizer step,
    as when one node of several is reclaimed. Returns where each rank stopped."""
    import os
    import signal

    from tasks.core.training import torch_ddp, torch_training
    from tasks.core.training.checkpoint import TrainingCheckpoint
    from tasks.core.training.preemption import Preempted, PreemptionNotice

    real_step, calls = torch_training.LoopState.optimizer_step, []

    def step(*args, **kwargs):
        calls.append(1)
        if int(os.environ["RANK"]) == signalled_rank and len(calls) == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(*args, **kwargs)

    torch_training.LoopState.optimizer_step = step
    checkpoint = TrainingCheckpoint(checkpoint_dir)
    try:
        with PreemptionNotice(grace_s=60) as notice:
            torch_training.train(config, splits, checkpoint=checkpoint, preemption=notice)
    except Preempted as stopped:
        return {"epoch": stopped.epoch, "step": stopped.step, "steps_run": len(calls)}
    finally:
        torch_ddp.shutdown_distributed()
    return {"epoch": None, "step": None, "steps_run": len(calls)}


def train_until_one_rank_diverges(config, splits, diverging_rank: int, diverging_step: int) -> dict[str, Any]:
    """Train; on `diverging_rank` alone the `diverging_step`-th optimizer step's loss is NaN.
    Returns the error each rank stopped with (or, under `on_divergence: stop`, its run's `diverged` and
    epochs) and the optimizer steps it ran."""
    import os

    from tasks.core.models.plugins import TrainingDiverged
    from tasks.core.training import torch_ddp, torch_loop, torch_training

    real_step, real_loss, calls = torch_training.LoopState.optimizer_step, torch_loop.mean_loss, []

    def step(*args, **kwargs):
        calls.append(1)
        return real_step(*args, **kwargs)

    def loss(*args):
        diverges = int(os.environ["RANK"]) == diverging_rank and len(calls) == diverging_step
        return real_loss(*args) + float("nan") if diverges else real_loss(*args)

    torch_training.LoopState.optimizer_step, torch_loop.mean_loss = step, loss
    try:
        run = torch_training.train(config, splits).run
    except TrainingDiverged as error:
        return {"error": str(error), "steps_run": len(calls)}
    finally:
        torch_ddp.shutdown_distributed()
    return {"error": None, "diverged": run.diverged, "epochs": len(run.history), "steps_run": len(calls)}


def train_recording_reads(config, splits) -> dict[str, Any]:
    """Train and report, with the training split's row ids that this rank's reader read."""
    from tasks.core.training.rank_part import RankPart

    real_read, read = RankPart.read_block, []

    def read_block(part, block, *args):
        if part.path == splits.train:
            read.extend(range(block.first_id, block.first_id + block.rows))
        return real_read(part, block, *args)

    RankPart.read_block = read_block
    return {**train_and_report(config, splits), "read_rows": read}
