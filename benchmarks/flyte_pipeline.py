"""`python -m benchmarks.flyte_pipeline DATA EPOCHS BATCH [PLACEMENT]`: the workflow, run locally, no cache.

Prints the test accuracy, the training samples/s and the seconds spent per phase, as JSON.
"""

from __future__ import annotations

from benchmarks.measure import PhaseClock

CLOCK = PhaseClock()  # before the heavy imports: start-up counts them

import json  # noqa: E402
import sys  # noqa: E402
from contextlib import contextmanager  # noqa: E402

# The workflow's top-level nodes, named as the plain script's phases.
PHASE_OF_TASK = {
    "tasks.right_sizing.prepare_data": "preprocess",
    "tasks.right_sizing.train_on_target": "train",
    "tasks.evaluate.evaluate": "evaluate",
}


@contextmanager
def timed_tasks(clock: PhaseClock):
    """Charge each top-level task's execution to its phase, and the time between tasks (the
    workflow engine: literal conversion, local store) to "workflow"."""
    from flytekit.core.base_task import PythonTask

    dispatch = PythonTask.dispatch_execute

    def timed(task, ctx, inputs):
        phase = PHASE_OF_TASK.get(task.name)
        if phase:
            clock.mark("workflow")
        try:
            return dispatch(task, ctx, inputs)
        finally:
            if phase:
                clock.mark(phase)

    PythonTask.dispatch_execute = timed
    try:
        yield
    finally:
        PythonTask.dispatch_execute = dispatch


def main(data: str, epochs: str, batch: str, placement: str = "auto") -> None:
    from tasks.core.data.config import DataConfig
    from tasks.core.training.config import TrainConfig
    from workflows.pipeline import training_pipeline

    CLOCK.mark("start-up")
    with timed_tasks(CLOCK):
        hyperparameters = TrainConfig(epochs=int(epochs), batch_size=int(batch), data_placement=placement)
        report = training_pipeline(data=DataConfig(data), hyperparameters=hyperparameters).report
    CLOCK.mark("workflow")
    summary = {"accuracy": report.metrics.accuracy, "samples_per_second": report.training.samples_per_second}
    print(json.dumps({**summary, "phases": CLOCK.seconds}))


if __name__ == "__main__":
    main(*sys.argv[1:5])
