"""Test-only, active when this folder is on PYTHONPATH: every optimizer step of the torch loop sleeps
MIXEDML_TEST_STEP_SECONDS first, in the launcher and in every spawned worker alike, so that a test
can signal a training attempt run from its serialized command while it is mid-epoch."""

import os

if os.environ.get("MIXEDML_TEST_STEP_SECONDS"):
    import time

    from tasks.core.training import torch_training

    _step, _delay = torch_training.LoopState.optimizer_step, float(os.environ["MIXEDML_TEST_STEP_SECONDS"])

    def _slow_step(*args, **kwargs):
        time.sleep(_delay)
        return _step(*args, **kwargs)

    torch_training.LoopState.optimizer_step = _slow_step
