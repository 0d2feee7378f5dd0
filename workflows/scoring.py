"""Batch scoring: a model bundle (or the latest one published under a prefix) over a table of any size."""

from __future__ import annotations

from flytekit import workflow

from tasks.core.scoring.records import PIECE_ROWS
from tasks.score import Scored, score, scoring_fan_out


@workflow
def batch_predict(
    model: str,
    dataset: str,
    label_column: str = "",
    output: str = "",
    max_parallel: int = 8,
    hardware: str = "auto",
    rows_per_piece: int = PIECE_ROWS,
    trusted_builders: list[str] = [],  # noqa: B006 - Flyte needs the literal default
) -> Scored:
    """Score every row of a table with a trained model; return the predictions and a report.

    Args:
        model: a model bundle folder (a run's `model` output) or a prefix that `publish_to` wrote,
            whose LATEST names the version to use; a local path or fsspec URI.
        dataset: parquet or CSV file, a folder of part files, or any fsspec URI (s3://, gs://, ...).
            Columns are matched by name; columns the model does not read are passed through.
        label_column: a column of true labels to report metrics against, not one the model reads;
            empty: the model's label column, where the dataset has it.
        output: a new or empty folder (path or URI) for the predictions' parquet parts, or one that an
            unfinished scoring of the same dataset left (its parts are replaced); empty: Flyte's own
            storage.
        max_parallel: pieces scored at the same time (pods on a cluster).
        hardware: auto (CPU pods, or a GPU where the measured cost per row and the rows make it
            cheaper), cpu or gpu.
        rows_per_piece: a parquet file with more rows is scored in several pieces, by row groups.
        trusted_builders: a user's model builders ("package.module:function") the bundle may name;
            a bundle naming any other is refused before its code is imported. The built-ins (mlp,
            cnn) are always trusted.
    """
    fan_out = scoring_fan_out(max_parallel=max_parallel, hardware=hardware, rows_per_piece=rows_per_piece)
    return score(
        model=model, dataset=dataset, label_column=label_column, output=output, fan_out=fan_out,
        trusted_builders=trusted_builders,
    )  # fmt: skip
