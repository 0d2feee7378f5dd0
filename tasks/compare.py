"""Comparison on CPU: GPU against TPU on accuracy, time and estimated cost."""

from __future__ import annotations

from flytekit import task

from tasks.catalog import DEFAULT_PRICES_PER_HOUR
from tasks.core.evaluation.compare import HardwareComparison, RunSummary, compare_runs, price_problems
from tasks.core.messages import raise_for
from tasks.hardware import CPU_IMAGE, CPU_RETRIES, SMALL_CPU, guaranteed
from tasks.plumbing.decks import DECKS, comparison_deck
from tasks.plumbing.process import running_locally
from tasks.types import EvaluationReport


def summarise(name: str, report: EvaluationReport) -> RunSummary:
    """A run by its own metric: a regression's RMSE and R², a classification's accuracy and macro-F1."""
    if report.regression is not None:
        figures = report.regression
        return RunSummary(name, report.training, report.billed, 0.0, 0.0, figures.rmse, figures.r2)
    return RunSummary(name, report.training, report.billed, report.metrics.accuracy, report.metrics.macro_f1)


@task(container_image=CPU_IMAGE, **guaranteed(SMALL_CPU), retries=CPU_RETRIES)
def check_prices(prices: dict[str, float]) -> None:
    """The comparison's prices, checked first: the comparison prepares its data only once they pass,
    so a bad price fails before any accelerator is requested."""
    raise_for(price_problems(prices, DEFAULT_PRICES_PER_HOUR))


@task(
    container_image=CPU_IMAGE,
    **guaranteed(SMALL_CPU),
    **DECKS,
    retries=CPU_RETRIES,
)
def compare(gpu: EvaluationReport, tpu: EvaluationReport, prices: dict[str, float]) -> HardwareComparison:
    runs = [summarise("gpu (pytorch)", gpu), summarise("tpu (tensorflow)", tpu)]
    comparison = compare_runs(runs, prices, DEFAULT_PRICES_PER_HOUR)
    comparison_deck(comparison)
    if not running_locally():  # where pyflyte prints the outputs, the table would appear twice
        print(comparison.table(), flush=True)
    return comparison
