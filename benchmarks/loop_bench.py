"""Training-loop efficiency: the project's loops against minimal bare loops, in one process."""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from tasks.core.data.splits import SplitPaths, read_split
from tasks.core.training.config import TrainConfig


def bare_torch_samples_per_second(
    splits: SplitPaths, config: TrainConfig, device: str = "cpu", amp: bool = False
):
    """A minimal loop: the same MLP, AdamW and batch, data already in memory, no validation."""
    import torch
    import torch.nn.functional as F

    from tasks.core.models.plugins import build

    x, y = (
        torch.from_numpy(a).to(device)
        for a in read_split(splits.train, splits.feature_names, splits.label_column)
    )
    torch.manual_seed(config.seed)
    model = build(config.model, x.shape[1], splits.n_classes, "pytorch").to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    steps = len(y) // config.batch_size
    start = time.perf_counter()
    for _ in range(config.epochs):
        order = torch.randperm(len(y), device=device)
        for step in range(steps):
            rows = order[step * config.batch_size : (step + 1) * config.batch_size]
            with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp):
                loss = F.cross_entropy(model(x[rows]).float(), y[rows])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
    return steps * config.batch_size * config.epochs / (time.perf_counter() - start)


def project_torch_samples_per_second(splits: SplitPaths, config: TrainConfig) -> float:
    from tasks.core.training.torch_training import train

    return train(config, splits).run.samples_per_second


def bare_keras_samples_per_second(splits: SplitPaths, config: TrainConfig) -> float:
    import keras
    import tensorflow as tf

    from tasks.core.models.plugins import build

    x, y = read_split(splits.train, splits.feature_names, splits.label_column)
    keras.backend.clear_session()
    keras.utils.set_random_seed(config.seed)
    tf.config.experimental.enable_op_determinism()  # as train_keras runs on CPU
    model = build(config.model, x.shape[1], splits.n_classes, "tensorflow")
    model.compile(optimizer=keras.optimizers.AdamW(config.learning_rate, weight_decay=config.weight_decay),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))  # fmt: skip
    start = time.perf_counter()
    model.fit(x, y, batch_size=config.batch_size, epochs=config.epochs, verbose=0)
    samples = (len(y) // config.batch_size + (len(y) % config.batch_size > 0)) * config.batch_size
    return min(samples, len(y)) * config.epochs / (time.perf_counter() - start)


def project_keras_samples_per_second(splits: SplitPaths, config: TrainConfig) -> float:
    import keras

    from tasks.core.training.tf_strategy import Environment
    from tasks.core.training.tf_training import train_keras

    keras.backend.clear_session()  # each run starts from the same state, as the bare run does
    return train_keras(config, splits, env=Environment()).run.samples_per_second


def first_batch_wait_seconds(splits: SplitPaths, config: TrainConfig, ordered_ahead: bool) -> float:
    """Seconds the first epoch waits for its first batch once the loop asks: the rows read and placed on
    this machine's device as the loop does, the epoch's order computed while they were read
    (`ordered_ahead`, as the loop does now) or only when the epoch asks for it."""
    import torch

    from tasks.core.training.rank_part import rank_part
    from tasks.core.training.rows import TrainingRows

    train, val = rank_part(splits.train, 0, 1), rank_part(splits.val, 0, 1)
    first = (config.seed, 0, config.shuffle_buffer_rows) if ordered_ahead else None
    columns = (splits.feature_names, splits.label_column)
    rows = TrainingRows("device", train, val, columns, torch.device("cpu"), first)
    steps = config.steps_per_epoch(train.rows, 1)
    start = time.perf_counter()
    next(iter(rows.epoch(config, 0, 0, steps, config.batch_size)))
    return time.perf_counter() - start


def model_flops_per_sample(n_features: int, hidden_sizes: list[int], n_classes: int) -> float:
    """Forward + backward of the MLP's matmuls: 6 x multiply-adds per sample."""
    widths = [n_features, *hidden_sizes, n_classes]
    return 6.0 * float(np.sum([a * b for a, b in zip(widths, widths[1:], strict=False)]))


# The DDP group: two CPU ranks over gloo, the project loop's fast path against the textbook DDP loop
# and against the loop with every step on the guarded path (the loop before the fast path).
DDP_SIDES = ("project", "bare DDP", "guarded only")
# Rounds before the counted ones: a process's first runs pay one-off costs (imports, the first
# connections, the allocator's first blocks) that no side should carry alone.
WARM_UP_ROUNDS = 1


@dataclass(frozen=True)
class DdpModel:
    """A model of the DDP group: its hidden layers, global batch, and the rows of its table, enough
    optimizer steps a rank that an epoch is mostly steady steps, not the first steps' allocations and
    the GUARDED_STEPS guarded ones at the start of every attempt."""

    hidden: tuple[int, ...]
    batch_size: int
    rows: int
    # Rounds counted (after WARM_UP_ROUNDS): on a 2-core machine shared with other jobs the small
    # model's single rounds move by 10-20%, and their median by a few percent from run to run.
    rounds: int


DDP_MODELS = {
    "MLP 256x128": DdpModel((256, 128), 512, 160_000, 40),  # about 200 steps a rank, 4 ms each
    "MLP 4096x4096x2048": DdpModel((4096, 4096, 2048), 64, 4_000, 5),  # about 40 steps a rank, 0.5 s each
}


class CpuClock:
    """The process CPU seconds and samples of the windows a side's own rate measures: the project
    loop's `train_epoch`s, the bare loop's steps between its barriers. Every thread of the rank counts
    (gloo's too): what a side costs the machine, which other jobs on it change far less than they
    change the wall clock, so this rate stays steadier where samples/s does not."""

    def __init__(self):
        self.seconds, self.samples = 0.0, 0

    def add(self, seconds: float, samples: int) -> None:
        self.seconds, self.samples = self.seconds + seconds, self.samples + samples

    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("nan")

    @contextmanager
    def project_epochs(self):
        """Within: the project loop's epochs timed on this clock."""
        from tasks.core.training.torch_loop import LoopState

        train_epoch = LoopState.train_epoch

        def timed(state, epoch: int):
            start = time.process_time()
            result = train_epoch(state, epoch)
            self.add(time.process_time() - start, result[2])
            return result

        LoopState.train_epoch = timed
        try:
            yield self
        finally:
            LoopState.train_epoch = train_epoch


def ddp_rates(splits: SplitPaths, config: TrainConfig, rounds: int) -> tuple[dict, dict]:
    """Samples/s, and samples per CPU second (`CpuClock`), of each of DDP_SIDES on this rank in each
    of `rounds` rounds after WARM_UP_ROUNDS, the order of the sides rotating from round to round (run
    in every worker; rank 0's figures are the report). Every side runs in the same processes: the
    project loop's process-wide settings (deterministic algorithms on CPU) hold for the bare loop
    too, from the warm-up round on."""
    import torch

    torch.set_num_threads(1)

    def run(side: str, clock: CpuClock) -> float:
        if side == "bare DDP":
            return bare_ddp_samples_per_second(splits, config, clock)
        with clock.project_epochs():
            if side == "project":
                return project_torch_samples_per_second(splits, config)
            return guarded_torch_samples_per_second(splits, config)

    rates: dict[str, list[float]] = {side: [] for side in DDP_SIDES}
    cpu_rates: dict[str, list[float]] = {side: [] for side in DDP_SIDES}
    try:
        for round_ in range(WARM_UP_ROUNDS + rounds):
            for side in DDP_SIDES[round_ % 3 :] + DDP_SIDES[: round_ % 3]:
                clock = CpuClock()
                rate = run(side, clock)
                if round_ >= WARM_UP_ROUNDS:
                    rates[side].append(rate)
                    cpu_rates[side].append(clock.rate())
    finally:
        from tasks.core.training.torch_ddp import shutdown_distributed

        shutdown_distributed()
    return rates, cpu_rates


def paired_figure(
    name: str, rates: dict[str, list[float]], side: str, goal: str = "", unit: str = "samples/s"
):
    """`side` against bare DDP: the medians of the rounds, and each round's ratio (its spread)."""
    from benchmarks.measure import Figure

    values, baselines = rates[side], rates["bare DDP"]
    ratios = [value / baseline for value, baseline in zip(values, baselines, strict=True)]
    median = statistics.median
    return Figure(name, median(values), median(baselines), unit, goal, ratios)


def fastest(rates: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each side's fastest round alone: other work on the machine only ever slows a round down, so the
    fastest is the one it disturbed least (the reasoning of the standard library's `timeit`, whose
    documentation recommends the minimum of its repeats)."""
    return {side: [max(values)] for side, values in rates.items()}


def halves(ratios: list[float]) -> tuple[float, float]:
    """The median ratio of the first and of the second half of the rounds: two runs in one, which
    should agree within a few percent where the figure is to be trusted."""
    middle = len(ratios) // 2
    return statistics.median(ratios[: max(middle, 1)]), statistics.median(ratios[middle:])


def guarded_torch_samples_per_second(splits: SplitPaths, config: TrainConfig) -> float:
    """The project loop with every step on the guarded path: no_sync backward, then the loop's own
    in-place all-reduce of DDP's buckets with the step's flags, read before the optimizer steps."""
    from tasks.core.training import torch_loop

    guarded, torch_loop.GUARDED_STEPS = torch_loop.GUARDED_STEPS, 10**9
    try:
        return project_torch_samples_per_second(splits, config)
    finally:
        torch_loop.GUARDED_STEPS = guarded


def bare_ddp_samples_per_second(
    splits: SplitPaths, config: TrainConfig, clock: CpuClock | None = None
) -> float:
    """The textbook DDP step (forward, backward, `optimizer.step()`) over this rank's rows of the
    same split, the same model, AdamW and global batch, data already in memory, no validation; the
    steps' CPU time on `clock`, where given."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from tasks.core.models.plugins import build
    from tasks.core.training.torch_ddp import init_distributed

    ctx = init_distributed(config.collective_timeout_s)
    x, y = (torch.from_numpy(a) for a in read_split(splits.train, splits.feature_names, splits.label_column))
    x, y = x[ctx.rank :: ctx.world_size], y[ctx.rank :: ctx.world_size]
    torch.manual_seed(config.seed)
    model = DistributedDataParallel(build(config.model, x.shape[1], splits.n_classes, "pytorch"))
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    per_rank = config.batch_size // ctx.world_size
    steps = len(y) // per_rank
    dist.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(config.epochs):
        order = torch.randperm(len(y))
        for step in range(steps):
            rows = order[step * per_rank : (step + 1) * per_rank]
            F.cross_entropy(model(x[rows]), y[rows]).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    dist.barrier()
    samples, seconds = steps * config.batch_size * config.epochs, time.perf_counter() - start
    if clock is not None:
        clock.add(time.process_time() - cpu_start, samples)
    return samples / seconds


def ddp_figures(work, rows: int | None, epochs: int, rounds: int | None, only: tuple[str, ...] = ()) -> list:
    """`python -m benchmarks --only ddp`: for a small MLP and a communication-heavy one (about 25M
    parameters, 100 MB of fp32 gradients), the project loop and the guarded-only loop against bare
    DDP, two CPU ranks over gloo, and the project loop per CPU second; each ratio the median of the
    rounds' ratios, with their spread and the load average over the model's rounds in the figure's
    name. `rows` and `rounds` None: each model's own (DDP_MODELS); `only`: those models alone."""
    import os

    from benchmarks.local_launch import local_workers
    from benchmarks.synthetic import write_table
    from tasks.core.data.assignment import SplitConfig
    from tasks.core.data.prepare import prepare_dataset
    from tasks.core.models.plugins import mlp_spec

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    figures = []
    for index, (name, model) in enumerate(DDP_MODELS.items()):
        if only and name not in only:
            continue
        n_rows = rows or model.rows
        data = write_table(str(work / f"ddp-{index}.parquet"), n_rows, 64)
        prepared = prepare_dataset(data, "label", str(work / f"ddp-{index}-prepared"), SplitConfig(seed=0))
        config = TrainConfig(
            epochs=epochs, batch_size=model.batch_size, model=mlp_spec(list(model.hidden), 0.0),
            collective_timeout_s=600,
        )  # fmt: skip
        load_before = os.getloadavg()[0]
        measure = local_workers(ddp_rates, f"ddp-{index}")
        rates, cpu_rates = measure(prepared.split_paths(), config, rounds or model.rounds)[0]
        load = f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}"
        where = f"2 CPU ranks, gloo, {n_rows:,} rows; {load}"
        goal = "ratio >= 0.95 (CPU: no separate engine for communication; understates overlap)"
        figures += [
            paired_figure(f"ddp: {name}, project loop vs bare DDP ({where})", rates, "project", goal),
            paired_figure(f"ddp: {name}, guarded-only loop vs bare DDP ({where})", rates, "guarded only"),
            paired_figure(f"ddp: {name}, project loop vs bare DDP, per CPU second ({where})", cpu_rates,
                          "project", unit="samples per CPU second"),
            paired_figure(f"ddp: {name}, project loop vs bare DDP, the fastest round of each ({where})",
                          fastest(rates), "project"),
        ]  # fmt: skip
    return figures


def main(argv: list[str] | None = None) -> None:
    """python -m benchmarks.loop_bench [rows] [rounds] [--only MODEL]: the DDP group alone."""
    import argparse
    import os
    import tempfile
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m benchmarks.loop_bench", description=main.__doc__)
    parser.add_argument(
        "rows", type=int, nargs="?", help="rows of every model's table (default: each model's own)"
    )
    parser.add_argument("rounds", type=int, nargs="?", help="rounds counted (default: each model's own)")
    parser.add_argument(
        "--only", choices=list(DDP_MODELS), action="append", default=[], help="this model alone"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mixedml-ddp-bench-") as tmp:
        load = os.getloadavg()[0]
        rounds = args.rounds or ", ".join(f"{name}: {model.rounds}" for name, model in DDP_MODELS.items())
        print(f"rounds {rounds} (+{WARM_UP_ROUNDS} warm-up), load average {load:.2f} at the start")
        print("| figure | median | bare DDP median | ratio (median of rounds) | rounds' ratios | halves |")
        for f in ddp_figures(Path(tmp), args.rows, 1, args.rounds, tuple(args.only)):
            first, second = halves(f.ratios)
            cells = [f.name, f"{f.value:,.1f}", f"{f.baseline:,.1f}", f"{f.ratio:.3f}", f.spread]
            print("| " + " | ".join([*cells, f"{first:.3f}, {second:.3f}"]) + " |")
        print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
