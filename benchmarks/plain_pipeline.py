"""The same preprocess -> DDP training on the local workers -> evaluation as the workflow, without Flyte.

`python -m benchmarks.plain_pipeline DATA WORKDIR EPOCHS BATCH` prints the test accuracy.
"""

from __future__ import annotations

from benchmarks.measure import PhaseClock

CLOCK = PhaseClock()  # before the heavy imports: start-up counts them

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pyarrow.parquet as pq  # noqa: E402

from benchmarks.local_launch import local_workers  # noqa: E402
from tasks.core.bundle.loading import load_bundle  # noqa: E402
from tasks.core.bundle.manifest import BundleRecord  # noqa: E402
from tasks.core.bundle.writing import write_bundle  # noqa: E402
from tasks.core.data.assignment import SplitConfig  # noqa: E402
from tasks.core.data.prepare import prepare_dataset  # noqa: E402
from tasks.core.data.splits import SplitPaths  # noqa: E402
from tasks.core.evaluation.metrics import classification_metrics  # noqa: E402
from tasks.core.training.config import TrainConfig  # noqa: E402
from tasks.core.training.records import Hardware, TrainingRun  # noqa: E402


def train_worker(config: TrainConfig, splits: SplitPaths, artifact: str) -> None:
    from tasks.core.training.torch_ddp import shutdown_distributed
    from tasks.core.training.torch_training import train

    try:
        train(config, splits, artifact)
    finally:
        shutdown_distributed()


def main(data: str, workdir: str, epochs: str, batch: str) -> None:
    # As torchrun and the Flyte Elastic plugin do for several workers: one thread each, no oversubscription.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    CLOCK.mark("start-up")
    prepared = prepare_dataset(data, "label", str(Path(workdir) / "prepared"), SplitConfig(seed=0))
    splits = SplitPaths(prepared.paths["train"], prepared.paths["val"], prepared.table.feature_names, "label",
                        len(prepared.table.class_labels))  # fmt: skip
    artifact = str(Path(workdir) / "model.pt")
    CLOCK.mark("preprocess")
    local_workers(train_worker, "plain")(
        TrainConfig(epochs=int(epochs), batch_size=int(batch)), splits, artifact
    )
    CLOCK.mark("train")
    # What the pipeline's evaluate does: write the model bundle, then score the raw test split through it.
    folder = str(Path(workdir) / "bundle")
    write_bundle(folder, artifact, plain_record(prepared))
    test = pq.read_table(prepared.paths["test"])
    predicted = load_bundle(folder).predict_codes(test)
    metrics = classification_metrics(test.column("label").to_numpy(), predicted, prepared.table.class_labels)
    CLOCK.mark("evaluate")
    print(json.dumps({"accuracy": metrics.accuracy, "phases": CLOCK.seconds}))


def plain_record(prepared) -> BundleRecord:
    run = TrainingRun("pytorch", "cpu", "cpu", 2, "gloo", "float32", "DDP", [], 0.0, 0.0, TrainConfig())
    return BundleRecord.of(prepared.table, run, Hardware("cpu", 2), data_fingerprint="")


if __name__ == "__main__":
    main(*sys.argv[1:5])
