"""The test session's own temporary root (tests/conftest.py): gone after a pass, kept after a failure."""

import os
import tempfile
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).parents[1] / "conftest.py"

# Records where the inner session's temporary root was, and leaves a file there as a worker would.
INNER_TEST = """
import os, subprocess, sys, tempfile
from pathlib import Path

def test_records_its_root():
    root = Path(tempfile.gettempdir())
    child = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.mkdtemp(prefix='flyte'))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    Path({record!r}).write_text(f"{{root}}\\n{{child}}")
    assert {passes}
"""


def run_inner_session(pytester: pytest.Pytester, passes: bool) -> tuple[Path, Path, pytest.RunResult]:
    record = pytester.path / "record.txt"
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_inner=INNER_TEST.format(record=str(record), passes=passes))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    root, child = record.read_text().splitlines()
    return Path(root), Path(child), result


def test_a_passing_session_removes_its_root_and_what_its_processes_left_there(pytester):
    outer = os.environ.get("TMPDIR")
    root, child, result = run_inner_session(pytester, passes=True)
    result.assert_outcomes(passed=1)
    assert root.name.startswith("mixedml-tests-")
    assert child.parent == root  # a process the test started made its folder in the session's root
    assert not root.exists()
    assert os.environ.get("TMPDIR") == outer
    assert Path(tempfile.gettempdir()) != root


def test_a_failing_session_keeps_its_root_and_says_where(pytester):
    root, child, result = run_inner_session(pytester, passes=False)
    result.assert_outcomes(failed=1)
    assert child.is_dir()
    result.stdout.fnmatch_lines([f"*temporary files are kept in {root}*"])
