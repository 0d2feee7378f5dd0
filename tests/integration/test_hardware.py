"""The hardware catalogs read the extra options where tasks/hardware.py is imported: a fresh interpreter
with and without the variable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tasks.catalog import EXTRA_OPTIONS_VARIABLE


@pytest.mark.slow
def test_the_catalogs_read_the_extra_options_where_the_module_is_imported():
    """Registration (`pyflyte register --env`) puts the variable in every task's container, so the
    planning tasks rank what their process reads at import."""
    names = "from tasks.catalog import GPU_CATALOG, TPU_CATALOG; print(*[e.name for e in GPU_CATALOG + TPU_CATALOG])"
    env = os.environ | {EXTRA_OPTIONS_VARIABLE: "a100-40gb tpu-v6e-1x1"}
    ranked = subprocess.run(
        [sys.executable, "-c", names], env=env, capture_output=True, text=True, check=True
    )
    assert {"a100-40gb", "tpu-v6e-1x1"} <= set(ranked.stdout.split())
    env.pop(EXTRA_OPTIONS_VARIABLE)
    ranked = subprocess.run(
        [sys.executable, "-c", names], env=env, capture_output=True, text=True, check=True
    )
    assert not {"a100-40gb", "tpu-v6e-1x1"} & set(ranked.stdout.split())
