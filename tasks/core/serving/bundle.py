"""Model bundles: the model a run hands over, and the loader that scores raw rows with it.

A bundle is a folder, self-contained and free of pickled code:

    bundle.json   the manifest: format version, framework, the model's builder and options, the
                  input's raw feature columns and the fitted encoding that turns them into the features,
                  the feature names in order, the scaler's statistics, the class labels as the label
                  column held them, the run, the billed hardware, the data, the metrics, the package
                  versions
    model.pt      the weights as the training artifact stores them (model.npz for Keras models)
    model.onnx    the serving exports (tasks/core/serving/exports.py), listed under "files" in the manifest

`load_bundle` reads one from a local folder or any fsspec URI without Flyte, importing torch or
TensorFlow only for the framework the bundle names. Its `predict(table)` takes the raw feature values
the user's data holds, matched by column name, encodes them with the bundle's `FittedEncoding` (text,
booleans, dates and missing values as numbers) and standardises them with `data.standardise`, as the
prepared splits were: the same raw row reaches the model as the same float32 input.

Format 2 added the raw columns and the encoding. A format 1 bundle, written before encodings existed,
has neither: its features are the raw numeric columns, read as they are.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import posixpath
import shutil
import tempfile
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import fsspec.implementations.local
import numpy as np
import pyarrow as pa

from tasks.core.data.column_kinds import ACCEPTS, WHAT, value_type
from tasks.core.data.columns import check_finite, check_numeric
from tasks.core.data.encoding import FittedEncoding
from tasks.core.data.files import DatasetError, filesystem_for, is_local, remote_errors
from tasks.core.data.labels import typed_labels
from tasks.core.data.prepare import PreparedTable
from tasks.core.data.scaling import ScalerStats, batch_features, check_standardised, standardise
from tasks.core.messages import one_line, preview, shorten
from tasks.core.models.plugins import FRAMEWORKS, artifact_record, check_logits, input_spec_for
from tasks.core.report.metrics import ClassificationMetrics
from tasks.core.serving.exports import export_model
from tasks.core.training.records import Hardware, TrainingRun

FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)  # 1: no raw columns nor encoding; the features are numeric columns
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

Table = Any  # a pandas DataFrame, a pyarrow Table or a pyarrow RecordBatch


class BundleError(ValueError):
    """A model bundle that cannot be written or read, or a table without the features it needs; the
    message names the bundle or the table and what is wrong."""


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
        )  # fmt: skip


@dataclass
class Manifest:
    """bundle.json: the run's record and what the bundle holds. In the file the record's fields sit at
    the top level beside the others, and the class labels are written as the label column's values."""

    record: BundleRecord
    model: dict[str, Any]  # models.artifact_record: the builder, its options, the input's shape
    files: dict[str, str]  # "weights" and each export -> its path in the bundle folder
    export_notes: list[str] = field(default_factory=list)  # the exports left out, and why
    packages: dict[str, str] = field(default_factory=dict)  # python and distributions -> versions
    created: str = ""  # when the bundle was written, ISO 8601 in UTC
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        record = asdict(self.record)
        record["class_labels"] = typed_labels(self.record.class_labels, self.record.label_kind)
        own = {
            f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("record", "format_version")
        }
        return {"format_version": self.format_version, **record, **own}


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
            f"{' and '.join(map(str, READ_VERSIONS))}"
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
    return manifest


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
    try:
        typed_labels(record.class_labels, record.label_kind)
    except ValueError as error:
        raise BundleError(
            f"{where}: class labels {preview(record.class_labels)} are not of kind {record.label_kind!r}: {error}"
        ) from error
    record_encoding(record, where)


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


def write_bundle(directory: str, artifact: str, record: BundleRecord) -> str:
    """Write the bundle folder `directory`: the weights copied from the training artifact, the serving
    exports, and the manifest last. The record is checked against the weights by a forward pass.
    Returns `directory`."""
    check_record(record, directory)
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    weights = WEIGHTS[record.framework]
    shutil.copyfile(artifact, folder / weights)
    model, spec = load_model(record.framework, str(folder / weights))
    n_features, n_classes = len(record.feature_names), len(record.class_labels)
    check_logits(spec, model, n_features, n_classes, record.framework)
    encoding = record_encoding(record, directory)
    exported = export_model(model, record.framework, record.scaler, directory, encoding)
    manifest = Manifest(
        record=record,
        model=artifact_record(spec, input_spec_for(spec, n_features, n_classes)),
        files={"weights": weights, **exported.files},
        export_notes=exported.notes,
        packages=package_versions(record.framework),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    write_manifest(directory, manifest)
    return directory


def add_metrics(directory: str, metrics: ClassificationMetrics) -> None:
    """Record the evaluation's metrics in the manifest of the local bundle folder `directory`."""
    filesystem, path = filesystem_for(directory)
    manifest = read_manifest(filesystem, path, directory)
    write_manifest(directory, replace(manifest, record=replace(manifest.record, metrics=metrics)))


def write_manifest(directory: str, manifest: Manifest) -> None:
    """Written beside, then renamed over the manifest: a reader never sees half a file."""
    with tempfile.NamedTemporaryFile("w", dir=directory, prefix=".", suffix=".json", delete=False) as file:
        try:
            json.dump(manifest.to_json(), file, indent=2)
        except BaseException:
            os.unlink(file.name)
            raise
    os.replace(file.name, Path(directory) / MANIFEST)


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


def load_bundle(path_or_uri: str) -> Bundle:
    """The bundle in a local folder or under any fsspec URI (s3://, gs://, file://, ...): the manifest
    is read and checked first; a remote bundle's weights are fetched to a temporary folder."""
    try:
        filesystem, folder = filesystem_for(path_or_uri)
    except DatasetError as error:
        raise BundleError(str(error)) from error
    manifest = read_manifest(filesystem, folder, path_or_uri)
    weights = posixpath.join(folder, manifest.files["weights"])
    if is_local(filesystem):
        return Bundle(manifest, load_weights(manifest, weights, path_or_uri))
    with tempfile.TemporaryDirectory(prefix="mixedml-bundle-") as local:
        copy = os.path.join(local, PurePosixPath(weights).name)
        try:
            with remote_errors(f"{path_or_uri.rstrip('/')}/{manifest.files['weights']}"):
                filesystem.get_file(weights, copy)
        except DatasetError as error:
            raise BundleError(str(error)) from error
        return Bundle(manifest, load_weights(manifest, copy, path_or_uri))


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


def load_weights(manifest: Manifest, path: str, uri: str):
    """The model rebuilt through its builder, with the bundle's weights, in inference mode."""
    try:
        model, _ = load_model(manifest.record.framework, path)
    except Exception as error:  # torch, numpy and the user's builder each raise their own
        name = manifest.files["weights"]
        raise BundleError(f"{uri}: cannot load the model from {name}: {one_line(error)}") from error
    return model


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
        """Class probabilities, float32 `[rows, classes]`, columns in the order of `class_labels`."""
        columns = self.checked(table, source, first_row)
        # Row blocks that stay in the CPU's cache: converting a whole large table at once is slower.
        blocks = [
            self.probabilities(columns.slice(start, PREDICT_BATCH_ROWS), source, first_row + start)
            for start in range(0, columns.num_rows, PREDICT_BATCH_ROWS)
        ]
        return np.concatenate(blocks) if blocks else np.zeros((0, len(self.class_labels)), np.float32)

    def predict_codes(self, table: Table, source: str = "table", first_row: int = 0) -> np.ndarray:
        """Class codes, int64: indices into `class_labels`."""
        return self.predict_proba(table, source, first_row).argmax(axis=1).astype(np.int64)

    def predict(self, table: Table, source: str = "table", first_row: int = 0) -> np.ndarray:
        """Class labels as the label column held them: text stays text, numbers stay numbers."""
        return self.labels(self.predict_codes(table, source, first_row))

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
        return softmax(logits, axis=1).astype(np.float32, copy=False)

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


def arrow_features(
    table: Table, columns: list[str], source: str, encoded: bool = False
) -> pa.Table | pa.RecordBatch:
    """The `columns` of `table`, as arrow; a missing one refused by name. `encoded`: the columns are
    raw columns that an encoding reads, not numeric features."""
    if isinstance(table, pa.Table | pa.RecordBatch):
        check_present(table.schema.names, columns, source, encoded)
        return table.select(columns)
    import pandas as pd

    if not isinstance(table, pd.DataFrame):
        raise TypeError(
            f"{source}: cannot score a {type(table).__name__}; "
            "pass a pandas DataFrame, a pyarrow Table or a pyarrow RecordBatch"
        )
    check_present(list(table.columns), columns, source, encoded)
    try:
        return pa.Table.from_pandas(table, columns=columns, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:  # e.g. numbers and text in one column
        what = "mixes types Arrow cannot hold in one column" if encoded else "is not numbers"
        raise DatasetError(f"{source}: a feature column {what}: {one_line(error)}") from error


def check_present(present: list[str], wanted: list[str], source: str, encoded: bool = False) -> None:
    missing = [name for name in wanted if name not in present]
    if missing:
        what = "column" if len(missing) == 1 else f"{len(missing)} columns"
        reads = "columns" if encoded else "features"
        raise BundleError(
            f"{source}: missing feature {what} {preview([repr(name) for name in missing])}; the model "
            f"reads {len(wanted)} {reads} by name: {preview(wanted)}"
        )
