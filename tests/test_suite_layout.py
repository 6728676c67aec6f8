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
