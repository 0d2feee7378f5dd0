"""Model bundles: the model a run hands over, and the loader that scores raw rows with it.

A bundle is a folder, self-contained and free of pickled code:

    bundle.json   the manifest: format version, framework, the model's builder and options, the
                  input's raw feature columns and the fitted encoding that turns them into the features,
                  the feature names in order, the scaler's statistics, the class labels as the label
                  column held them, the run (its hyperparameters among them), the billed hardware, the
                  data, the metrics, the package versions, the provenance (split, code version, data
                  hash), the sha256 of every file listed under "files", and its own (digests.py)
    model.pt      the weights as the training artifact stores them (model.npz for Keras models)
    model.onnx    the serving exports (tasks/core/serving/exports.py), listed under "files" in the manifest
    mlflow/       the MLflow model (tasks/core/serving/mlflow_model.py)
    model.int8.onnx  the optional int8 export (tasks/core/serving/int8.py), listed as "onnx_int8" where kept
    MODEL_CARD.md what the model predicts from what, and how well (tasks/core/serving/model_card.py)

`load_bundle` reads one from a local folder or any fsspec URI without Flyte, importing torch or
TensorFlow only for the framework the bundle names. Its `predict(table)` takes the raw feature values
the user's data holds, matched by column name, encodes them with the bundle's `FittedEncoding` (text,
booleans, dates and missing values as numbers) and standardises them with `data.standardise`, as the
prepared splits were: the same raw row reaches the model as the same float32 input.

Loading checks the folder against its manifest before the model is rebuilt: the manifest's own sha256
(an edited manifest is refused), the weights' sha256 (bundles written before digests existed have
none; from format 3 a missing digest is refused as an edit), the builder, options and
shape the weights record, the scaler's scales. The model is rebuilt through the builder the bundle
names, which imports and calls it: a built-in always, a user's builder only where the caller trusts it
(`load_bundle`'s `trusted_builders` or `allow_user_code`). The ONNX and SavedModel exports serve the
model without running any of the bundle's code.

Format 2 added the raw columns and the encoding. A format 1 bundle, written before encodings existed,
has neither: its features are the raw numeric columns, read as they are. Format 3 always records the
digests, the manifest's own among them; formats 1 and 2 load without them.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import posixpath
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import fsspec.implementations.local
import numpy as np
import pyarrow as pa

from tasks.core.data.api import (
    ACCEPTS,
    WHAT,
    DatasetError,
    FittedEncoding,
    PreparedTable,
    ScalerStats,
    Target,
    at_rows,
    batch_features,
    check_finite,
    check_numeric,
    check_standardised,
    filesystem_for,
    is_local,
    remote_errors,
    standardise,
    typed_labels,
    value_type,
)
from tasks.core.messages import one_line, preview, shorten
from tasks.core.models.plugins import (
    BUILTINS,
    FRAMEWORKS,
    BuilderTrust,
    ModelError,
    artifact_record,
    check_logits,
    input_spec_for,
)
from tasks.core.report.metrics import ClassificationMetrics, RegressionMetrics
from tasks.core.serving.digests import MANIFEST_DIGEST, content_digest, manifest_digest, stored_digest
from tasks.core.serving.exports import ExportDescription, export_model
from tasks.core.serving.mlflow_model import MLFLOW_FOLDER, write_mlflow_model
from tasks.core.serving.table_input import BundleError, Table, arrow_features, check_present
from tasks.core.training.records import Hardware, TrainingRun

FORMAT_VERSION = 3
MODEL_CARD = "MODEL_CARD.md"  # written by serving.model_card once the metrics are in
# 1: no raw columns nor encoding; the features are numeric columns. 2: raw columns and the encoding.
# 3: a digest of every file listed and of the manifest itself, required (`check_sealed`).
READ_VERSIONS = (1, 2, 3)
SEALED_SINCE = 3
MANIFEST = "bundle.json"
# The weights file of each framework, as its training artifact writes it.
WEIGHTS = {"pytorch": "model.pt", "tensorflow": "model.npz"}
PREDICT_BATCH_ROWS = 8192
NUMBERS = "the model was trained on it as numbers"
# Packages whose versions the manifest records, by the module they provide: a distribution's name
# differs between builds (tensorflow-cpu, tensorflow-tpu). Those not installed are left out.
RECORDED_MODULES = ("numpy", "pyarrow", "pandas", "sklearn", "flytekit")
FRAMEWORK_MODULES = {
    "pytorch": ("torch", "onnx", "onnxscript"),
    "tensorflow": ("tensorflow", "keras", "onnx", "tf2onnx"),
}


@dataclass
class BundleRecord:
    """What the pipeline knows of a run when it writes the bundle."""

    framework: str  # "pytorch" or "tensorflow"
    feature_names: list[str]  # in the order the model reads them
    scaler: ScalerStats
    class_labels: list[str]  # as the prepared data holds them: text, in code order
    label_kind: str  # what the label column held: data.typed_labels turns the text back into it
    label_column: str
    source: str  # the dataset trained on
    data_fingerprint: str
    run: TrainingRun
    billed: Hardware
    metrics: ClassificationMetrics | None = None  # the test split's, once evaluation adds them
    # The input's raw feature columns, and `FittedEncoding.to_dict()`, which turns the ones it reads into
    # `feature_names`; both empty where the features are the raw numeric columns (format 1, or a table
    # prepared before encodings existed).
    columns: list[str] = field(default_factory=list)
    encoding: dict[str, Any] = field(default_factory=dict)
    # What the model predicts: a regression answers target.mean + target.std x its one output, and its
    # test figures are `regression_metrics` (none in `metrics`).
    target: Target = field(default_factory=Target)
    regression_metrics: RegressionMetrics | None = None

    @property
    def n_outputs(self) -> int:
        return 1 if self.target.regression else len(self.class_labels)

    @classmethod
    def of(
        cls, table: PreparedTable, run: TrainingRun, billed: Hardware, data_fingerprint: str
    ) -> BundleRecord:
        """From what the prepared splits hold (`PreparedSplits.table`, `PreparedData.table`)."""
        return cls(
            framework=run.framework, feature_names=table.feature_names, scaler=table.scaler,
            class_labels=table.class_labels, label_kind=table.label_kind, label_column=table.label_column,
            source=table.source, data_fingerprint=data_fingerprint, run=run, billed=billed,
            columns=table.columns, encoding=json.loads(table.encoding) if table.encoding else {},
            target=table.target,
        )  # fmt: skip


# How `DataHash.kind` identifies the training data.
CONTENT_HASH = "content"  # the sha256 of the input's bytes: a local file or folder, read in full
METADATA_FINGERPRINT = "fingerprint"  # only `data_fingerprint`: sizes and the store's version metadata


@dataclass
class DataHash:
    """What identifies the data trained on. `data_fingerprint` (data.fingerprint) hashes each file's size
    and what its store reports of its version (an object store's ETag or generation, a file's mtime):
    no content. Where the input is local, its bytes are hashed too."""

    kind: str  # CONTENT_HASH or METADATA_FINGERPRINT
    sha256: str = ""  # of the content (`content_digest`) where kind is CONTENT_HASH, else ""


@dataclass
class SplitSettings:
    """How the rows were split into train, val and test."""

    seed: int | None  # the random split's seed; None where unknown
    rows: dict[str, int]  # by split, as split
    val_fraction: float  # of the rows, as split
    test_fraction: float
    # "": a random split (data.assignment), stratified by class or by a regression label's quantile
    # bins; a column's name: time-ordered by it; None: not recorded where the bundle was written.
    split_by: str | None = None

    @classmethod
    def of(cls, table: PreparedTable) -> SplitSettings:
        """The split as the prepared table holds it: the rows of each split, their shares, and the
        settings preprocessing split them by (`table.split`)."""
        total = sum(table.rows.values()) or 1
        shares = {name: round(table.rows.get(name, 0) / total, 6) for name in ("val", "test")}
        split = table.split
        return cls(
            split.seed if split else None,
            dict(table.rows),
            shares["val"],
            shares["test"],
            split.split_by if split else None,
        )

    def describe(self) -> str:
        rows = ", ".join(f"{name} {count:,}" for name, count in self.rows.items())
        if self.split_by is None:
            return f"method not recorded, seed {self.seed}; rows {rows}"
        if self.split_by == "":
            return f"random (stratified), seed {self.seed}; rows {rows}"
        return f"time-ordered by {self.split_by!r}; rows {rows}"  # no seed: the times decide


@dataclass
class CodeVersion:
    """The code that trained and wrote the bundle. The source hash always; the git commit where the
    code ran from a git checkout, else the version the Flyte task was registered under (which
    `make register` names after the commit). `identified_by` says which of them identifies it."""

    source_sha256: str  # the project's sources (tasks/, workflows/): names and contents
    identified_by: str  # "git commit", "registered version" or "source hash"
    commit: str = ""
    dirty: bool | None = None  # uncommitted changes in the checkout; None without one
    registered_version: str = ""

    @classmethod
    def of(
        cls, source_sha256: str, checkout: tuple[str, bool] | None, registered_version: str
    ) -> CodeVersion:
        """From the sources' hash, the git checkout's (commit, dirty) where there is one, and the
        version the task was registered under ("" in a local run)."""
        if checkout:
            return cls(source_sha256, "git commit", *checkout, registered_version=registered_version)
        if registered_version:
            return cls(source_sha256, "registered version", registered_version=registered_version)
        return cls(source_sha256, "source hash")


@dataclass
class Provenance:
    """Where the model comes from, beside what the manifest's run (`run.config`: the hyperparameters
    and seed) and data (`source`, `data_fingerprint`) already say."""

    split: SplitSettings
    code: CodeVersion
    data: DataHash


def data_hash(source: str) -> DataHash:
    """The content hash of a local input; the fingerprint alone for any other (an object store's, or
    one no longer where it was)."""
    try:
        filesystem, path = filesystem_for(source)
    except DatasetError:
        return DataHash(METADATA_FINGERPRINT)
    if not is_local(filesystem) or not Path(path).exists():
        return DataHash(METADATA_FINGERPRINT)
    return DataHash(CONTENT_HASH, content_digest(Path(path)))


@dataclass
class Manifest:
    """bundle.json: the run's record and what the bundle holds. In the file the record's fields sit at
    the top level beside the others, and the class labels are written as the label column's values."""

    record: BundleRecord
    model: dict[str, Any]  # models.artifact_record: the builder, its options, the input's shape
    files: dict[str, str]  # "weights", each export, "mlflow", "model_card" -> its path in the bundle folder
    export_notes: list[str] = field(default_factory=list)  # the exports left out, and why
    export_checks: dict[str, dict[str, Any]] = field(default_factory=dict)  # export -> its parity check
    packages: dict[str, str] = field(default_factory=dict)  # python and distributions -> versions
    created: str = ""  # when the bundle was written, ISO 8601 in UTC
    # Each of `files`' paths -> its sha256 (`content_digest`); empty in bundles written before digests.
    # The manifest's own (`manifest_sha256`) is no field: `write_manifest` adds it, `check_sealed` reads it.
    digests: dict[str, str] = field(default_factory=dict)
    provenance: Provenance | None = None  # None in bundles written before it
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        own = asdict(self)
        record, version = own.pop("record"), own.pop("format_version")
        record["class_labels"] = typed_labels(self.record.class_labels, self.record.label_kind)
        return {"format_version": version, **record, **own}


RECORD_FIELDS = tuple(f.name for f in fields(BundleRecord))


@cache
def manifest_decoder():
    """mashumaro, which flytekit uses for these records at task boundaries; built once, when needed."""
    from mashumaro.codecs.basic import BasicDecoder

    return BasicDecoder(Manifest)


def parse_manifest(data: object, where: str) -> Manifest:
    """The manifest that `data` (parsed JSON) holds; BundleError naming `where` unless this code reads it."""
    if not isinstance(data, dict):
        raise BundleError(f"{where}: not a bundle manifest (a JSON object)")
    version = data.get("format_version")
    if type(version) is not int or version not in READ_VERSIONS:
        raise BundleError(
            f"{where}: bundle format version {version!r}; this code reads formats "
            f"{', '.join(map(str, READ_VERSIONS[:-1]))} and {READ_VERSIONS[-1]}"
        )
    record = {name: data[name] for name in RECORD_FIELDS if name in data}
    if isinstance(record.get("class_labels"), list):
        record["class_labels"] = [str(label) for label in record["class_labels"]]
    rest = {name: value for name, value in data.items() if name not in RECORD_FIELDS}
    try:
        manifest = manifest_decoder().decode({**rest, "record": record})
    except (LookupError, ValueError, TypeError) as error:
        raise BundleError(
            f"{where}: not a bundle manifest this code reads: {decode_problem(error)}"
        ) from error
    check_record(manifest.record, where)
    if "weights" not in manifest.files:
        raise BundleError(f"{where}: the manifest's files name no weights")
    check_model_record(manifest, where)
    check_sealed(data, manifest, where)
    return manifest


def check_sealed(data: dict[str, Any], manifest: Manifest, where: str) -> None:
    """From format 3 on, every file listed has its digest and the manifest its own; a manifest's own
    digest, where it has one, matches its content whatever its format. Else the manifest was edited
    since it was written: reversed class labels would flip every answer, a deleted digest would let
    swapped weights load."""
    if manifest.format_version >= SEALED_SINCE:
        missing = [key for key in ("digests", MANIFEST_DIGEST) if key not in data]
        if "digests" in data:
            missing += [
                f"digests[{path!r}]" for path in manifest.files.values() if path not in manifest.digests
            ]
        if missing:
            raise BundleError(
                f"{where}: {' and '.join(missing)} missing, which format "
                f"{manifest.format_version} always records: the manifest was edited since it was written"
            )
    recorded = data.get(MANIFEST_DIGEST)
    if recorded is not None and recorded != manifest_digest(data):
        raise BundleError(
            f"{where} does not match its {MANIFEST_DIGEST} ({shorten(str(recorded), 19)}): the manifest was "
            "edited since it was written (bundle.write_manifest records a manifest's digest)"
        )


def check_model_record(manifest: Manifest, where: str) -> None:
    """The model record names a builder, and the input it was built for is the manifest's features and
    classes (a class label removed from the manifest, or a feature added, is refused here)."""
    model = manifest.model.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("builder"), str):
        raise BundleError(f"{where}: the manifest's model names no builder (model.model.builder)")
    built_for = manifest.model.get("input")
    if not isinstance(built_for, dict):
        return  # nothing recorded to check against
    record = manifest.record
    listed = {
        "n_features": ("features", record.feature_names),
        "n_classes": ("class labels", record.class_labels),
    }
    for key, (what, names) in listed.items():
        expected = record.n_outputs if key == "n_classes" else len(names)
        if built_for.get(key) != expected:
            raise BundleError(
                f"{where}: the manifest lists {len(names)} {what} ({preview(names)}), but its model was "
                f"built for {built_for.get(key)!r} (model.input.{key})"
            )


def decode_problem(error: BaseException) -> str:
    """mashumaro's error as the manifest key at fault, e.g. "run.world_size: invalid value 'x'"."""
    from mashumaro.exceptions import InvalidFieldValue, MissingField

    keys = []
    while isinstance(error, InvalidFieldValue | MissingField):
        if error.holder_class is not Manifest or error.field_name != "record":  # flat in the file
            keys.append(error.field_name)
        key = ".".join(keys)
        if isinstance(error, MissingField):
            return f"{key} is missing"
        inner = error.__cause__ or error.__context__
        if not isinstance(inner, InvalidFieldValue | MissingField):
            return f"{key}: invalid value {shorten(repr(error.field_value))}"
        error = inner
    return one_line(error)


def check_record(record: BundleRecord, where: str) -> None:
    if record.framework not in FRAMEWORKS:
        raise BundleError(f"{where}: framework {record.framework!r} is not one of {', '.join(FRAMEWORKS)}")
    n_features = len(record.feature_names)
    if not len(record.scaler.mean) == len(record.scaler.scale) == n_features:
        raise BundleError(
            f"{where}: the scaler has {len(record.scaler.mean)} means and {len(record.scaler.scale)} scales "
            f"for {n_features} features"
        )
    check_scaler(record, where)
    try:
        typed_labels(record.class_labels, record.label_kind)
    except ValueError as error:
        raise BundleError(
            f"{where}: class labels {preview(record.class_labels)} are not of kind {record.label_kind!r}: {error}"
        ) from error
    record_encoding(record, where)


def check_scaler(record: BundleRecord, where: str) -> None:
    """Finite means and positive finite scales, as preprocessing fits them (a constant column gets 1)."""
    mean = np.asarray(record.scaler.mean, dtype=np.float64)
    scale = np.asarray(record.scaler.scale, dtype=np.float64)
    for values, what, bad in (
        (mean, "mean", ~np.isfinite(mean)),
        (scale, "scale", ~(np.isfinite(scale) & (scale > 0))),
    ):
        if bad.any():
            index = int(np.flatnonzero(bad)[0])
            rule = "a finite number" if what == "mean" else "a positive finite number"
            raise BundleError(
                f"{where}: the scaler's {what} of feature {record.feature_names[index]!r} is "
                f"{values[index]:g}; a {what} must be {rule}"
            )


def record_encoding(record: BundleRecord, where: str) -> FittedEncoding | None:
    """The record's encoding, checked against its features and columns; None without one."""
    if not record.encoding:
        return None
    try:
        encoding = FittedEncoding.from_dict(record.encoding)
    except (LookupError, ValueError, TypeError) as error:
        raise BundleError(f"{where}: the feature encoding cannot be read: {one_line(error)}") from error
    if encoding.encoded_names() != record.feature_names:
        raise BundleError(
            f"{where}: the encoding gives the features {preview(encoding.encoded_names())}, "
            f"not the feature names {preview(record.feature_names)}"
        )
    unknown = [column.name for column in encoding.columns if column.name not in record.columns]
    if unknown:
        raise BundleError(
            f"{where}: the encoding reads {preview([repr(name) for name in unknown])}, "
            f"which are not among the input's columns {preview(record.columns)}"
        )
    return encoding


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


def write_manifest(directory: str, manifest: Manifest) -> None:
    """With its digest over its content as a reader parses it (`check_sealed`); written beside, then
    renamed over the manifest: a reader never sees half a file."""
    data = json.loads(json.dumps(manifest.to_json()))
    data[MANIFEST_DIGEST] = manifest_digest(data)
    with tempfile.NamedTemporaryFile("w", dir=directory, prefix=".", suffix=".json", delete=False) as file:
        try:
            json.dump(data, file, indent=2)
        except BaseException:
            os.unlink(file.name)
            raise
    os.replace(file.name, Path(directory) / MANIFEST)


def check_files(directory: str) -> Manifest:
    """The manifest of the bundle folder `directory` (a local folder or any fsspec URI), every file it
    records a digest of present and matching it."""
    filesystem, folder = filesystem_for(directory)
    manifest = read_manifest(filesystem, folder, directory)
    for relative, expected in manifest.digests.items():
        check_stored(
            filesystem, posixpath.join(folder, relative), expected, f"{directory.rstrip('/')}/{relative}"
        )
    return manifest


def check_stored(filesystem: fsspec.AbstractFileSystem, path: str, expected: str, where: str) -> None:
    """The file or folder at `path` present and of the sha256 `expected`."""
    with remote_errors(where):
        actual = stored_digest(filesystem, path)
    check_matches(expected, actual, where, PurePosixPath(path).name)


def check_digest(expected: str, path: Path, where: str) -> None:
    check_matches(expected, content_digest(path) if path.exists() else None, where, path.name)


def check_matches(expected: str, actual: str | None, where: str, name: str) -> None:
    if actual is None:
        raise BundleError(f"{where}: missing; the bundle's manifest records its sha256")
    if actual != expected:
        card = f"; after editing {MODEL_CARD}, record it with write_model_card" * (name == MODEL_CARD)
        raise BundleError(
            f"{where} does not match the bundle's manifest: its sha256 is {actual[:16]}..., the manifest "
            f"records {shorten(str(expected), 19)}; a file from another bundle, or changed since written{card}"
        )


def package_versions(framework: str) -> dict[str, str]:
    """Python's version and the installed distributions' that the bundle was written with, read from
    their metadata (nothing is imported)."""
    providers = importlib.metadata.packages_distributions()
    versions = {"python": platform.python_version()}
    for module in (*RECORDED_MODULES, *FRAMEWORK_MODULES[framework]):
        for distribution in providers.get(module, [])[:1]:
            versions[distribution] = importlib.metadata.version(distribution)
    return versions


# ---- loading ----------------------------------------------------------------------------------------


def load_bundle(
    path_or_uri: str, trusted_builders: Iterable[str] = (), allow_user_code: bool = False
) -> Bundle:
    """The bundle in a local folder or under any fsspec URI (s3://, gs://, file://, ...): the manifest
    is read and checked first; a remote bundle's weights are fetched to a temporary folder and checked
    against the manifest (their sha256, and the builder, options and shape they record).

    Rebuilding the model imports and calls the builder the bundle names. A built-in (mlp, cnn) is
    rebuilt always; a user's `package.module:builder` only when listed in `trusted_builders` or with
    `allow_user_code`: otherwise the bundle is refused, naming the builder, before anything is imported.
    """
    references = (trusted_builders,) if isinstance(trusted_builders, str) else trusted_builders
    trust = BuilderTrust(frozenset(references), allow_user_code)
    try:
        filesystem, folder = filesystem_for(path_or_uri)
    except DatasetError as error:
        raise BundleError(str(error)) from error
    manifest = read_manifest(filesystem, folder, path_or_uri)
    check_trusted(manifest.model["model"]["builder"], trust, f"{path_or_uri.rstrip('/')}/{MANIFEST}")
    weights = posixpath.join(folder, manifest.files["weights"])
    if is_local(filesystem):
        return Bundle(manifest, load_weights(manifest, weights, path_or_uri, trust))
    with tempfile.TemporaryDirectory(prefix="mixedml-bundle-") as local:
        copy = os.path.join(local, PurePosixPath(weights).name)
        try:
            with remote_errors(f"{path_or_uri.rstrip('/')}/{manifest.files['weights']}"):
                filesystem.get_file(weights, copy)
        except DatasetError as error:
            raise BundleError(str(error)) from error
        return Bundle(manifest, load_weights(manifest, copy, path_or_uri, trust))


def check_trusted(builder: str, trust: BuilderTrust, where: str) -> None:
    """BundleError naming `builder` and how to allow it, unless `trust` allows it."""
    if trust.allows(builder):
        return
    raise BundleError(
        f"{where}: the model is rebuilt by {shorten(repr(builder))}, which is not a built-in "
        f"({', '.join(BUILTINS)}); loading would import and run that code, so a bundle does not choose "
        f"it. If you trust it, pass load_bundle(..., trusted_builders=[{shorten(repr(builder))}]) or "
        "allow_user_code=True"
    )


def read_manifest(filesystem: fsspec.AbstractFileSystem, folder: str, uri: str) -> Manifest:
    where = f"{uri.rstrip('/')}/{MANIFEST}"
    try:
        with remote_errors(where):
            text = filesystem.cat_file(posixpath.join(folder, MANIFEST))
    except DatasetError as error:
        raise BundleError(f"{error}; a model bundle is a folder holding {MANIFEST}") from error
    try:
        data = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BundleError(f"{where}: not valid JSON: {one_line(error)}") from error
    return parse_manifest(data, where)


def load_weights(manifest: Manifest, path: str, uri: str, trust: BuilderTrust):
    """The model rebuilt through its builder, with the bundle's weights, in inference mode; the weights
    checked against the manifest first, and the model's logits after."""
    name = manifest.files["weights"]
    where = f"{uri.rstrip('/')}/{name}"
    if name in manifest.digests:
        check_digest(manifest.digests[name], Path(path), where)
    check_weights_record(manifest, read_weights_record(manifest.record.framework, path, where), trust, where)
    try:
        model, spec = load_model(manifest.record.framework, path)
    except Exception as error:  # torch, numpy and the user's builder each raise their own
        raise BundleError(f"{uri}: cannot load the model from {name}: {one_line(error)}") from error
    record = manifest.record
    try:
        check_logits(spec, model, len(record.feature_names), record.n_outputs, record.framework)
    except ModelError as error:
        raise BundleError(f"{where} does not fit the bundle's manifest: {error}") from error
    return model


def read_weights_record(framework: str, path: str, where: str) -> dict[str, Any]:
    """The builder, options and input a weights file records (`artifact_record`), read without
    building anything: torch maps the file rather than reading its tensors."""
    try:
        if framework == "pytorch":
            import torch

            payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        else:
            from tasks.core.models.keras_models import SPEC_KEY

            with np.load(path, allow_pickle=False) as archive:
                payload = json.loads(str(archive[SPEC_KEY]))
    except Exception as error:  # torch, numpy and json each raise their own
        raise BundleError(f"{where}: cannot read the weights file: {one_line(error)}") from error
    if not isinstance(payload, dict) or not isinstance(payload.get("model"), dict):
        raise BundleError(f"{where}: not a weights file of this code (no model record)")
    return {key: payload.get(key) for key in ("model", "input")}


def check_weights_record(manifest: Manifest, record: dict[str, Any], trust: BuilderTrust, where: str) -> None:
    """The weights' builder trusted, and their model and input the manifest's."""
    check_trusted(str(record["model"].get("builder")), trust, where)
    for key in ("model", "input"):
        if key in manifest.model and record[key] != manifest.model[key]:
            raise BundleError(
                f"{where} does not match the bundle's manifest: the weights record {key} "
                f"{shorten(json.dumps(record[key], default=str))}, the manifest "
                f"{shorten(json.dumps(manifest.model[key], default=str))} (weights from another bundle?)"
            )


def load_model(framework: str, path: str):
    """(model, spec) from a training artifact, importing only the framework it needs."""
    if framework == "pytorch":
        from tasks.core.models.torch_models import load_torch_artifact

        return load_torch_artifact(path)
    from tasks.core.models.keras_models import load_keras_artifact

    return load_keras_artifact(path)


def torch_logits(model, inputs: np.ndarray) -> np.ndarray:
    import torch

    device = next(model.parameters(), torch.empty(0)).device
    with torch.inference_mode():
        return model(torch.from_numpy(inputs).to(device)).float().cpu().numpy()


def keras_logits(model, inputs: np.ndarray) -> np.ndarray:
    # The compiled predict step, without the dataset predict() sets up on every call.
    return np.asarray(model.predict_on_batch(inputs), dtype=np.float32)


LOGITS = {"pytorch": torch_logits, "tensorflow": keras_logits}


class Bundle:
    """A loaded model bundle: raw feature rows in, class labels or probabilities out.

    A table is a pandas DataFrame, a pyarrow Table or a pyarrow RecordBatch. Its columns are matched
    by name: their order does not matter and columns the model does not read are ignored. `source`
    names the table in errors (a file), and `first_row` numbers its rows from there.

    With an encoding, the raw columns it reads may hold text, booleans, dates and missing values, each
    read as its kind (`data.column_kinds`). Without one (format 1, or a table prepared before encodings
    existed), the columns are the numeric features themselves, none missing."""

    def __init__(self, manifest: Manifest, model) -> None:
        self.manifest = manifest
        self.model = model
        self.class_labels = typed_labels(manifest.record.class_labels, manifest.record.label_kind)
        self._label_values = np.asarray(self.class_labels)
        encoding = manifest.record.encoding
        self.encoding = FittedEncoding.from_dict(encoding) if encoding else None

    @property
    def feature_names(self) -> list[str]:
        """The model's features in order: the encoded ones where the bundle has an encoding."""
        return self.manifest.record.feature_names

    @property
    def input_columns(self) -> list[str]:
        """The columns of a table that the model reads: the raw columns its encoding reads, or the
        numeric features themselves."""
        if self.encoding is None:
            return self.feature_names
        return [column.name for column in self.encoding.columns]

    @property
    def label_column(self) -> str:
        return self.manifest.record.label_column

    def check_columns(self, schema: pa.Schema, source: str = "table") -> None:
        """Every column the model reads present, of a type it reads: what can be checked before
        reading any row."""
        check_present(schema.names, self.input_columns, source, self.encoding is not None)
        self.check_types(schema, source)

    def check_types(self, schema: pa.Schema, source: str) -> None:
        if self.encoding is None:
            check_numeric(schema, self.feature_names, source, NUMBERS)
            return
        for column in self.encoding.columns:
            arrow_type = schema.field(column.name).type
            if not ACCEPTS[column.kind](value_type(arrow_type)):
                raise DatasetError(
                    f"{source}: feature column {column.name!r} has type {arrow_type}, which cannot be read "
                    f"as {column.kind}; the model was trained on it as {WHAT[column.kind]}"
                )

    def features(self, table: Table, source: str = "table", first_row: int = 0) -> np.ndarray:
        """The features before standardisation, float64 `[rows, features]` in the manifest's order:
        the encoded raw columns, or the numeric features. Checked as training checked them: a missing
        column, a type the model does not read, a value that is not of its kind (numbers: a missing or
        non-finite value)."""
        return self.encoded(self.checked(table, source, first_row), source, first_row)

    def predict_proba(self, table: Table, source: str = "table", first_row: int = 0) -> np.ndarray:
        """Class probabilities, float32 `[rows, classes]`, columns in the order of `class_labels`.

        A row whose logits are not all finite (the model overflowed on it) has NaN in every column:
        it has no answer. `finite_rows` tells the rows that have one."""
        self.refuse_regression("predict_proba")
        columns = self.checked(table, source, first_row)
        # Row blocks that stay in the CPU's cache: converting a whole large table at once is slower.
        blocks = [
            self.probabilities(columns.slice(start, PREDICT_BATCH_ROWS), source, first_row + start)
            for start in range(0, columns.num_rows, PREDICT_BATCH_ROWS)
        ]
        return np.concatenate(blocks) if blocks else np.zeros((0, len(self.class_labels)), np.float32)

    def predict_codes(self, table: Table, source: str = "table", first_row: int = 0) -> np.ndarray:
        """Class codes, int64: indices into `class_labels`. BundleError naming the rows whose outputs
        are not finite: no class is an answer for them (`predict_proba` gives them NaN)."""
        self.refuse_regression("predict_codes")
        probabilities = self.predict_proba(table, source, first_row)
        check_answered(probabilities, source, first_row)
        return probabilities.argmax(axis=1).astype(np.int64)

    def predict(self, table: Table, source: str = "table", first_row: int = 0) -> np.ndarray:
        """Class labels as the label column held them: text stays text, numbers stay numbers.
        BundleError naming the rows whose outputs are not finite, as `predict_codes`. A regression's
        `predict_numbers`, in the label's type: int64 for an integer label."""
        if self.target.regression:
            numbers = self.predict_numbers(table, source, first_row)
            check_answered(numbers[:, None], source, first_row)
            return numbers.astype(np.int64) if self.rounds else numbers
        return self.labels(self.predict_codes(table, source, first_row))

    @property
    def target(self) -> Target:
        return self.manifest.record.target

    def predict_numbers(self, table: Table, source: str = "table", first_row: int = 0) -> np.ndarray:
        """A regression's predictions, float64 in the label's units: for an integer label, rounded to
        whole numbers (half to even), as the exports answer and as every metric of them is computed;
        NaN where the model's output is not finite."""
        columns = self.checked(table, source, first_row)
        blocks = [
            self.numbers(columns.slice(start, PREDICT_BATCH_ROWS), source, first_row + start)
            for start in range(0, columns.num_rows, PREDICT_BATCH_ROWS)
        ]
        return np.concatenate(blocks) if blocks else np.zeros(0)

    def numbers(self, columns: pa.Table | pa.RecordBatch, source: str, first_row: int) -> np.ndarray:
        outputs = self.logits(self.model_inputs(columns, source, first_row))[:, 0]
        with np.errstate(invalid="ignore", over="ignore"):
            numbers = self.target.in_label_units(outputs)
        return np.round(numbers) if self.rounds else numbers

    @property
    def rounds(self) -> bool:
        """Whether the answers are rounded to whole numbers: a regression of a label of integers."""
        return self.target.regression and self.manifest.record.label_kind == "integer"

    def refuse_regression(self, method: str) -> None:
        if self.target.regression:
            raise BundleError(
                f"{method}: this bundle predicts a number (a regression of "
                f"{self.label_column!r}), not classes: it has no class probabilities; use predict"
            )

    def labels(self, codes: np.ndarray) -> np.ndarray:
        return self._label_values[codes]

    def checked(self, table: Table, source: str, first_row: int) -> pa.Table | pa.RecordBatch:
        """The columns the model reads, of types it reads; numeric features also free of missing and
        non-finite values (an encoding checks each value as it encodes it)."""
        columns = arrow_features(table, self.input_columns, source, self.encoding is not None)
        self.check_types(columns.schema, source)
        if self.encoding is None:
            check_finite(columns, self.feature_names, first_row, source)
        return columns

    def probabilities(self, columns: pa.Table | pa.RecordBatch, source: str, first_row: int) -> np.ndarray:
        from scipy.special import softmax

        logits = self.logits(self.model_inputs(columns, source, first_row))
        finite = np.isfinite(logits).all(axis=1)
        with np.errstate(invalid="ignore", over="ignore"):
            probabilities = softmax(logits, axis=1).astype(np.float32, copy=False)
        probabilities[~finite] = np.nan  # a row with an infinite logit would otherwise get a one-hot answer
        return probabilities

    def encoded(self, columns: pa.Table | pa.RecordBatch, source: str, first_row: int) -> np.ndarray:
        """Checked columns as the features the scaler reads, float64."""
        if self.encoding is None:
            return batch_features(columns, self.feature_names, np.float64)
        return self.encoding.transform(columns, first_row, source)

    def model_inputs(self, columns: pa.Table | pa.RecordBatch, source: str, first_row: int) -> np.ndarray:
        """Checked columns as the model reads them: encoded, standardised, float32."""
        raw = self.encoded(columns, source, first_row)
        scaled = standardise(raw, self.manifest.record.scaler)
        check_standardised(scaled, raw, self.feature_names, first_row, source)  # as training's rows were
        return scaled

    def logits(self, inputs: np.ndarray) -> np.ndarray:
        """The model's forward pass alone, on its own device."""
        return LOGITS[self.manifest.record.framework](self.model, inputs)


def finite_rows(probabilities: np.ndarray) -> np.ndarray:
    """Per row of `predict_proba`'s output, whether it is an answer: every probability finite."""
    return np.isfinite(probabilities).all(axis=1)


def check_answered(probabilities: np.ndarray, source: str, first_row: int) -> None:
    unanswered = np.flatnonzero(~finite_rows(probabilities))
    if len(unanswered):
        rows = "a row" if len(unanswered) == 1 else f"{len(unanswered):,} rows"
        raise BundleError(
            f"{source}: the model's outputs are not finite (NaN or infinite logits) for {rows}, "
            f"{at_rows(first_row + unanswered)}; no class is an answer for them. predict_proba gives "
            "them NaN probabilities, and finite_rows tells the rows that have an answer"
        )
