"""The images as the Makefile and the package name them: `make -n push` expands the Makefile's image
list, and the package's GPU tasks run in images that find the driver (the Dockerfile's static checks:
tests/unit/deploy/test_dockerfile.py)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.flyte_package import REGISTRY, TAG, image_of, requests_of
from tests.unit.deploy.test_dockerfile import REPO, TARGETS, finds_the_gke_driver, gpu_task_stages


def test_makefile_builds_pushes_and_registers_every_image():
    """`make -n` expands the Makefile's image list (read from tasks/images.py) without building."""
    dry_run = subprocess.run(
        ["make", "-n", "-s", "push", "STAMP=Makefile"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert dry_run.count(f"for target in {' '.join(TARGETS)};") == 2, dry_run  # build, then push
    (line,) = [line for line in (REPO / "Makefile").read_text().splitlines() if line.startswith("IMAGES :=")]
    assert "tasks.images" in line  # read from the table, not listed again


@pytest.mark.slow
def test_every_packaged_task_that_requests_gpus_runs_in_an_image_that_finds_the_driver(flyte_package):
    """The same, from what the cluster receives: each GPU task's image as registration names it."""
    images = {image_of(spec) for spec in flyte_package.tasks.values() if "gpu" in requests_of(spec)}
    stages_named = {
        re.fullmatch(rf"{re.escape(REGISTRY)}/mixedml-([\w-]+):{TAG}", image).group(1) for image in images
    }
    assert stages_named == gpu_task_stages()
    for stage in stages_named:
        finds_the_gke_driver(stage)
