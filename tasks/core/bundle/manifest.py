"""A model bundle's manifest: its record types, parsed and checked, read and written.

A bundle is a folder, self-contained and free of pickled code:

    bundle.json   the manifest: format version, framework, the model's builder and options, the
                  input's raw feature columns and the fitted encoding that turns them into the features,
                  the feature names in order, the scaler's statistics, the class labels as the label
                  column held them, the run (its hyperparameters among them), the billed hardware, the
                  data, the metrics, the package versions, the provenance (split, code version, data
                  hash), the sha256 of every file listed under "files", and its own (digests.py)
    model.pt      the weights as the training artifact stores them (model.npz for Keras models)
    model.onnx    the serving exports (tasks/core/bundle/exports.py), listed under "files" in the manifest
    mlflow/       the MLflow model (tasks/core/bundle/mlflow_model.py)
    model.int8.onnx  the optional int8 export (tasks/core/bundle/int8.py), listed as "onnx_int8" where kept
    MODEL_CARD.md what the model predicts from what, and how well (tasks/core/bundle/model_card.py)

Format 2 added the raw columns and the encoding; format 3 always records the digests, the manifest's
own among them. Older manifests are upgraded as they are read (upgrade.py), so that the rest of the
code reads one shape; only the digest checks ask which format a manifest was written as.
"""

from __future__ import annotations

import json
import os
import posixpath
import tempfile
from dataclasses import asdict, dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

import fsspec.implementations.local
import numpy as np

from tasks.core.bundle.digests import MANIFEST_DIGEST, content_digest, manifest_digest
from tasks.core.bundle.metric_records import ClassificationMetrics, RegressionMetrics
from tasks.core.bundle.table_input import BundleError
from tasks.core.bundle.upgrade import upgrade_manifest
from tasks.core.data.api import (
    DatasetError,
    FittedEncoding,
    PreparedTable,
    ScalerStats,
    Target,
    filesystem_for,
    is_local,
    numbers_as_read,
    remote_errors,
    typed_labels,
)
from tasks.core.messages import one_line, preview, shorten
from tasks.core.models.plugins import FRAMEWORKS
from tasks.core.training.records import Hardware, TrainingRun

FORMAT_VERSION = 3
MODEL_CARD = "MODEL_CARD.md"  # written by bundle.model_card once the metrics are in
# 3: a digest of every file listed and of the manifest itself, required (`check_sealed`).
READ_VERSIONS = (1, 2, 3)
SEALED_SINCE = 3
MANIFEST = "bundle.json"
# The weights file of each framework, as its training artifact writes it.
WEIGHTS = {"pytorch": "model.pt", "tensorflow": "model.npz"}
PREDICT_BATCH_ROWS = 8192
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
    # `feature_names`. A record without them (format 1) is upgraded as it is built (`numbers_as_read`).
    columns: list[str] = field(default_factory=list)
    encoding: dict[str, Any] = field(default_factory=dict)
    # What the model predicts: a regression answers target.mean + target.std x its one output, and its
    # test figures are `regression_metrics` (none in `metrics`).
    target: Target = field(default_factory=Target)
    regression_metrics: RegressionMetrics | None = None

    def __post_init__(self) -> None:
        if not self.columns and not self.encoding:
            self.columns = list(self.feature_names)
            self.encoding = numbers_as_read(self.feature_names, self.scaler.mean).to_dict()

    @property
    def n_outputs(self) -> int:
        return 1 if self.target.regression else len(self.class_labels)

    @classmethod
    def of(
        cls, table: PreparedTable, run: TrainingRun, billed: Hardware, data_fingerprint: str
    ) -> BundleRecord:
        """From what the prepared splits hold (`PreparedSplits.table`, `PreparedData.table`). A run
        that diverged (`on_divergence: stop`) has no model to bundle."""
        if run.diverged:
            raise ValueError(f"the run has no model to bundle: {run.diverged}")
        return cls(
            framework=run.framework, feature_names=table.feature_names, scaler=table.scaler,
            class_labels=table.class_labels, label_kind=table.label_kind, label_column=table.label_column,
            source=table.source, data_fingerprint=data_fingerprint, run=run, billed=billed,
            columns=table.columns, encoding=json.loads(table.encoding),
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
    upgraded = upgrade_manifest(data)
    record = {name: upgraded[name] for name in RECORD_FIELDS if name in upgraded}
    if isinstance(record.get("class_labels"), list):
        record["class_labels"] = [str(label) for label in record["class_labels"]]
    rest = {name: value for name, value in upgraded.items() if name not in RECORD_FIELDS}
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


def record_encoding(record: BundleRecord, where: str) -> FittedEncoding:
    """The record's encoding, checked against its features and columns."""
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
