"""Comparison on CPU: GPU against TPU on accuracy, time and estimated cost."""

from __future__ import annotations

from flytekit import task

from tasks.core.compare import HardwareComparison, RunSummary, compare_runs
from tasks.decks import DECKS, comparison_deck
from tasks.hardware import CPU_IMAGE, EVALUATE_CPU, guaranteed
from tasks.types import EvaluationReport


def summarise(name: str, report: EvaluationReport) -> RunSummary:
    return RunSummary(name, report.training, report.billed, report.metrics.accuracy, report.metrics.macro_f1)


@task(
    container_image=CPU_IMAGE,
    **guaranteed(EVALUATE_CPU),
    **DECKS,
)
def compare(gpu: EvaluationReport, tpu: EvaluationReport, prices: dict[str, float]) -> HardwareComparison:
    comparison = compare_runs([summarise("gpu (pytorch)", gpu), summarise("tpu (tensorflow)", tpu)], prices)
    comparison_deck(comparison)
    print(comparison.table(), flush=True)
    return comparison
