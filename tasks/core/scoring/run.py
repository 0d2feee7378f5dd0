"""Scoring a table in one process: plan, pieces, report."""

from __future__ import annotations

from collections.abc import Sequence

from tasks.core.bundle.loading import load_bundle
from tasks.core.publish.versions import resolve_bundle
from tasks.core.scoring.piece import score_piece
from tasks.core.scoring.plan import plan_scoring, release_output
from tasks.core.scoring.records import PIECE_ROWS, ScoringReport
from tasks.core.scoring.report import summarise

# ---- all in one process ---------------------------------------------------------------------------------


def score_dataset(
    model: str,
    dataset: str,
    output: str,
    label_column: str = "",
    rows_per_piece: int = PIECE_ROWS,
    trusted_builders: Sequence[str] = (),
) -> ScoringReport:
    """Score `dataset` with the bundle (or latest published bundle) `model` into parquet parts under
    `output`, piece after piece in this process. A failure removes the parts it wrote."""
    model = resolve_bundle(model)
    bundle = load_bundle(model, trusted_builders=trusted_builders)
    plan = plan_scoring(model, dataset, output, label_column, rows_per_piece, bundle, trusted_builders)
    try:
        results = [score_piece(plan.job, piece, bundle) for piece in plan.pieces]
        return summarise(plan, results, bundle=bundle)
    except BaseException:
        release_output(output, keep_parts=False)  # a failed scoring leaves no parts
        raise
