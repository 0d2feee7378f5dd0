"""The int8 ONNX export against the float one: rows per second on CPU and test accuracy, same run.

For the default MLP and a wider one, each trained briefly by the torch loop on a seeded table whose
classes overlap (so that quantization has answers to change), the bundle's `model.onnx` is quantized as
`tasks.core.bundle.int8` quantizes it, and both files are run by onnxruntime on CPU with the same
session settings (one thread): rows per second on batches of 1 and 1,024 rows, the best of alternating
rounds of each; the test split's accuracy, whose difference is what the export's tolerance bounds; and
how many of 500 test rows the int8 file answers alike alone and beside an extreme and an inf row.

`python -m benchmarks.int8_bench [--smoke]`, or `python -m benchmarks --only int8`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.measure import Figure
from tasks.core.bundle.int8 import TOLERANCE

MODELS = {"default mlp 256,128": [256, 128], "wide mlp 1024,1024,512": [1024, 1024, 512]}
BATCHES = (1, 1024)
ROWS_PER_ROUND = 20_000  # rows each side scores per timed round: 20 calls of 1,024 rows, 20,000 of 1
FEATURES, CLASSES = 64, 10
FULL = {"rows": 60_000, "epochs": 3, "rounds": 7}
SMOKE = {"rows": 3_000, "epochs": 1, "rounds": 1}


def int8(work: Path, smoke: bool = False) -> list[Figure]:
    """The group's figures, at smoke sizes where asked."""
    sizes = SMOKE if smoke else FULL
    prepared = prepared_table(work, sizes["rows"])
    figures = []
    for name, hidden_sizes in MODELS.items():
        folder = trained_bundle(
            work / name.replace(" ", "-").replace(",", "_"), prepared, hidden_sizes, sizes
        )
        figures += model_figures(name, folder, prepared.paths, sizes["rounds"])
    return figures


def overlapping_table(path: Path, rows: int, seed: int = 0) -> str:
    """Gaussian classes close enough to overlap: a trained MLP is right on most rows, not all."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=0.35, size=(CLASSES, FEATURES))
    labels = rng.integers(0, CLASSES, size=rows)
    values = (centers[labels] + rng.normal(size=(rows, FEATURES))).astype(np.float32)
    columns = {f"f{i}": values[:, i] for i in range(FEATURES)} | {"label": labels}
    pq.write_table(pa.table(columns), path)
    return str(path)


def prepared_table(work: Path, rows: int):
    from tasks.core.data.assignment import SplitConfig
    from tasks.core.data.prepare import prepare_dataset

    data = overlapping_table(work / "int8-data.parquet", rows)
    return prepare_dataset(data, "label", str(work / "int8-prepared"), SplitConfig(seed=0))


def trained_bundle(folder: Path, prepared, hidden_sizes: list[int], sizes: dict) -> str:
    from tasks.core.bundle.manifest import BundleRecord
    from tasks.core.bundle.writing import write_bundle
    from tasks.core.models.plugins import mlp_spec
    from tasks.core.training.config import TrainConfig
    from tasks.core.training.records import Hardware
    from tasks.core.training.torch_training import train

    folder.mkdir(parents=True)
    config = TrainConfig(epochs=sizes["epochs"], batch_size=256, model=mlp_spec(hidden_sizes), seed=0)
    outcome = train(config, prepared.split_paths(), str(folder / "model.pt"))
    record = BundleRecord.of(prepared.table, outcome.run, Hardware("cpu", 1), data_fingerprint="benchmark")
    return write_bundle(str(folder / "bundle"), str(folder / "model.pt"), record)


def model_figures(name: str, folder: str, splits: dict[str, str], rounds: int) -> list[Figure]:
    from tasks.core.bundle.export_plan import onnx_session
    from tasks.core.bundle.int8 import INT8_FILE, best_rates, compare, feeder, row_batches, tiled
    from tasks.core.bundle.int8_quantize import calibration_rows, quantize
    from tasks.core.bundle.manifest import read_manifest
    from tasks.core.data.files import filesystem_for

    manifest = read_manifest(*filesystem_for(folder), folder)
    fp32, int8_file = Path(folder) / manifest.files["onnx"], Path(folder) / INT8_FILE
    test = splits["test"]
    quantize(fp32, int8_file, calibration_rows(splits["train"], manifest.record.feature_names))
    measured = compare(fp32, int8_file, manifest, test, "label")
    sessions = onnx_session(str(fp32)), onnx_session(str(int8_file))
    columns, feeds_of = feeder(manifest, [value.name for value in sessions[0].get_inputs()])
    sample = feeds_of(next(row_batches(test, columns)))
    figures = []
    for batch in BATCHES:
        calls = max(1, ROWS_PER_ROUND // batch)
        fp32_rate, int8_rate = best_rates(sessions, tiled(sample, batch), rounds, calls)
        figures.append(
            Figure(f"int8: {name}, {batch:,}-row batch, rows/s int8 vs fp32 (1 thread)", int8_rate, fp32_rate,
                   "rows/s", "ratio > 1 to keep the file")
        )  # fmt: skip
    delta = measured.int8_accuracy - measured.fp32_accuracy
    batch = measured.batch
    figures.append(
        Figure(f"int8: {name}, test accuracy int8 vs fp32 ({measured.rows:,} rows, delta {delta:+.4f}, "
               f"{measured.agreement:.2%} same class)", measured.int8_accuracy, measured.fp32_accuracy,
               "accuracy", f"delta >= -{TOLERANCE:g} to keep the file")
    )  # fmt: skip
    figures.append(
        Figure(f"int8: {name}, rows answered alike alone and beside an extreme and an inf row "
               f"({batch.changed} of {batch.rows} changed, probabilities within {batch.shift:.1g})",
               batch.rows - batch.changed, batch.rows, "rows", "ratio 1 to keep the file")
    )  # fmt: skip
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the harness")
    args = parser.parse_args()
    with TemporaryDirectory(prefix="mixedml-int8-bench-") as work:
        for figure in int8(Path(work), args.smoke):
            print(figure.line(), flush=True)


if __name__ == "__main__":
    main()
