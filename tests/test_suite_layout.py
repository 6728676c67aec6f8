"""The test suite's own rule: what tests share lives in tests/helpers.py (fixtures in conftest.py);
no test module imports another test module or conftest, not even in a script it runs."""

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# Any import statement, also inside the source of a script a test runs in a fresh interpreter.
IMPORT = re.compile(r"^\s*(?:from\s+(\.*[\w.]*)\s+import|import\s+([\w.]+))", re.MULTILINE)


def test_test_modules_share_code_only_through_helpers():
    offending = {}
    for path in sorted(TESTS.glob("*.py")):
        modules = {a or b for a, b in IMPORT.findall(path.read_text())}
        bad = sorted(m for m in modules if m.lstrip(".").startswith(("tests.", "test_", "conftest")) and m != "tests.helpers")
        if bad:
            offending[path.name] = bad
    assert not offending, f"import helpers from tests.helpers only: {offending}"


PROBE = """
import time

import pytest


@pytest.fixture(scope="session")
def mlflow_tracking_uri():  # the suite's autouse tracking database: not needed here, and seconds to build
    yield ""


def test_slow_without_a_reason():
    time.sleep(1.0)


@pytest.mark.long("sleeps past the probe's limit on purpose")
def test_slow_with_a_reason():
    time.sleep(1.0)


def test_quick():
    pass
"""


def test_the_time_guard_fails_a_long_test_without_a_reason(tmp_path):
    """tests/conftest.py's guard, run on a probe module with the limit lowered to half a second: the slow test
    without a reason fails, naming itself and the limit; the one marked long and the quick one pass."""
    import os
    import subprocess
    import sys

    (tmp_path / "test_probe.py").write_text(PROBE)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-o",
            "markers=long",
            str(tmp_path / "test_probe.py"),
        ],
        cwd=TESTS.parent,
        env={**os.environ, "PRETRAIN_TEST_LONG_S": "0.5", "PYTEST_XDIST_WORKER_COUNT": "3"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "1 failed, 2 passed" in result.stdout, result.stdout[-3000:]
    assert re.search(r"test_slow_without_a_reason took 1 s of its own .* over the 0\.5 s", result.stdout), result.stdout[-3000:]
