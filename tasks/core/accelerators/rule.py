"""The rule for hardware on a cluster: a task that declared an accelerator trains on it, or fails.

Locally (a laptop, CI) the training tasks fall back to CPU worker processes and say so. In a cluster
pod the same fallback would be a silent wrong result: the run "succeeds" on the host CPU at a
fraction of the speed, billed as GPU time. So there a task checks, before it reads any data, that the
accelerator it declared is usable, and fails naming what it expected and what it found.

No torch or TensorFlow here: each framework's check lives with the code that uses that framework.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


class AcceleratorUnavailable(RuntimeError):
    """A task declared an accelerator, runs on a cluster, and the accelerator is not usable."""

    def __init__(self, expected: str, found: str):
        super().__init__(
            f"this task declared {expected} but {found}. On a cluster a task never falls back to the host "
            "CPU: check the node pool, its driver and the image (deploy/)"
        )
        self.expected, self.found = expected, found


def on_flyte_cluster(environ: Mapping[str, str] = os.environ) -> bool:
    """Propeller sets the execution id in every task pod (flyteplugins/go/tasks/pluginmachinery/
    flytek8s/k8s_resource_adds.go); local runs and the tests have none."""
    return "FLYTE_INTERNAL_EXECUTION_ID" in environ
