"""`make test` runs two pytest-xdist workers with `--dist loadgroup`, and relies on the
`xdist_group` marks that conftest's SHARED_RUNS adds to keep each shared run in one worker. With
pytest 9.2 and xdist 3.8, loadgroup silently stops grouping (pytest-dev/pytest-xdist#1386), and
every shared run would happen once per worker. This pins the behaviour the suite depends on, so
an upgrade that breaks it fails here rather than only slowing the suite down."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import LONGEST_FIRST, SHARED_RUNS, start_rank
from tests.dependencies import REPO

pytestmark = pytest.mark.slow

# The suite's own hook, and one of its shared fixtures (here a trivial one), in a small session.
PROJECT_HOOK = """
import pytest

from tests.conftest import pytest_collection_modifyitems  # noqa: F401


@pytest.fixture
def SHARED():
    return "run"
"""
RECORD_THE_WORKER = """
import os
from pathlib import Path

import pytest


@pytest.mark.parametrize("case", range(6))
def test_records_its_worker(case, SHARED):
    (Path(os.environ["RECORDS"]) / f"worker-{case}").write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


def test_loadgroup_keeps_a_group_in_one_worker(tmp_path):
    shared = next(iter(SHARED_RUNS))
    (tmp_path / "conftest.py").write_text(PROJECT_HOOK.replace("SHARED", shared))
    (tmp_path / "test_grouped.py").write_text(RECORD_THE_WORKER.replace("SHARED", shared))
    records = tmp_path / "records"
    records.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
         "test_grouped.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**os.environ, "RECORDS": str(records), "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:]
    workers = [path.read_text() for path in records.iterdir()]
    assert len(workers) == 6
    assert len(set(workers)) == 1, f"one group ran on {sorted(set(workers))}: xdist_group no longer groups"


def fake_item(group: str | None, name: str) -> SimpleNamespace:
    mark = pytest.mark.xdist_group(group).mark if group else None
    return SimpleNamespace(get_closest_marker=lambda _: mark, originalname=name, name=name)


def test_the_longest_groups_and_tests_are_handed_out_first():
    quick, digits = fake_item(None, "test_quick"), fake_item("digits", "test_reads_the_run")
    smoke, pods = (
        fake_item(None, "test_smoke_orchestration_prints_every_figure_with_a_ratio"),
        fake_item("pods", "t"),
    )
    assert sorted([quick, digits, smoke, pods], key=start_rank) == [pods, smoke, digits, quick]


def test_every_name_in_the_start_order_is_a_group_or_a_test():
    """A renamed test or group would silently lose its early start."""
    sources = " ".join(path.read_text() for path in Path(__file__).parents[1].rglob("test_*.py"))
    for name in LONGEST_FIRST:
        named = (
            name in SHARED_RUNS.values() or f'xdist_group("{name}")' in sources or f"def {name}(" in sources
        )
        assert named, name
