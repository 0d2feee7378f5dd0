"""What importing the project loads, in a fresh interpreter (a test process has imported far more
already): one interpreter for every check, the narrowest import first. Each check reads sys.modules
right after its own import, and sys.modules only grows, so an earlier import can make a later check
fail, never pass."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.flyte_package import REPO

# One worker runs them all, so the probe runs once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("imports")]

# Each step: what it imports (and runs), then the modules that must not be loaded after it.
STEPS = {
    "the data api": (
        "import tasks.core.data.api",
        [
            "sklearn",
            "torch",
            "tensorflow",
            "flytekit",
            "tasks.core.data.prepare",
            "tasks.core.data.pieces",
            "tasks.core.data.assignment",
        ],
    ),
    "the core models": (
        "import tasks.core.models.plugins, tasks.core.models.torch_models, tasks.core.models.probe, "
        "examples.residual\n"
        "from tasks.core.models.plugins import ModelSpec, check_model\n"
        "check_model(ModelSpec('cnn', '1x8x8'), 64, 10, 'pytorch')",
        ["tensorflow", "keras"],
    ),
    "the workflows": ("import workflows.pipeline, workflows.comparison", ["matplotlib"]),
}
PROBE = """
import json, sys
loaded = {}
for name, (code, forbidden) in json.loads(sys.argv[1]).items():
    exec(code)
    loaded[name] = sorted(module for module in forbidden if module in sys.modules)
print(json.dumps(loaded))
"""


@pytest.fixture(scope="module")
def loaded() -> dict[str, list[str]]:
    """Step -> the modules it must not load that were loaded after it."""
    run = subprocess.run([sys.executable, "-c", PROBE, json.dumps(STEPS)], cwd=REPO, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_importing_the_api_loads_no_framework_nor_the_preparing(loaded):
    """Serving reads rows through tasks.core.data.api: no training framework, Flyte, nor the preparing."""
    assert loaded["the data api"] == []


def test_core_models_never_load_tensorflow(loaded):
    """Core models, the worked example and checking a torch CNN."""
    assert loaded["the core models"] == []


def test_importing_the_workflows_loads_no_plotting_library(loaded):
    """matplotlib is imported when a Deck draws its first chart, not by registration or a task's import."""
    assert loaded["the workflows"] == []
