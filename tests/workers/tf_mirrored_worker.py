"""Run in a fresh process: split the CPU into 2 logical devices, train under MirroredStrategy.

TensorFlow fixes its logical devices when it first initialises, so this cannot share a process
with other TensorFlow tests. Prints a JSON summary on the last line.
"""

from __future__ import annotations

import json
import sys

import tensorflow as tf


def main(splits_json: str, artifact: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

    from tasks.core.data.splits import SplitPaths
    from tasks.core.training.config import TrainConfig
    from tasks.core.training.tf_training import train_keras

    splits = SplitPaths(**json.loads(splits_json))
    outcome = train_keras(TrainConfig(epochs=4, batch_size=32, seed=2), splits, artifact, strategy="mirrored")
    print(json.dumps({
        "strategy": outcome.run.strategy,
        "replicas": outcome.run.world_size,
        "val_accuracy": outcome.run.history[-1].val_accuracy,
        "devices": [d.name for d in tf.config.list_logical_devices("CPU")],
    }))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
