"""Batch scoring throughput and memory: the streaming scorer against a bare loop over the same parquet.

The bare loop is the least any scoring of the file must do: read the feature columns batch by batch,
standardise them and run the model; it checks nothing and writes nothing. The scorer also checks every
value, passes the other columns through, writes the predictions and counts the labels for the metrics.

Each measurement runs as a child process (`python -m benchmarks.scoring_bench BUNDLE DATA ours|bare OUT`)
so that it has its own peak RSS; the libraries both sides use are imported before the clock starts.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from benchmarks.measure import Figure, alternating_best_rates, child_peak_rss_gib
from benchmarks.synthetic import write_table
from tasks.core.bundle.manifest import PREDICT_BATCH_ROWS
from tasks.core.data.reading import BATCH_ROWS

FEATURES, CLASSES = 64, 10
MODEL = {"hidden_sizes": [256, 128]}


def write_bundle_for(folder: Path, data: str, hidden_sizes: list[int] = MODEL["hidden_sizes"]) -> str:
    """An untrained MLP for the table's features and classes, as a bundle (its cost is what counts)."""
    import torch

    from tasks.core.bundle.manifest import BundleRecord
    from tasks.core.bundle.writing import write_bundle
    from tasks.core.data.scaling import ScalerStats
    from tasks.core.models.plugins import build, input_spec_for, mlp_spec
    from tasks.core.models.torch_models import save_torch_artifact
    from tasks.core.training.config import TrainConfig
    from tasks.core.training.records import Hardware, TrainingRun

    spec = mlp_spec(hidden_sizes)
    torch.manual_seed(0)
    model = build(spec, FEATURES, CLASSES, "pytorch")
    folder.mkdir(parents=True)
    artifact = str(folder / "artifact.pt")
    save_torch_artifact(model, spec, input_spec_for(spec, FEATURES, CLASSES), artifact)
    record = BundleRecord(
        framework="pytorch",
        feature_names=[f"f{i}" for i in range(FEATURES)],
        scaler=ScalerStats(mean=[0.0] * FEATURES, scale=[3.0] * FEATURES),
        class_labels=[str(label) for label in range(CLASSES)],
        label_kind="integer",
        label_column="label",
        source=data,
        data_fingerprint="benchmark",
        run=TrainingRun(
            "pytorch",
            "cpu",
            "cpu",
            1,
            "gloo",
            "fp32",
            "single-process",
            [],
            0.0,
            0.0,
            TrainConfig(model=spec),
        ),
        billed=Hardware("cpu", 1),
    )
    return write_bundle(str(folder / "bundle"), artifact, record)


def ours(bundle: str, data: str, out: str) -> None:
    from tasks.core.scoring.run import score_dataset

    score_dataset(bundle, data, out)


def bare(bundle: str, data: str, out: str) -> None:
    import torch

    from tasks.core.models.torch_models import load_torch_artifact

    manifest = json.loads((Path(bundle) / "bundle.json").read_text())
    features = manifest["feature_names"]
    mean, scale = (np.asarray(manifest["scaler"][key]) for key in ("mean", "scale"))
    model, _ = load_torch_artifact(str(Path(bundle) / manifest["files"]["weights"]))
    for batch in pq.ParquetFile(data).iter_batches(BATCH_ROWS, columns=features):
        raw = np.column_stack([batch.column(name).to_numpy() for name in features]).astype(np.float64)
        inputs = torch.from_numpy(((raw - mean) / scale).astype(np.float32))
        with torch.inference_mode():  # in the loader's chunks: large matmuls leave the CPU's caches
            [model(chunk).softmax(dim=1) for chunk in inputs.split(PREDICT_BATCH_ROWS)]


def main(bundle: str, data: str, mode: str, out: str) -> None:
    import scipy.special  # noqa: F401 - what each side imports is loaded before the clock starts
    import torch  # noqa: F401

    import tasks.core.scoring.run  # noqa: F401

    start = time.perf_counter()
    {"ours": ours, "bare": bare}[mode](bundle, data, out)
    print(json.dumps({"seconds": time.perf_counter() - start}))


def scoring(work: Path, sizes: tuple[int, int], rounds: int) -> list[Figure]:
    small, large = sizes
    tables = {
        rows: write_table(str(work / f"score-{rows}.parquet"), rows, FEATURES, CLASSES) for rows in sizes
    }
    bundle = write_bundle_for(work / "score-bundle", tables[small])
    peaks: dict[tuple[int, str], float] = {}
    runs = itertools.count()

    def rate(rows: int, mode: str) -> float:
        """One child run; each writes its predictions to a folder of its own."""
        out = str(work / f"scored-{next(runs)}")
        result = child_peak_rss_gib("benchmarks.scoring_bench", bundle, tables[rows], mode, out)
        peaks[rows, mode] = max(peaks.get((rows, mode), 0.0), result["peak_rss_gib"])
        return rows / result["seconds"]

    ours_rate, bare_rate = alternating_best_rates(
        lambda: rate(small, "ours"), lambda: rate(small, "bare"), rounds
    )
    for mode in ("ours", "bare"):
        rate(large, mode)
    growth = {mode: peaks[large, mode] / peaks[small, mode] for mode in ("ours", "bare")}
    return [
        Figure(f"scoring: throughput at {small:,} rows, streaming scorer vs bare loop (read + model)", ours_rate,
               bare_rate, "rows/s", "ratio >= 0.9 at 1,000,000 rows on CPU"),
        Figure(f"scoring: peak RSS growth {small:,} -> {large:,} rows ({large // small}x data), scorer vs bare "
               "loop", growth["ours"], growth["bare"], "x", "scorer's growth <= 1.5x"),
        Figure(f"scoring: peak RSS at {large:,} rows, scorer vs bare loop", peaks[large, "ours"],
               peaks[large, "bare"], "GiB"),
    ]  # fmt: skip


if __name__ == "__main__":
    main(*sys.argv[1:5])
