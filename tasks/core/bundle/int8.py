"""An optional int8 ONNX export: `model.onnx` with its dense layers in int8, kept only where it pays.

`add_int8_export` runs on a written bundle once the test split's metrics exist, and only where the run
asked for it (`enabled`). It quantizes the bundle's `model.onnx` statically (int8_quantize.py): the
weights of MatMul and Gemm nodes int8, their input activations uint8 with scales fixed from a seeded
sample of the train split, so a row's answer depends on that row alone, never on the rows that share
its batch (dynamic quantization's one scale per batch let one large or non-finite value change every
other row's answer). The raw-row preprocessing in front of the model stays float.

The file is then held to the float one, both run by onnxruntime on CPU with the same session settings
(one thread, as export_parity.py's check runs them):

- the test accuracy, from the argmax of each file's "probabilities" against the split's class codes (a
  row without finite probabilities counts as wrong); int8's may be at most `tolerance` below fp32's;
- a row's answer, whatever shares its batch: BATCH_ROWS test rows scored one at a time, then in one
  batch beside an extreme row (every number input EXTREME_FACTOR times the largest magnitude among
  them) and a non-finite one (inf in every number input). No row may change class or lose its answer,
  nor any probability move more than PROBABILITY_SHIFT: labels are compared exactly, probabilities
  within that tolerance, as CPU kernels may round differently for another batch shape;
- rows per second on a batch of TIMING_ROWS rows (the test rows, repeated where fewer), the best of
  TIMING_ROUNDS rounds of each, taken in turn; int8 must be faster.

`model.int8.onnx` is kept only where all three hold; otherwise it is deleted and the manifest's
export_notes say why. Either way the manifest records the figures under export_checks["onnx_int8"]; a
kept file is listed in `files` as "onnx_int8", with its sha256 in `digests`, so `load_bundle` and
`check_files` verify it as they verify the other exports. It takes the same inputs and gives the same
outputs as `model.onnx`, and carries its metadata.

Imports onnx and onnxruntime only inside the functions that use them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from tasks.core.bundle.digests import content_digest
from tasks.core.bundle.export_plan import INPUT, onnx_session, summary
from tasks.core.bundle.int8_quantize import CALIBRATION_ROWS, CALIBRATION_SEED, calibration_rows, quantize
from tasks.core.bundle.manifest import Manifest, read_manifest, write_manifest
from tasks.core.bundle.raw_inputs import onnx_input_names, raw_feeds
from tasks.core.data.api import NUMERIC, FittedEncoding, batch_features, filesystem_for, parquet_format

EXPORT = "onnx_int8"  # its name in the manifest's files and export_checks
INT8_FILE = "model.int8.onnx"
TOLERANCE = 0.005  # test accuracy int8 may lose against fp32, absolute
METRIC = "accuracy"
BATCH_ROWS = 500  # ordinary rows whose answers are scored alone and beside the odd rows
EXTREME_FACTOR = 1e6  # the extreme row's numbers: this many times the ordinary rows' largest magnitude
PROBABILITY_SHIFT = 1e-4  # how far an ordinary row's probabilities may move with its batch, absolute
TIMING_ROWS = 1024
TIMING_ROUNDS = 5
CALLS_PER_ROUND = 20  # runs of the batch per round: one run of a small MLP is too short to time alone
SCORING_ROWS = 65_536  # rows scored at once
THREADS = 1  # onnx_session's

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchFigures:
    """The int8 file's answers for ordinary rows alone against the same rows beside odd ones."""

    rows: int  # ordinary rows
    changed: int  # those whose class changed or whose probabilities stopped being finite
    shift: float  # the largest move of any other row's probability


@dataclass(frozen=True)
class Int8Figures:
    """The int8 file against the float one on the same rows."""

    fp32_accuracy: float
    int8_accuracy: float
    fp32_rows_per_second: float
    int8_rows_per_second: float
    rows: int  # test rows scored
    agreement: float  # the share of them where both files predict the same class
    batch: BatchFigures


@dataclass(frozen=True)
class Int8Outcome:
    """What `add_int8_export` did: whether `model.int8.onnx` is in the bundle, and why (or why not);
    `check`: what the manifest records under export_checks["onnx_int8"], None where it was not changed."""

    kept: bool
    why: str
    check: dict[str, Any] | None = None


def add_int8_export(
    folder: str,
    test_rows: str | pa.Table,
    label_column: str,
    *,
    train_rows: str | pa.Table | None = None,
    enabled: bool = False,
    tolerance: float = TOLERANCE,
) -> Int8Outcome:
    """Quantize the ONNX export of the local bundle folder `folder` to int8, calibrated on `train_rows`
    (the prepared train split: a parquet file or folder, or a table), and keep it where its accuracy on
    `test_rows` (a parquet file or folder, or a table, holding the raw feature columns and the class
    codes in `label_column`, as the prepared test split does) is within `tolerance` of the float
    file's, its answers do not depend on the batch, and it scores faster on CPU; record the figures in
    the manifest either way. Without `enabled`, or without an ONNX export or onnxruntime, the bundle is
    left as it is."""
    if not enabled:
        return Int8Outcome(False, "not requested")
    manifest = read_manifest(*filesystem_for(folder), folder)
    if "onnx" not in manifest.files:
        return Int8Outcome(False, "the bundle has no ONNX export to quantize")
    try:
        import onnxruntime
    except ImportError:
        return Int8Outcome(False, "onnxruntime is not installed")
    source, target = Path(folder) / manifest.files["onnx"], Path(folder) / INT8_FILE
    check = {"metric": METRIC, "tolerance": tolerance, "onnxruntime": onnxruntime.__version__}
    stage = "not quantized"
    try:
        if train_rows is None:
            raise ValueError("no train rows to calibrate the activations on")
        calibration = calibration_rows(train_rows, manifest.record.feature_names)
        check["calibration"] = {
            "rows": len(calibration),
            "seed": CALIBRATION_SEED,
            "at_most": CALIBRATION_ROWS,
        }
        check["quantized_weights"] = quantize(source, target, calibration)
        stage = "not compared"
        figures = compare(source, target, manifest, test_rows, label_column)
    except Exception as error:  # the quantizer and onnxruntime raise their own
        logger.warning("%s export left out", EXPORT, exc_info=True)
        kept, why = False, f"{stage}: {summary(error)}"
    else:
        check.update(figure_record(figures))
        kept, why = decide(figures, tolerance)
    if not kept and target.exists():
        target.unlink()
    check.update(kept=kept, why=why)
    write_manifest(folder, with_outcome(manifest, check, target))
    return Int8Outcome(kept, why, check)


def decide(figures: Int8Figures, tolerance: float = TOLERANCE) -> tuple[bool, str]:
    """Whether the int8 file is kept, and why: its answers independent of the batch, its accuracy at
    most `tolerance` below fp32's, and more rows per second."""
    if figures.rows == 0:
        return False, "no test rows to compare the two files on"
    if batch_dependence := batch_verdict(figures.batch):
        return False, batch_dependence
    loss = round(figures.fp32_accuracy - figures.int8_accuracy, 12)  # 0.9 - 0.895 is 0.005 here
    accuracies = f"test accuracy {figures.int8_accuracy:.4f} against fp32's {figures.fp32_accuracy:.4f}"
    if not loss <= tolerance:
        return False, f"{accuracies}, {loss:.4f} lower: beyond the tolerance of {tolerance:g}"
    speed = f"{figures.int8_rows_per_second:,.0f} rows/s against fp32's {figures.fp32_rows_per_second:,.0f}"
    if not figures.int8_rows_per_second > figures.fp32_rows_per_second:
        return False, f"not faster on CPU: {speed}"
    return True, f"{accuracies}, within {tolerance:g}; {speed}"


def batch_verdict(batch: BatchFigures) -> str:
    """Why the answers depend on the batch; empty where they do not."""
    beside = "beside an extreme and a non-finite row"
    if batch.changed:
        return (
            f"answers depend on the batch: {batch.changed} of {batch.rows} rows change class or lose "
            f"their answer {beside}"
        )
    if not batch.shift <= PROBABILITY_SHIFT:  # NaN too
        return (
            f"answers depend on the batch: probabilities move by up to {batch.shift:.2g} {beside}, "
            f"beyond {PROBABILITY_SHIFT:g}"
        )
    return ""


def figure_record(figures: Int8Figures) -> dict[str, Any]:
    """The figures as the manifest records them; the row count alone where there were no rows."""
    if figures.rows == 0:
        return {"rows": 0}
    return {
        "fp32": figures.fp32_accuracy,
        "int8": figures.int8_accuracy,
        "rows": figures.rows,
        "agreement": figures.agreement,
        "fp32_rows_per_second": figures.fp32_rows_per_second,
        "int8_rows_per_second": figures.int8_rows_per_second,
        "speedup": figures.int8_rows_per_second / figures.fp32_rows_per_second,
        "batch": {**asdict(figures.batch), "tolerance": PROBABILITY_SHIFT, "extreme_factor": EXTREME_FACTOR},
        "timing": {
            "rows": TIMING_ROWS,
            "rounds": TIMING_ROUNDS,
            "calls": CALLS_PER_ROUND,
            "threads": THREADS,
        },
    }


def with_outcome(manifest: Manifest, check: dict[str, Any], target: Path) -> Manifest:
    """The manifest with `check` recorded, and the int8 file listed where kept, else a note; what an
    earlier call recorded replaced."""
    files = {name: path for name, path in manifest.files.items() if name != EXPORT}
    digests = {path: digest for path, digest in manifest.digests.items() if path != INT8_FILE}
    notes = [note for note in manifest.export_notes if not note.startswith(f"{EXPORT} ")]
    if check["kept"]:
        files[EXPORT] = INT8_FILE
        digests[INT8_FILE] = content_digest(target)
    else:
        notes.append(f"{EXPORT} not kept: {check['why']}")
    checks = {**manifest.export_checks, EXPORT: check}
    return replace(manifest, files=files, digests=digests, export_notes=notes, export_checks=checks)


# ---- comparing --------------------------------------------------------------------------------------------


def compare(
    fp32: Path, int8: Path, manifest: Manifest, test_rows: str | pa.Table, label_column: str
) -> Int8Figures:
    """Both files' accuracy on the test rows, the int8 file's answers for BATCH_ROWS of them alone and
    beside odd rows, and both files' rows per second on TIMING_ROWS of them."""
    sessions = onnx_session(str(fp32)), onnx_session(str(int8))
    inputs = [value.name for value in sessions[0].get_inputs()]
    columns, feeds_of = feeder(manifest, inputs)
    counts, rows, sample = np.zeros(3, np.int64), 0, None
    for batch in row_batches(test_rows, [*columns, label_column]):
        feeds = feeds_of(batch)
        truth = batch.column(label_column).to_numpy(zero_copy_only=False)
        predicted = [predicted_codes(session, feeds) for session in sessions]
        counts += [
            (predicted[0] == truth).sum(),
            (predicted[1] == truth).sum(),
            (predicted[0] == predicted[1]).sum(),
        ]
        rows += batch.num_rows
        sample = feeds if sample is None else sample
    if not rows:
        return Int8Figures(np.nan, np.nan, 0.0, 0.0, rows=0, agreement=np.nan, batch=BatchFigures(0, 0, 0.0))
    batch = batch_figures(sessions[1], tiled(sample, min(BATCH_ROWS, rows)), number_inputs(manifest, inputs))
    rates = best_rates(sessions, tiled(sample, TIMING_ROWS))
    share = counts / rows
    return Int8Figures(
        float(share[0]), float(share[1]), *rates, rows=rows, agreement=float(share[2]), batch=batch
    )


def feeder(manifest: Manifest, inputs: list[str]) -> tuple[list[str], Callable[[Any], dict[str, np.ndarray]]]:
    """The columns a file reads, and its feeds from a batch of them: "features" in the manifest's order,
    or one input per raw column."""
    record = manifest.record
    if inputs == [INPUT]:
        names = record.feature_names
        return names, lambda batch: {INPUT: batch_features(batch, names, np.float64)}
    encoding = FittedEncoding.from_dict(record.encoding)
    return [column.name for column in encoding.columns], lambda batch: raw_feeds(batch, encoding)


def number_inputs(manifest: Manifest, inputs: list[str]) -> list[str]:
    """The inputs that take numbers a row may push beyond the train range: "features", or the raw
    numeric columns (booleans and dates are numbers in the graph, but not ones a client sends huge)."""
    if inputs == [INPUT]:
        return [INPUT]
    encoding = FittedEncoding.from_dict(manifest.record.encoding)
    names = onnx_input_names(encoding)  # a column the graph's own names would clash with is renamed
    return [names[column.name] for column in encoding.columns if column.kind == NUMERIC]


def row_batches(test_rows: str | pa.Table, columns: list[str]) -> Iterator[pa.RecordBatch]:
    if isinstance(test_rows, pa.Table):
        yield from test_rows.select(columns).to_batches(SCORING_ROWS)
        return
    filesystem, path = filesystem_for(test_rows)
    dataset = ds.dataset(path, filesystem=filesystem, format=parquet_format())
    yield from dataset.to_batches(columns=columns, batch_size=SCORING_ROWS)


def predicted_codes(session, feeds: dict[str, np.ndarray]) -> np.ndarray:
    (probabilities,) = session.run(["probabilities"], feeds)
    return answers(probabilities)


def answers(probabilities: np.ndarray) -> np.ndarray:
    """The argmax of each row's probabilities; -1 where they are not all finite (no answer)."""
    finite = np.isfinite(probabilities).all(axis=1)
    return np.where(finite, probabilities.argmax(axis=1), -1)


# ---- one row's answer, whatever its batch -----------------------------------------------------------------


def batch_figures(session, feeds: dict[str, np.ndarray], numbers: list[str]) -> BatchFigures:
    """The rows of `feeds` scored one at a time, against the same rows in one batch after two odd rows
    (`odd_rows`)."""
    rows = len(next(iter(feeds.values())))
    alone = np.concatenate([probabilities_of(session, rows_of(feeds, row, row + 1)) for row in range(rows)])
    mixed = {name: np.concatenate([odd, feeds[name]]) for name, odd in odd_rows(feeds, numbers).items()}
    beside = probabilities_of(session, mixed)[-rows:]
    finite = np.isfinite(alone).all(axis=1) & np.isfinite(beside).all(axis=1)
    shift = float(np.abs(alone[finite] - beside[finite]).max(initial=0.0))
    return BatchFigures(rows, int((answers(alone) != answers(beside)).sum()), shift)


def odd_rows(feeds: dict[str, np.ndarray], numbers: list[str]) -> dict[str, np.ndarray]:
    """Two copies of the first row: in `numbers`, EXTREME_FACTOR times the largest magnitude among the
    rows, then inf."""
    odd = {name: np.repeat(values[:1], 2, axis=0) for name, values in feeds.items()}
    for name in numbers:
        largest = np.nanmax(np.abs(feeds[name]), initial=1.0)
        with np.errstate(over="ignore"):  # beyond the input type's range: inf, a second non-finite row
            odd[name][0] = EXTREME_FACTOR * largest
        odd[name][1] = np.inf
    return odd


def probabilities_of(session, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return session.run(["probabilities"], feeds)[0]


def rows_of(feeds: dict[str, np.ndarray], start: int, stop: int) -> dict[str, np.ndarray]:
    return {name: values[start:stop] for name, values in feeds.items()}


def tiled(feeds: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """`rows` rows of each feed, its own repeated where it has fewer."""
    return {name: np.take(values, np.arange(rows) % len(values), axis=0) for name, values in feeds.items()}


def best_rates(
    sessions, feeds: dict[str, np.ndarray], rounds: int = TIMING_ROUNDS, calls: int = CALLS_PER_ROUND
) -> tuple[float, ...]:
    """Each session's rows per second on `feeds`, every output asked for, as a server asks: the best of
    `rounds`, taken in turn, so that other work on the machine lands on both; each after a first run."""
    rows = len(next(iter(feeds.values())))
    for session in sessions:
        session.run(None, feeds)
    best = [float("inf")] * len(sessions)
    for _ in range(rounds):
        for index, session in enumerate(sessions):
            best[index] = min(best[index], timed(session, feeds, calls))
    return tuple(rows * calls / seconds for seconds in best)


def timed(session, feeds: dict[str, np.ndarray], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        session.run(None, feeds)
    return max(time.perf_counter() - start, 1e-9)
