"""`python -m benchmarks.empty_flyte`: a workflow of the pipeline's shape whose tasks do nothing.

A task, a dynamic that runs an Elastic task on the pipeline's local workers, and a last task, run
locally. Its wall time over `benchmarks.empty_plain`'s is what flytekit and its PyTorch plugin cost
any pipeline of this shape, whatever its tasks do: the floor under the orchestration overhead.
"""

from __future__ import annotations

import json

from flytekit import dynamic, task, workflow
from flytekitplugins.kfpytorch import Elastic

from tasks.core.training.launch import local_cpu_workers


@task
def prepare(rows: int) -> int:
    return rows


@task(
    task_config=Elastic(
        nnodes=1, nproc_per_node=local_cpu_workers(), monitor_interval=0.1, increase_shared_mem=False
    )
)
def train(rows: int) -> int:
    return rows


@dynamic
def plan_and_train(rows: int) -> int:
    return train(rows=rows)


@task
def evaluate(rows: int) -> int:
    return rows


@workflow
def empty_pipeline(rows: int = 1) -> int:
    return evaluate(rows=plan_and_train(rows=prepare(rows=rows)))


if __name__ == "__main__":
    print(json.dumps({"rows": empty_pipeline(rows=1), "phases": {}}))
