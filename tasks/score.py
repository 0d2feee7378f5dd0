"""Batch scoring on Flyte: plan on a small CPU pod, score the pieces with a map task, add up the counts.

`score` is `@dynamic`: it checks every input and measures the model's cost on the first rows
(tasks/core/scoring/plan.py), decides between CPU pods and a GPU, and only then maps the scoring task over
the pieces, so no accelerator is requested before the plan says so. Every piece writes its own parquet
part into one output folder, which `collect_scores` returns as one StructuredDataset.
"""

from __future__ import annotations

import html
import logging
from functools import partial
from typing import NamedTuple

from flytekit import Deck, FlyteContextManager, dynamic, map_task, task
from flytekit.types.structured import StructuredDataset

from tasks.catalog import DEFAULT_PRICES_PER_HOUR, GPU_CATALOG
from tasks.core.accelerators.cuda_check import require_cuda
from tasks.core.accelerators.rule import on_flyte_cluster
from tasks.core.scoring.cpu_or_gpu import cheapest_whole_gpu, check_hardware, choose_hardware
from tasks.core.scoring.piece import gpu_bundle, score_piece
from tasks.core.scoring.plan import plan_scoring
from tasks.core.scoring.records import (
    FanOut,
    HardwareChoice,
    PieceResult,
    ScoringJob,
    ScoringPiece,
    ScoringPlan,
    ScoringReport,
)
from tasks.core.scoring.report import summarise
from tasks.core.training.tf_strategy import require_gpus
from tasks.hardware import (
    CPU_RETRIES,
    LAUNCHER_RETRIES,
    ML_CPU_IMAGE,
    PIECE_RETRIES,
    PREPROCESS_CPU,
    SMALL_CPU,
    TF_GPU_IMAGE,
    TORCH_GPU_IMAGE,
    gpu_option_overrides,
    guaranteed,
)
from tasks.plumbing.decks import DECKS
from tasks.plumbing.process import begin_task, running_locally

log = logging.getLogger(__name__)

# The predictions (a folder of parquet parts) and what the scoring found. The functional form keeps the
# field types real classes, as flytekit reads them, under postponed annotations.
Scored = NamedTuple("Scored", [("predictions", StructuredDataset), ("report", ScoringReport)])  # noqa: UP014

# The GPU tasks declare the cheapest whole GPU; the plan's overrides put them on the option it chose.
DEFAULT_GPU = cheapest_whole_gpu(GPU_CATALOG)
GPU_PIECE = gpu_option_overrides(DEFAULT_GPU)
# On a cluster a GPU piece scores on its GPU or fails naming it, never on the host CPU
# (tasks/core/accelerators/rule.py); the planner's overrides may put it on another GPU than this one.
DECLARED_GPU = f"1 x {DEFAULT_GPU.device} GPU (its pod requests nvidia.com/gpu)"


@task(container_image=ML_CPU_IMAGE, **guaranteed(PREPROCESS_CPU), retries=PIECE_RETRIES)
def score_piece_cpu(job: ScoringJob, piece: ScoringPiece) -> PieceResult:
    begin_task()
    return score_piece(job, piece)


@task(container_image=TORCH_GPU_IMAGE, **GPU_PIECE, retries=PIECE_RETRIES)
def score_piece_torch_gpu(job: ScoringJob, piece: ScoringPiece) -> PieceResult:
    begin_task()
    if on_flyte_cluster():
        require_cuda(DECLARED_GPU, 1)
    return score_piece(job, piece, gpu_bundle(job.model, job.trusted_builders))


@task(container_image=TF_GPU_IMAGE, **GPU_PIECE, retries=PIECE_RETRIES)
def score_piece_tf_gpu(job: ScoringJob, piece: ScoringPiece) -> PieceResult:
    begin_task()
    if on_flyte_cluster():
        require_gpus(DECLARED_GPU, 1)
    return score_piece(job, piece)


# The GPU task for each framework: a GPU image holds one framework.
GPU_PIECE_TASKS = {"pytorch": score_piece_torch_gpu, "tensorflow": score_piece_tf_gpu}


@task(container_image=ML_CPU_IMAGE, **guaranteed(SMALL_CPU), **DECKS, retries=CPU_RETRIES)
def collect_scores(plan: ScoringPlan, hardware: HardwareChoice, results: list[PieceResult]) -> Scored:
    """The parts as one dataset, and the metrics where the input holds the label column."""
    begin_task()
    report = summarise(plan, results, hardware)
    Deck("Scoring", f"<pre>{html.escape(report.summary())}</pre>")
    if not running_locally():  # where pyflyte prints the outputs, the report would appear twice
        print(report.summary(), flush=True)
    return Scored(StructuredDataset(uri=plan.job.output, file_format="parquet"), report)


@task(container_image=ML_CPU_IMAGE, **guaranteed(SMALL_CPU), retries=CPU_RETRIES)
def scoring_fan_out(max_parallel: int, hardware: str, rows_per_piece: int) -> FanOut:
    """The fan-out settings as one input of `score`, checked before any row is read."""
    begin_task()
    check_hardware(hardware)
    if max_parallel < 1:
        raise ValueError(f"max_parallel={max_parallel} must be at least 1")
    return FanOut(max_parallel, hardware, rows_per_piece)


@dynamic(container_image=ML_CPU_IMAGE, **guaranteed(SMALL_CPU), **DECKS, retries=LAUNCHER_RETRIES)
def score(
    model: str,
    dataset: str,
    label_column: str,
    output: str,
    fan_out: FanOut,
    trusted_builders: list[str] | None = None,
) -> Scored:
    """Plan on CPU, then score the pieces, at most `fan_out.max_parallel` at a time."""
    begin_task()
    output = output or FlyteContextManager.current_context().file_access.get_random_remote_directory()
    plan = plan_scoring(
        model, dataset, output, label_column, fan_out.rows_per_piece, trusted_builders=trusted_builders or ()
    )
    choice = choose_hardware(plan, DEFAULT_PRICES_PER_HOUR["cpu"], GPU_CATALOG, fan_out.hardware)
    log.info("scoring %s with %s: %d pieces on %s (%s)", dataset, plan.job.model, len(plan.pieces),
             choice.device, choice.reason)  # fmt: skip
    scorer = score_piece_cpu if choice.device == "cpu" else GPU_PIECE_TASKS[plan.framework]
    results = map_task(partial(scorer, job=plan.job), concurrency=fan_out.max_parallel)(piece=plan.pieces)
    if choice.device != "cpu":
        results = results.with_overrides(**gpu_option_overrides(choice.gpu))
    return collect_scores(plan=plan, hardware=choice, results=results)
