"""`python -m benchmarks [--smoke]`: every figure as a ratio against a baseline from the same run.

Full sizes are `make bench`; `--smoke` runs tiny sizes so the harness is exercised by the tests.
Timed comparisons alternate the measurement and its baseline for several rounds, so that a
shared machine's drift does not fall on one side: the pipeline reports medians, the short training
loops each side's best rate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import loop_bench, tuning_bench
from benchmarks.int8_bench import int8
from benchmarks.measure import (
    REPO,
    Figure,
    alternating_best_rates,
    child_peak_rss_gib,
    interleave,
    median_phases,
)
from benchmarks.scale_bench import scale
from benchmarks.scoring_bench import scoring
from benchmarks.synthetic import synthetic_splits, write_table
from benchmarks.tables import tables
from tasks.core.data.assignment import SplitConfig
from tasks.core.data.prepare import prepare_dataset
from tasks.core.data.splits import SplitPaths
from tasks.core.models.plugins import mlp_spec
from tasks.core.training.config import TrainConfig

FULL = {
    "pipeline_rows": 1_000_000,
    "preprocess_rows": (1_000_000, 10_000_000),
    "loop_rows": 200_000,
    "epochs": 1,
    "pipeline_rounds": 3,
    "loop_rounds": 5,
    "ddp_rows": None,  # loop_bench's own per model: enough steps and rounds that two runs agree
    "ddp_rounds": None,
    "scoring_rows": (1_000_000, 10_000_000),
    "scoring_rounds": 5,
    "scale_rows": (1_000_000, 8_000_000),
    "table_rows": 50_000,
    "table_epochs": TrainConfig.epochs,  # the default config's, as a user's first run trains
    "table_preprocess_rows": (1_000_000, 10_000_000),
}
SMOKE = {
    "pipeline_rows": 4_000,
    "preprocess_rows": (4_000, 40_000),
    "loop_rows": 4_000,
    "epochs": 1,
    "pipeline_rounds": 1,
    "loop_rounds": 1,
    "ddp_rows": 4_000,
    "ddp_rounds": 1,
    "scoring_rows": (4_000, 40_000),
    "scoring_rounds": 1,
    "scale_rows": (4_000, 32_000),
    "table_rows": 2_000,
    "table_epochs": 1,
    "table_preprocess_rows": (4_000, 40_000),
}
FEATURES, BATCH = 64, 512
# The order figure's table: ten times the loop table's rows (2,000,000 at full size, the GPU check's
# smaller loop figure), narrow, since only the row count costs the order.
ORDER_ROWS_PER_LOOP_ROW, ORDER_FEATURES = 10, 4


# A run's totals, next to its phases: the whole process's wall, and the CPU seconds of the process and
# every process it waited for (the DDP workers), which a busy machine disturbs far less than walls.
TOTALS = ("wall", "cpu")


def run_pipeline(module: str, *args: str, checkout: Path = REPO) -> dict[str, float]:
    """Seconds per phase of `python -m module args` run as a user would (imports included), plus
    its TOTALS, interpreter start and exit included. The project's code is the `checkout`'s: a
    module is found in the working directory before the installed one."""
    env = {**os.environ, "FLYTE_LOCAL_CACHE_ENABLED": "false"}
    cpu_before, start = children_cpu_seconds(), time.perf_counter()
    run = subprocess.run([sys.executable, "-m", module, *args], cwd=checkout, env=env, check=True,
                         capture_output=True, text=True)  # fmt: skip
    wall, cpu = time.perf_counter() - start, children_cpu_seconds() - cpu_before
    result = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("{")))
    return {"wall": wall, "cpu": cpu, **result["phases"]}


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def orchestration(
    work: Path, rows: int, epochs: int, rounds: int, baseline_checkout: Path | None = None
) -> list[Figure]:
    """The workflow against the plain script and the floor; with a `baseline_checkout` (another
    checkout of this project), also that checkout's workflow. Each round runs each of them once."""
    data = write_table(str(work / "pipeline.parquet"), rows, FEATURES)
    workflow_args = (data, str(epochs), str(BATCH))
    runs = {
        "workflow": lambda: run_pipeline("benchmarks.flyte_pipeline", *workflow_args),
        "plain": lambda: run_pipeline("benchmarks.plain_pipeline", data, str(work / "plain"), str(epochs), str(BATCH)),
        "empty workflow": lambda: run_pipeline("benchmarks.empty_flyte"),
        "empty plain": lambda: run_pipeline("benchmarks.empty_plain"),
    }  # fmt: skip
    if baseline_checkout:
        runs["baseline"] = lambda: run_pipeline(
            "benchmarks.flyte_pipeline", *workflow_args, checkout=baseline_checkout
        )
    medians = dict(zip(runs, map(median_phases, interleave(list(runs.values()), rounds)), strict=True))
    flyte, plain = medians["workflow"], medians["plain"]
    empty_flyte, empty_plain = medians["empty workflow"], medians["empty plain"]
    floor = {total: empty_flyte[total] - empty_plain[total] for total in TOTALS}

    def above_floor(run: dict[str, float], total: str = "wall") -> float:
        """What a workflow costs beyond the plain script, less the floor: its own code's share."""
        return run[total] - plain[total] - floor[total]

    figures = [
        Figure(f"orchestration: local training_pipeline, {rows:,} rows x {epochs} epochs, wall", flyte["wall"],
               plain["wall"], "s", "ratio <= 1.15"),
        Figure("orchestration: fixed overhead of Flyte (pipeline - plain script)", flyte["wall"] - plain["wall"],
               plain["wall"], "s"),
        Figure("orchestration floor: empty workflow of the same shape vs empty plain script", empty_flyte["wall"],
               empty_plain["wall"], "s"),
        Figure("orchestration: overhead above the floor (what the pipeline's own code adds)", above_floor(flyte),
               plain["wall"], "s", "<= 2.8 s at 1,000,000 rows x 1 epoch"),
        Figure("orchestration: overhead above the floor in CPU seconds (all processes of a run)",
               above_floor(flyte, "cpu"), plain["cpu"], "s"),
    ]  # fmt: skip
    if baseline_checkout:
        figures += checkout_figures(checkout_label(baseline_checkout), flyte, medians["baseline"], plain["wall"],
                                    above_floor)  # fmt: skip
    for phase in ("start-up", "preprocess", "train", "evaluate"):
        figures.append(
            Figure(f"orchestration phase {phase}: workflow vs plain script", flyte[phase], plain[phase], "s")
        )
    # Between tasks (literal conversion, the local store) and interpreter exit: no plain counterpart.
    figures.append(Figure("orchestration phase between tasks + interpreter start/exit: workflow vs plain script",
                          flyte["workflow"] + flyte["wall"] - phase_sum(flyte),
                          max(plain["wall"] - phase_sum(plain), 1e-3), "s"))  # fmt: skip
    return figures


def phase_sum(run: dict[str, float]) -> float:
    return sum(seconds for name, seconds in run.items() if name not in TOTALS)


def checkout_figures(
    label: str, flyte: dict[str, float], baseline: dict[str, float], plain_wall: float, above_floor
) -> list[Figure]:
    """The baseline checkout's workflow against this checkout's: their walls (the direct comparison,
    no floor subtracted) and their overheads above the floor, in wall and CPU seconds."""
    versus = f"this checkout vs baseline checkout {label}"
    return [
        Figure(f"orchestration: workflow wall, {versus}", flyte["wall"], baseline["wall"], "s"),
        Figure(f"orchestration: overhead above the floor, baseline checkout {label}", above_floor(baseline),
               plain_wall, "s"),
        Figure(f"orchestration: overhead above the floor, {versus}", above_floor(flyte), above_floor(baseline), "s"),
        Figure(f"orchestration: overhead above the floor in CPU seconds, {versus}", above_floor(flyte, "cpu"),
               above_floor(baseline, "cpu"), "s"),
    ]  # fmt: skip


def checkout_label(checkout: Path) -> str:
    """The checkout's commit, or its path where it is no git checkout."""
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True)  # fmt: skip
    return head.stdout.strip() if head.returncode == 0 else str(checkout)


def preprocessing(work: Path, sizes: tuple[int, int]) -> list[Figure]:
    results = {}
    for rows in sizes:
        data = write_table(str(work / f"pre-{rows}.parquet"), rows, FEATURES)
        for mode in ("ours", "floor"):
            results[rows, mode] = child_peak_rss_gib(
                "benchmarks.preprocess_bench", data, mode, str(work / f"o-{mode}-{rows}")
            )
    small, large = sizes
    ours, floor = results[large, "ours"], results[large, "floor"]
    rss_growth = results[large, "ours"]["peak_rss_gib"] / results[small, "ours"]["peak_rss_gib"]
    floor_growth = results[large, "floor"]["peak_rss_gib"] / results[small, "floor"]["peak_rss_gib"]
    return [
        Figure(f"preprocess: throughput at {large:,} rows", large / ours["seconds"], large / floor["seconds"],
               "rows/s", "ratio >= 0.5 of pyarrow read+write"),
        Figure(f"preprocess: peak RSS growth {small:,} -> {large:,} rows ({large // small}x data)",
               rss_growth, floor_growth, "x", "far below the data growth"),
        Figure(f"preprocess: peak RSS at {large:,} rows", ours["peak_rss_gib"], floor["peak_rss_gib"], "GiB"),
    ]  # fmt: skip


def training_loops(work: Path, rows: int, epochs: int, rounds: int) -> list[Figure]:
    data = write_table(str(work / "loop.parquet"), rows, FEATURES)
    prepared = prepare_dataset(data, "label", str(work / "loop-prepared"), SplitConfig(seed=0))
    splits = prepared.split_paths()
    config = TrainConfig(epochs=epochs, batch_size=BATCH, model=mlp_spec([256, 128], 0.1))
    os.environ.pop("WORLD_SIZE", None)
    torch_rates = alternating_best_rates(
        lambda: loop_bench.project_torch_samples_per_second(splits, config),
        lambda: loop_bench.bare_torch_samples_per_second(splits, config),
        rounds,
    )
    keras_rates = alternating_best_rates(
        lambda: loop_bench.project_keras_samples_per_second(splits, config),
        lambda: loop_bench.bare_keras_samples_per_second(splits, config),
        rounds,
    )
    figures = [
        Figure("torch loop: samples/s, project loop vs bare loop (1 process, CPU)", *torch_rates,
               "samples/s", "ratio >= 0.9"),
        Figure("keras loop: samples/s, project train_keras vs bare model.fit", *keras_rates,
               "samples/s", "ratio >= 0.9"),
    ]  # fmt: skip
    return (
        figures
        + [first_batch_wait(work, rows * ORDER_ROWS_PER_LOOP_ROW, rounds)]
        + gpu_figures(splits, config)
    )


def first_batch_wait(work: Path, rows: int, rounds: int) -> Figure:
    """The first epoch's wait for its order (permuting millions of rows on the host), which a GPU sits
    idle through: computed while the rows are read against computed when the epoch asks. Each side's
    shortest wait of `rounds`, taken in turn."""
    splits = synthetic_splits(work, "order", rows, ORDER_FEATURES)
    config = TrainConfig(epochs=1, batch_size=8192)
    sides = [
        lambda ahead=ahead: loop_bench.first_batch_wait_seconds(splits, config, ahead)
        for ahead in (True, False)
    ]
    ahead, on_demand = map(min, interleave(sides, rounds))
    return Figure(f"torch loop: the first epoch's wait for its first batch, {rows:,} rows, its order "
                  "computed while the rows are read vs when the epoch asks", ahead, on_demand, "s",
                  "ratio < 1")  # fmt: skip


def gpu_figures(splits: SplitPaths, config: TrainConfig) -> list[Figure]:
    import torch

    if not torch.cuda.is_available():
        print("gpu: skipped (no CUDA device on this machine)")
        return []
    amp_on = loop_bench.bare_torch_samples_per_second(splits, config, device="cuda", amp=True)
    amp_off = loop_bench.bare_torch_samples_per_second(splits, config, device="cuda", amp=False)
    hidden = [8192, 8192]
    big = TrainConfig(epochs=1, batch_size=8192, model=mlp_spec(hidden, 0.0))
    rate = loop_bench.bare_torch_samples_per_second(splits, big, device="cuda", amp=True)
    flops = rate * loop_bench.model_flops_per_sample(len(splits.feature_names), hidden, splits.n_classes)
    peak = float(os.environ.get("MIXEDML_PEAK_BF16_FLOPS", "989e12"))  # H100 SXM dense bf16
    return [
        Figure("gpu: bare loop samples/s, bf16 autocast on vs off", amp_on, amp_off, "samples/s"),
        Figure(
            f"gpu: model FLOP utilisation, MLP 2x8192 ({torch.cuda.get_device_name()})", flops, peak, "FLOP/s"
        ),
    ]


def machine() -> str:
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {device}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the harness")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--only",
        choices=[
            "orchestration",
            "preprocess",
            "loops",
            "ddp",
            "scoring",
            "scale",
            "tables",
            "int8",
            "tuning",
        ],
        help="run one group",
    )
    parser.add_argument("--rows", type=int, help="rows of the orchestration table (default 1,000,000)")
    parser.add_argument("--epochs", type=int,
                        help="epochs of the pipeline and the loops (default 1) and of the tables' MLP (default "
                             f"{TrainConfig.epochs})")  # fmt: skip
    parser.add_argument("--rounds", type=int, help="rounds of the pipeline comparison (default 3)")
    parser.add_argument("--baseline-checkout", type=Path, metavar="DIR",
                        help="another checkout of this project (e.g. a git worktree of an earlier commit): its "
                             "workflow joins the orchestration rounds, and its overhead above the floor is "
                             "compared with this checkout's")  # fmt: skip
    args = parser.parse_args()
    overrides = {
        "pipeline_rows": args.rows,
        "epochs": args.epochs,
        "table_epochs": args.epochs,
        "pipeline_rounds": args.rounds,
    }
    sizes = (SMOKE if args.smoke else FULL) | {key: value for key, value in overrides.items() if value}
    with tempfile.TemporaryDirectory(prefix="mixedml-bench-") as tmp:
        work = Path(tmp)
        # The runs leave flytekit's sandboxes (a workflow's outputs among them, hundreds of MB at full
        # size), torch elastic's logs and torch.compile's cache in the temporary folder: make it this one.
        os.environ["TMPDIR"] = tmp
        tempfile.tempdir = None  # this process reads TMPDIR again too
        groups = {
            "orchestration": lambda: orchestration(
                work,
                sizes["pipeline_rows"],
                sizes["epochs"],
                sizes["pipeline_rounds"],
                args.baseline_checkout,
            ),
            "preprocess": lambda: preprocessing(work, sizes["preprocess_rows"]),
            "loops": lambda: training_loops(work, sizes["loop_rows"], sizes["epochs"], sizes["loop_rounds"]),
            "ddp": lambda: loop_bench.ddp_figures(
                work, sizes["ddp_rows"], sizes["epochs"], sizes["ddp_rounds"]
            ),
            "scoring": lambda: scoring(work, sizes["scoring_rows"], sizes["scoring_rounds"]),
            "scale": lambda: scale(work, sizes["scale_rows"]),
            "tables": lambda: tables(
                work,
                sizes["table_rows"],
                TrainConfig(epochs=sizes["table_epochs"]),
                sizes["table_preprocess_rows"],
            ),
            "int8": lambda: int8(work, args.smoke),
            "tuning": lambda: tuning_bench.tuning(
                work, tuning_bench.SMOKE if args.smoke else tuning_bench.FULL
            ),
        }
        figures = []
        for name, run in groups.items():
            if args.only in (None, name):
                for figure in run():
                    print(figure.line(), flush=True)
                    figures.append(figure)
    print(f"\nmachine: {machine()}\n")
    print("| figure | value | baseline | ratio | goal |\n|---|---|---|---|---|")
    for f in figures:
        print(
            f"| {f.name} | {f.value:,.3f} {f.unit} | {f.baseline:,.3f} {f.unit} | {f.ratio:.3f} | {f.goal} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps([f.__dict__ | {"ratio": f.ratio} for f in figures], indent=2))


if __name__ == "__main__":
    main()
