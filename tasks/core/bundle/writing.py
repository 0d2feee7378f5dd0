"""Writing a model bundle: the weights, the serving exports and the manifest last; the evaluation's
metrics added to it later."""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasks.core.bundle.digests import content_digest
from tasks.core.bundle.export_plan import ExportDescription
from tasks.core.bundle.exports import export_model
from tasks.core.bundle.loading import load_model
from tasks.core.bundle.manifest import (
    FORMAT_VERSION,
    FRAMEWORK_MODULES,
    RECORDED_MODULES,
    WEIGHTS,
    BundleRecord,
    Manifest,
    Provenance,
    check_record,
    read_manifest,
    record_encoding,
    write_manifest,
)
from tasks.core.bundle.metric_records import ClassificationMetrics, RegressionMetrics
from tasks.core.bundle.mlflow_model import MLFLOW_FOLDER, write_mlflow_model
from tasks.core.data.api import filesystem_for
from tasks.core.models.plugins import artifact_record, check_logits, input_spec_for

# ---- writing ----------------------------------------------------------------------------------------


def write_bundle(
    directory: str, artifact: str, record: BundleRecord, provenance: Provenance | None = None
) -> str:
    """Write the bundle folder `directory`: the weights copied from the training artifact, the serving
    exports, and the manifest last, with `provenance` where given. The record is checked against the
    weights by a forward pass. Returns `directory`."""
    check_record(record, directory)
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    weights = WEIGHTS[record.framework]
    shutil.copyfile(artifact, folder / weights)
    model, spec = load_model(record.framework, str(folder / weights))
    n_features, n_classes = len(record.feature_names), record.n_outputs
    check_logits(spec, model, n_features, n_classes, record.framework)
    files, notes, checks = serving_exports(model, record, directory, {"weights": weights})
    manifest = Manifest(
        record=record,
        model=artifact_record(spec, input_spec_for(spec, n_features, n_classes)),
        files=files,
        export_notes=notes,
        export_checks=checks,
        packages=package_versions(record.framework),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        digests={path: content_digest(folder / path) for path in files.values()},
        provenance=provenance,
    )
    write_manifest(directory, manifest)
    return directory


def serving_exports(
    model, record: BundleRecord, directory: str, files: dict[str, str]
) -> tuple[dict[str, str], list[str], dict[str, dict[str, Any]]]:
    """The ONNX, SavedModel and MLflow exports beside `files`, the notes on those left out, and their
    parity checks. A regression's ONNX file and MLflow model answer a "prediction"."""
    target = record.target
    description = ExportDescription(
        feature_names=record.feature_names,
        label_column=record.label_column,
        class_labels=record.class_labels,
        format_version=FORMAT_VERSION,
        problem_type=target.problem_type,
        target_mean=target.mean,
        target_std=target.std,
        whole_numbers=target.regression and record.label_kind == "integer",
    )
    encoding = record_encoding(record, directory)
    exported = export_model(
        model, record.framework, record.scaler, directory, encoding, description=description
    )
    files = {**files, **exported.files}
    mlflow_note = write_mlflow_model(
        directory,
        str(Path(directory) / MLFLOW_FOLDER),
        Manifest(record=record, model={}, files=files).to_json(),
    )
    if mlflow_note is None:
        files["mlflow"] = MLFLOW_FOLDER
    return files, [*exported.notes, *([mlflow_note] if mlflow_note else [])], exported.checks


def add_metrics(directory: str, metrics: ClassificationMetrics | RegressionMetrics) -> None:
    """Record the evaluation's metrics in the manifest of the local bundle folder `directory`."""
    filesystem, path = filesystem_for(directory)
    manifest = read_manifest(filesystem, path, directory)
    scored = {"regression_metrics" if isinstance(metrics, RegressionMetrics) else "metrics": metrics}
    write_manifest(directory, replace(manifest, record=replace(manifest.record, **scored)))


def package_versions(framework: str) -> dict[str, str]:
    """Python's version and the installed distributions' that the bundle was written with, read from
    their metadata (nothing is imported)."""
    providers = importlib.metadata.packages_distributions()
    versions = {"python": platform.python_version()}
    for module in (*RECORDED_MODULES, *FRAMEWORK_MODULES[framework]):
        for distribution in providers.get(module, [])[:1]:
            versions[distribution] = importlib.metadata.version(distribution)
    return versions
