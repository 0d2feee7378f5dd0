"""Preprocessing on CPU: validate the input table, split it, encode and standardise its features.

In one pod (`preprocess`), or, for an input too large for one, in pieces that map tasks read at once
(`preprocess_in_pieces`, tasks/core/data/pieces.py): the same rows in each split either way.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
from flytekit import FlyteContextManager, Resources, current_context, map_task, task
from flytekit.types.file import FlyteFile
from flytekit.types.structured import StructuredDataset

from tasks.core.data.config import DataConfig
from tasks.core.data.encoding import EncodingStats
from tasks.core.data.pieces import (
    DataPiece,
    assign_pieces,
    collected,
    encoded,
    merged_encoding,
    merged_scaler,
    piece_stats,
    write_piece,
)
from tasks.core.data.prepare import PreparedTable, prepare_dataset, write_embedded_digits
from tasks.core.data.scaling import ScalerStats
from tasks.core.planning.planner import PreprocessPlan
from tasks.hardware import CPU_IMAGE, CPU_RETRIES, PIECE_RETRIES, PREPROCESS_CPU, SMALL_CPU, guaranteed
from tasks.plumbing.code_version import code_version, imported_closure
from tasks.plumbing.decks import DECKS, dataset_profile_deck
from tasks.plumbing.process import begin_task
from tasks.plumbing.storage import parquet_dataset
from tasks.types import PieceSplits, PreparedData

log = logging.getLogger(__name__)
# How reports name the input when no dataset was given.
EMBEDDED_SOURCE = "embedded:sklearn-digits"


def resolve_dataset(dataset: str, scratch: Path) -> str:
    """The user's URI, or the embedded digits dataset when none was given."""
    return dataset or write_embedded_digits(str(scratch))


# The code that shapes the splits: this module and what the preparation in tasks/core imports (not
# training's or serving's code, so editing those keeps users' cached splits).
SPLIT_SHAPING_MODULES = imported_closure("tasks.core.data.prepare", "tasks.core.data.pieces") | {
    "tasks.preprocess"
}
PREPROCESS_CODE_VERSION = code_version(*SPLIT_SHAPING_MODULES)
# Every preprocessing task is cached: the key is the inputs, including the data's fingerprint (so a
# rewritten file at the same URI recomputes), plus the hash of the code above. The pieces' keys hold
# the cached label scan's output, which names the folder they write: a rerun finds their parts there.
CACHED = {"cache": True, "cache_version": PREPROCESS_CODE_VERSION}
PIECE_CONCURRENCY = 16  # pods reading the input at once


@task(container_image=CPU_IMAGE, **guaranteed(PREPROCESS_CPU), **CACHED, **DECKS, retries=CPU_RETRIES)
def preprocess(data: DataConfig, dataset_fingerprint: str = "") -> PreparedData:
    """`data` split, encoded and standardised in this pod; `data` is checked already (`prepare_data`)."""
    begin_task()
    scratch = Path(current_context().working_directory)
    uri = resolve_dataset(data.dataset, scratch)
    out_dir = scratch / "prepared"
    prepared = prepare_dataset(uri, data.label_column, str(out_dir), data.split, data.column_kinds)
    table = replace(prepared.table, source=data.dataset or EMBEDDED_SOURCE)
    report_prepared(table)
    splits = {name: parquet_dataset(str(Path(path).parent)) for name, path in prepared.paths.items()}
    return PreparedData(**splits, table=table, fingerprint=dataset_fingerprint)


def report_prepared(table: PreparedTable) -> None:
    log.info(
        "prepared %s: %s rows, %d features, %d classes; %s",
        table.source,
        table.rows,
        len(table.feature_names),
        len(table.class_labels),
        table.target.describe(),
    )
    for note in table.notes:  # also in the report; logged here as the run goes
        log.warning("%s", note)
    dataset_profile_deck(table)


@task(container_image=CPU_IMAGE, **guaranteed(PREPROCESS_CPU), **CACHED, retries=CPU_RETRIES)
def assign_piece_splits(data: DataConfig, dataset_fingerprint: str, pieces: list[DataPiece]) -> PieceSplits:
    """Every row's class and split, from the label column (and the `split_by` column) alone, and the
    folder the pieces write to."""
    begin_task()
    assignment = str(Path(current_context().working_directory) / "assignment.npy")
    output = FlyteContextManager.current_context().file_access.get_random_remote_directory()
    layout = assign_pieces(
        data.dataset, data.label_column, data.split, pieces, output, assignment, data.column_kinds
    )
    log.info(
        "%s: %d rows in %d pieces, written under %s", data.dataset, layout.first_rows[-1], len(pieces), output
    )
    return PieceSplits(layout=layout, assignment=FlyteFile(assignment), fingerprint=dataset_fingerprint)


def local_assignment(splits: PieceSplits) -> np.ndarray:
    return np.load(splits.assignment.download(), mmap_mode="r")


@task(container_image=CPU_IMAGE, **guaranteed(PREPROCESS_CPU), **CACHED, retries=PIECE_RETRIES)
def piece_encoding_stats(splits: PieceSplits, piece: DataPiece) -> dict:
    """The piece's feature values read as their kinds, and the encoding statistics of its train rows
    (`EncodingStats.to_dict`)."""
    begin_task()
    return piece_stats(splits.layout, piece, local_assignment(splits)).to_dict()


@task(container_image=CPU_IMAGE, **guaranteed(SMALL_CPU), **CACHED, retries=CPU_RETRIES)
def fit_piece_encoding(splits: PieceSplits, stats: list[dict]) -> str:
    """The encoding fitted on every piece's train rows, once: the JSON text `PreparedTable.encoding` holds."""
    begin_task()
    return merged_encoding(splits.layout, [EncodingStats.from_dict(piece) for piece in stats])


@task(container_image=CPU_IMAGE, **guaranteed(SMALL_CPU), **CACHED, retries=CPU_RETRIES)
def fit_piece_scaler(splits: PieceSplits, encoding: str, stats: list[dict]) -> ScalerStats:
    """The standardisation of the encoded features fitted on every piece's train rows."""
    begin_task()
    layout = encoded(splits.layout, encoding)
    return merged_scaler(layout, [EncodingStats.from_dict(piece) for piece in stats])


@task(container_image=CPU_IMAGE, **guaranteed(PREPROCESS_CPU), **CACHED, retries=PIECE_RETRIES)
def write_piece_splits(
    splits: PieceSplits, encoding: str, scaler: ScalerStats, piece: DataPiece
) -> dict[str, int]:
    """The piece's part of each split; the rows written, by split."""
    begin_task()
    return write_piece(encoded(splits.layout, encoding), piece, local_assignment(splits), scaler)


@task(container_image=CPU_IMAGE, **guaranteed(SMALL_CPU), **CACHED, **DECKS, retries=CPU_RETRIES)
def collect_piece_splits(
    splits: PieceSplits, encoding: str, scaler: ScalerStats, written: list[dict[str, int]]
) -> PreparedData:
    """The folders of parts as the splits, once every piece wrote its rows."""
    begin_task()
    prepared = collected(encoded(splits.layout, encoding), scaler, written)
    report_prepared(prepared.table)
    folders = {
        name: StructuredDataset(uri=path, file_format="parquet") for name, path in prepared.paths.items()
    }
    return PreparedData(**folders, table=prepared.table, fingerprint=splits.fingerprint)


def preprocess_in_pieces(
    data: DataConfig,
    dataset_fingerprint: str,
    pieces: list[DataPiece],
    plan: PreprocessPlan,
    plan_resources: bool,
) -> PreparedData:
    """`preprocess`'s result from map tasks over `pieces`, for a @dynamic to run. The label scan gets the planned memory; the pieces that of a few batches. The
    pieces read the input twice: for the statistics of their train rows, from which the encoding and
    the standardisation are fitted once all are in; and to write their parts."""
    splits = assign_piece_splits(data=data, dataset_fingerprint=dataset_fingerprint, pieces=pieces)
    mapped = partial(map_task, concurrency=PIECE_CONCURRENCY)
    stats = mapped(partial(piece_encoding_stats, splits=splits))(piece=pieces)
    encoding = fit_piece_encoding(splits=splits, stats=stats)
    scaler = fit_piece_scaler(splits=splits, encoding=encoding, stats=stats)
    written = mapped(partial(write_piece_splits, splits=splits, encoding=encoding, scaler=scaler))(
        piece=pieces
    )
    if plan_resources:
        for node, mem in (
            (splits, plan.mem),
            (stats, plan.piece_mem),
            (written, plan.piece_mem),
        ):
            sized = Resources(cpu=plan.cpu, mem=mem)
            node.with_overrides(requests=sized, limits=sized)
    return collect_piece_splits(splits=splits, encoding=encoding, scaler=scaler, written=written)
