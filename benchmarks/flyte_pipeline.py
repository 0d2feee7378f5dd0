"""`python -m benchmarks.flyte_pipeline DATA EPOCHS BATCH`: the workflow, run locally, no cache."""

from __future__ import annotations

import json
import sys


def main(data: str, epochs: str, batch: str) -> None:
    from workflows.pipeline import training_pipeline

    report = training_pipeline(dataset=data, label_column="label", epochs=int(epochs), batch_size=int(batch))
    print(json.dumps({"accuracy": report.accuracy}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
