"""The same preprocess -> 2-worker DDP training -> evaluation as the workflow, without Flyte.

`python -m benchmarks.plain_pipeline DATA WORKDIR EPOCHS BATCH` prints the test accuracy.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from tasks.core.config import SplitPaths, TrainConfig
from tasks.core.data import SplitConfig, prepare_dataset, read_split
from tasks.core.metrics import classification_metrics
from tasks.core.model import load_artifact, predict


def train_worker(config: TrainConfig, splits: SplitPaths, artifact: str) -> None:
    from tasks.core.torch_training import shutdown_distributed, train

    try:
        train(config, splits, artifact)
    finally:
        shutdown_distributed()


def main(data: str, workdir: str, epochs: str, batch: str) -> None:
    # As torchrun and the Flyte Elastic plugin do for several workers: one thread each, no oversubscription.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    prepared = prepare_dataset(data, "label", str(Path(workdir) / "prepared"), SplitConfig(seed=0))
    splits = SplitPaths(prepared.paths["train"], prepared.paths["val"], prepared.feature_names, "label",
                        len(prepared.class_labels))  # fmt: skip
    artifact = str(Path(workdir) / "model.pt")
    launch = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id="plain", rdzv_backend="c10d",
                          rdzv_endpoint="localhost:0", start_method="spawn", monitor_interval=1)  # fmt: skip
    elastic_launch(launch, train_worker)(
        TrainConfig(epochs=int(epochs), batch_size=int(batch)), splits, artifact
    )
    model, _ = load_artifact(artifact)
    features, labels = read_split(prepared.paths["test"], prepared.feature_names, "label")
    metrics = classification_metrics(labels, predict(model, features), prepared.class_labels)
    print(json.dumps({"accuracy": metrics.accuracy}))


if __name__ == "__main__":
    main(*sys.argv[1:5])
