"""The scoring's report: the pieces' counts added up, their notes, and the metrics where the input holds
labels."""

from __future__ import annotations

import numpy as np

from tasks.core.bundle.loading import Bundle
from tasks.core.data.api import merged_unseen
from tasks.core.evaluation.metrics import RegressionSums, metrics_from_confusion
from tasks.core.messages import preview
from tasks.core.scoring.output import OutputLayout
from tasks.core.scoring.plan import decode_schema, release_output
from tasks.core.scoring.records import (
    NON_FINITE_EXAMPLES,
    UNMATCHED_EXAMPLES,
    HardwareChoice,
    PieceResult,
    ScoringPlan,
    ScoringReport,
)

# ---- the report -----------------------------------------------------------------------------------------


def summarise(
    plan: ScoringPlan,
    results: list[PieceResult],
    hardware: HardwareChoice | None = None,
    bundle: Bundle | None = None,
) -> ScoringReport:
    """The pieces' counts added up; refuses a set of parts that lost or gained rows."""
    results = sorted(results, key=lambda result: result.index)
    if [r.index for r in results] != [p.index for p in plan.pieces]:
        raise RuntimeError(f"{len(results)} parts came back for {len(plan.pieces)} pieces")
    for piece, result in zip(plan.pieces, results, strict=True):
        if piece.rows >= 0 and piece.rows != result.rows:
            raise RuntimeError(
                f"{piece.file}: part {result.part} holds {result.rows:,} rows, not {piece.rows:,}"
            )
    bundle = bundle or plan.job.bundle()
    if bundle.target.regression:
        return summarise_numbers(plan, results, hardware)
    layout = OutputLayout.of(bundle, decode_schema(plan.job.schema))
    labels = [str(label) for label in bundle.class_labels]
    report = empty_report(plan, results, hardware, dict(zip(labels, layout.probabilities, strict=True)))
    if layout.suffixed:
        report.notes.append(
            f"the input already has columns named as this scoring's probabilities; these are in "
            f"{preview([f'{new} (not {old})' for old, new in layout.suffixed.items()])}"
        )
    add_non_finite_note(report, results)
    report.notes += merged_unseen(r.unseen for r in results).notes()
    if plan.job.label_column:
        add_report_metrics(report, results, labels, plan.job.label_column)
    release_output(plan.job.output, keep_parts=True)
    return report


def empty_report(
    plan: ScoringPlan, results: list[PieceResult], hardware: HardwareChoice | None, probability_columns: dict
) -> ScoringReport:
    """The report's counts, before its notes and metrics."""
    return ScoringReport(
        model=plan.job.model,
        dataset=plan.job.dataset,
        output=plan.job.output,
        rows=sum(r.rows for r in results),
        pieces=len(results),
        probability_columns=probability_columns,
        hardware=hardware,
        non_finite_rows=sum(r.non_finite for r in results),
    )


def summarise_numbers(
    plan: ScoringPlan, results: list[PieceResult], hardware: HardwareChoice | None
) -> ScoringReport:
    """A regression's report: its pieces' error sums merged into RMSE, MAE and R², with the train mean's."""
    report = empty_report(plan, results, hardware, {})
    add_non_finite_note(report, results)
    report.notes += merged_unseen(r.unseen for r in results).notes()
    label_column = plan.job.label_column
    if label_column:
        if unmatched := sum(r.unmatched for r in results):
            report.notes.append(
                f"{unmatched:,} rows have no number in '{label_column}' (missing or not a number); "
                "the metrics leave them out"
            )
        sums = RegressionSums()
        for result in results:
            sums = sums.merge(result.regression or RegressionSums())
        if sums.rows:
            report.regression = sums.metrics(report.non_finite_rows)
            report.notes += report.regression.notes()
    release_output(plan.job.output, keep_parts=True)
    return report


def add_non_finite_note(report: ScoringReport, results: list[PieceResult]) -> None:
    if report.non_finite_rows:
        examples = [example for result in results for example in result.non_finite_examples]
        report.notes.append(
            f"{report.non_finite_rows:,} rows got model outputs that are not finite numbers (the first: "
            f"{preview(examples[:NON_FINITE_EXAMPLES])}): their prediction and probabilities are null, "
            "and the metrics leave them out"
        )


def add_report_metrics(
    report: ScoringReport, results: list[PieceResult], labels: list[str], label_column: str
) -> None:
    confusion = np.sum([np.array(r.confusion, dtype=np.int64) for r in results], axis=0)
    unmatched = sum(r.unmatched for r in results)
    if unmatched:
        examples = list(dict.fromkeys(e for r in results for e in r.unmatched_examples))
        report.notes.append(
            f"{unmatched:,} rows have a label in '{label_column}' that is missing or not a class of the model "
            f"(e.g. {preview(examples, UNMATCHED_EXAMPLES)}); the metrics leave them out"
        )
    if confusion.sum():
        report.metrics = metrics_from_confusion(confusion, labels)
        report.notes += report.metrics.notes()  # a model no better than the majority class, named
