"""Loading a model bundle, and the loaded bundle that scores raw rows with it.

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
"""

from __future__ import annotations

import json
import os
import posixpath
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import fsspec.implementations.local
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from tasks.core.bundle.digests import content_digest, stored_digest
from tasks.core.bundle.manifest import (
    MANIFEST,
    MODEL_CARD,
    PREDICT_BATCH_ROWS,
    Manifest,
    read_manifest,
)
from tasks.core.bundle.table_input import BundleError, Table, arrow_features, check_present
from tasks.core.data.api import (
    ACCEPTS,
    WHAT,
    DatasetError,
    FittedEncoding,
    Target,
    at_rows,
    check_standardised,
    filesystem_for,
    is_local,
    iter_batches,
    remote_errors,
    standardise,
    typed_labels,
    value_type,
)
from tasks.core.messages import one_line, shorten
from tasks.core.models.plugins import BUILTINS, BuilderTrust, ModelError, check_logits


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

    The raw columns its encoding reads may hold text, booleans, dates and missing values, each read as
    its kind (`data.column_kinds`)."""

    def __init__(self, manifest: Manifest, model) -> None:
        self.manifest = manifest
        self.model = model
        self.class_labels = typed_labels(manifest.record.class_labels, manifest.record.label_kind)
        self._label_values = np.asarray(self.class_labels)
        self.encoding = FittedEncoding.from_dict(manifest.record.encoding)

    @property
    def feature_names(self) -> list[str]:
        """The model's features in order, as its encoding gives them."""
        return self.manifest.record.feature_names

    @property
    def input_columns(self) -> list[str]:
        """The columns of a table that the model reads: the raw columns its encoding reads."""
        return [column.name for column in self.encoding.columns]

    @property
    def label_column(self) -> str:
        return self.manifest.record.label_column

    def check_columns(self, schema: pa.Schema, source: str = "table") -> None:
        """Every column the model reads present, of a type it reads: what can be checked before
        reading any row."""
        check_present(schema.names, self.input_columns, source, encoded=True)
        self.check_types(schema, source)

    def check_types(self, schema: pa.Schema, source: str) -> None:
        for column in self.encoding.columns:
            arrow_type = schema.field(column.name).type
            if not ACCEPTS[column.kind](value_type(arrow_type)):
                raise DatasetError(
                    f"{source}: feature column {column.name!r} has type {arrow_type}, which cannot be read "
                    f"as {column.kind}; the model was trained on it as {WHAT[column.kind]}"
                )

    def features(self, table: Table, source: str = "table", first_row: int = 0) -> np.ndarray:
        """The features before standardisation, float64 `[rows, features]` in the manifest's order:
        the encoded raw columns. Checked as training checked them: a missing
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
        """The columns the model reads, of types it reads (the encoding checks each value as it encodes it)."""
        columns = arrow_features(table, self.input_columns, source, encoded=True)
        self.check_types(columns.schema, source)
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


def scored_batches(
    bundle: Bundle, dataset: ds.Dataset, source: str, first_row: int = 0
) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """Each record batch of `dataset` in file order, with its class probabilities."""
    rows = first_row
    for batch in iter_batches(dataset, source):
        yield batch, bundle.predict_proba(batch, source, rows)
        rows += batch.num_rows


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
