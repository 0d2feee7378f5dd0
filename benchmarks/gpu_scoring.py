"""The GPU check's scoring figures: a bundle scoring a parquet file on the GPU against the CPU.

The scorer's choice of hardware predicts how many times one CPU core's rows per second a whole GPU
scores a bundle (`RowCost` in `tasks.core.scoring.records`: the model's forward pass `GPU_MODEL_SPEEDUP` times
faster, reading, checking and writing as fast); these figures measure that ratio on this machine, for
the small MLP of the CPU scoring benchmark and for a wide one, and also against all of its cores. Each
side runs the whole scorer (plan, read, check, model, write) on a table of the same shape; the CPU's
has a tenth of the rows, as its rate per row is what counts.
"""

from __future__ import annotations

import itertools
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from benchmarks.gpu_figures import GpuFigure, Sizes, require_cuda, require_modules
from benchmarks.measure import interleave
from benchmarks.scoring_bench import FEATURES, MODEL, write_bundle_for
from benchmarks.synthetic import write_table
from tasks.core.bundle.loading import Bundle, load_bundle
from tasks.core.scoring.piece import gpu_bundle, score_piece
from tasks.core.scoring.plan import plan_scoring

WIDE_MODEL = [2048, 2048]  # where the dense layers, not reading and writing, are most of the work


@contextmanager
def cpu_threads(count: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class ScoringRun:
    """One bundle scoring one table into a fresh folder under `work` per call; rows per second."""

    def __init__(self, bundle_uri: str, bundle: Bundle, table: str, work: Path):
        self.bundle_uri, self.bundle, self.table, self.work = bundle_uri, bundle, table, work
        self.calls = itertools.count()

    def rate(self) -> float:
        output = self.work / f"scored-{next(self.calls)}"
        plan = plan_scoring(self.bundle_uri, self.table, str(output), bundle=self.bundle)
        start = time.perf_counter()
        rows = sum(score_piece(plan.job, piece, self.bundle).rows for piece in plan.pieces)
        seconds = time.perf_counter() - start
        shutil.rmtree(output, ignore_errors=True)
        return rows / seconds


def cpu_rate(run: ScoringRun, threads: int) -> float:
    with cpu_threads(threads):
        return run.rate()


def predicted_speedup(run: ScoringRun) -> float:
    """The GPU's speed-up over one core that the scorer's hardware choice predicts for this bundle."""
    with cpu_threads(1):
        plan = plan_scoring(run.bundle_uri, run.table, str(run.work / "planned"), bundle=run.bundle)
    return plan.row_cost.gpu_speedup()


def model_figures(work: Path, tables: dict[str, str], hidden: list[int], rounds: int) -> list[GpuFigure]:
    """GPU against one core (the planner's unit, goal: at least the speed-up it predicts) and all cores."""
    bundle_uri = write_bundle_for(work / f"bundle-{'x'.join(map(str, hidden))}", tables["gpu"], hidden)
    on_gpu = ScoringRun(bundle_uri, gpu_bundle(bundle_uri), tables["gpu"], work)
    on_cpu = ScoringRun(bundle_uri, load_bundle(bundle_uri), tables["cpu"], work)
    cores = torch.get_num_threads()
    predicted = predicted_speedup(on_cpu)
    what = f"scoring rows/s, MLP {'x'.join(map(str, hidden))} on {FEATURES} features, GPU"
    # Each side's fastest of `rounds` runs, taken in turn: a shared machine only ever slows a run down.
    gpu, one_core, all_cores = map(
        max, interleave([on_gpu.rate, lambda: cpu_rate(on_cpu, 1), lambda: cpu_rate(on_cpu, cores)], rounds)
    )
    return [
        GpuFigure(f"{what} vs one CPU core (the scorer predicts {predicted:.1f}x)", gpu, one_core,
                  "rows/s", low=predicted),
        GpuFigure(f"{what} vs {cores} CPU threads", gpu, all_cores, "rows/s"),
    ]  # fmt: skip


# Loading a bundle decodes its manifest with mashumaro: pure Python, installable offline from a wheel.
BUNDLE_MANIFEST_DECODER = "mashumaro"
MANIFEST_DECODER_HINT = (
    "loading a bundle decodes its manifest with it; a pure-Python wheel, installable offline with "
    "`pip install --no-index --find-links DIR mashumaro`"
)


def scoring_on_gpu(work: Path, sizes: Sizes) -> list[GpuFigure]:
    require_cuda()
    require_modules((BUNDLE_MANIFEST_DECODER, MANIFEST_DECODER_HINT))
    # A tenth of the rows for the CPU: one core scoring the wide model takes seconds, not minutes.
    tables = {
        "gpu": write_table(str(work / "score-gpu.parquet"), sizes.scoring_rows, FEATURES),
        "cpu": write_table(str(work / "score-cpu.parquet"), max(sizes.scoring_rows // 10, 4096), FEATURES),
    }
    figures = []
    for hidden in (MODEL["hidden_sizes"], WIDE_MODEL):
        figures += model_figures(work, tables, hidden, sizes.rounds)
    return figures
