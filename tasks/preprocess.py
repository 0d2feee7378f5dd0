"""Preprocessing on CPU: validate the input table, split it, standardise it."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from dataclasses import replace
from pathlib import Path

from flytekit import current_context, task

from tasks.core.data import SplitConfig, prepare_dataset, write_embedded_digits
from tasks.core.validation import embedded_label_problems, raise_for
from tasks.decks import DECKS, dataset_profile_deck
from tasks.hardware import CPU_IMAGE, PREPROCESS_CPU, guaranteed
from tasks.logs import setup_logging
from tasks.storage import parquet_dataset
from tasks.types import PreparedData

log = logging.getLogger(__name__)
# How reports name the input when no dataset was given.
EMBEDDED_SOURCE = "embedded:sklearn-digits"


def resolve_dataset(dataset: str, label_column: str, scratch: Path) -> str:
    """The user's URI, or the embedded digits dataset when none was given."""
    if dataset:
        return dataset
    raise_for(embedded_label_problems(dataset, label_column))
    return write_embedded_digits(str(scratch))


def code_version(*modules: str) -> str:
    """A hash of the source that decides preprocessing's output: editing it invalidates the cache."""
    digest = hashlib.sha256()
    for module in modules:
        digest.update(Path(importlib.util.find_spec(module).origin).read_bytes())
    return digest.hexdigest()[:16]


PREPROCESS_CODE_VERSION = code_version("tasks.core.data", "tasks.preprocess")


# Cached: the key is the inputs, including the data's fingerprint (so a rewritten file at the same
# URI recomputes), plus the hash of the code above.
@task(
    container_image=CPU_IMAGE,
    **guaranteed(PREPROCESS_CPU),
    cache=True,
    cache_version=PREPROCESS_CODE_VERSION,
    **DECKS,
)
def preprocess(
    dataset: str,
    label_column: str,
    val_fraction: float,
    test_fraction: float,
    seed: int,
    dataset_fingerprint: str = "",
) -> PreparedData:
    setup_logging()
    scratch = Path(current_context().working_directory)
    uri = resolve_dataset(dataset, label_column, scratch)
    split = SplitConfig(val_fraction=val_fraction, test_fraction=test_fraction, seed=seed)
    out_dir = scratch / "prepared"
    prepared = prepare_dataset(uri, label_column, str(out_dir), split)
    table = replace(prepared.table, source=dataset or EMBEDDED_SOURCE)
    log.info(
        "prepared %s: %s rows, %d features, %d classes",
        table.source,
        table.rows,
        len(table.feature_names),
        len(table.class_labels),
    )
    for note in table.notes:  # also in the report; logged here as the run goes
        log.warning("%s", note)
    dataset_profile_deck(table)
    splits = {name: parquet_dataset(str(Path(path).parent)) for name, path in prepared.paths.items()}
    return PreparedData(**splits, table=table, fingerprint=dataset_fingerprint)
