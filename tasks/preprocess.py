"""Preprocessing on CPU: validate the input table, split it, standardise it."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from pathlib import Path

from flytekit import current_context, task

import tasks.literal_types  # noqa: F401 - each boundary dataclass's Flyte type built once, before the tasks below
from tasks.core.data import (
    EMBEDDED_DIGITS_LABEL,
    DatasetError,
    SplitConfig,
    prepare_dataset,
    write_embedded_digits,
)
from tasks.decks import DECKS, dataset_profile_deck
from tasks.hardware import CPU_IMAGE, PREPROCESS_CPU, guaranteed
from tasks.logs import setup_logging
from tasks.storage import parquet_dataset
from tasks.types import PreparedData

log = logging.getLogger(__name__)


def resolve_dataset(dataset: str, label_column: str, scratch: Path) -> str:
    """The user's URI, or the embedded digits dataset when none was given."""
    if dataset:
        return dataset
    if label_column != EMBEDDED_DIGITS_LABEL:
        raise DatasetError(
            f"the embedded digits dataset has label column '{EMBEDDED_DIGITS_LABEL}', not '{label_column}'; "
            "pass --dataset to use your own data"
        )
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
    log.info(
        "prepared %s: %s rows, %d features, %d classes",
        dataset or "embedded digits",
        prepared.rows,
        len(prepared.feature_names),
        len(prepared.class_labels),
    )
    for note in prepared.notes:  # also in the report; logged here as the run goes
        log.warning("%s", note)
    dataset_profile_deck(prepared, dataset or "embedded digits")
    splits = {name: parquet_dataset(str(Path(path).parent)) for name, path in prepared.paths.items()}
    return PreparedData(
        **splits,
        feature_names=prepared.feature_names,
        label_column=prepared.label_column,
        class_labels=prepared.class_labels,
        class_counts=prepared.class_counts,
        rows=prepared.rows,
        scaler=prepared.scaler,
        source=dataset or "embedded:sklearn-digits",
        notes=prepared.notes,
        label_kind=prepared.label_kind,
        fingerprint=dataset_fingerprint,
    )
