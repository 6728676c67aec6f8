"""Shared fixtures: a real SeaweedFS S3 server on 127.0.0.1, stores, and a tiny dataset.
Shared helpers (settings, corpora, run helpers) are in tests/helpers.py."""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import time
from pathlib import Path

# One intra-op thread per process, for the workers and every process a test starts (they inherit it), set
# before anything loads torch (its OpenMP pool reads this when loaded). The suite runs three workers on two
# cores, each starting pipelines and ranks: a second thread per process only spins against the others
# (model tests beside a busy loop: 12 % less CPU at one thread). Ranks have one already (as torchrun gives
# them). A value set outside the suite is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from storage import open_store  # noqa: E402
from storage.s3server import S3Server  # noqa: E402
from tests.helpers import init_tracking_db, tiny_data, tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> S3Server:
    server = S3Server(data_dir=tmp_path_factory.mktemp("seaweedfs"), bucket="pretrain-test")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch) -> dict[str, str]:
    """The AWS environment of the test server, set for this test."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    return s3_server.env()


@pytest.fixture
def s3_store(s3_env, s3_server, request):
    """A fresh prefix in the test bucket."""
    name = request.node.name.replace("[", "-").replace("]", "")
    return open_store(f"s3://{s3_server.bucket}/{name}-{os.getpid()}")


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    """Each test that takes ``store`` runs against a local directory and the S3 server."""
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    return request.getfixturevalue("s3_store")


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """A committed tiny dataset in a local store, shared read-only by the training tests."""
    from data_prep.prepare import prepare_dataset

    store = open_store(str(tmp_path_factory.mktemp("dataset-store")))
    return prepare_dataset(tiny_data(), tiny_tokenizer(), store)


class TinyModels(dict):
    """Tiny random Hugging Face checkpoints by family, each built the first time it is asked for."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, family: str) -> Path:
        from hf_interop.tiny import build_tiny, sample_texts

        self[family] = build_tiny(
            family, self.root / family, sample_texts(), max_shard_size="200KB" if family == "llama" else None
        )
        return self[family]


@pytest.fixture(scope="session")
def tiny_hf_models(tmp_path_factory) -> TinyModels:
    """A tiny random Hugging Face checkpoint of every family we import (``hf_interop.tiny``: built here, no
    download), by family, built when first asked for (a worker that needs only the Llama builds only it);
    read-only: a test that edits one copies it first. The Llama one is sharded."""
    return TinyModels(tmp_path_factory.mktemp("tiny-hf"))


@pytest.fixture(scope="session", autouse=True)
def mlflow_tracking_uri(tmp_path_factory) -> str:
    """One SQLite MLflow database for every pipeline of the session: ``MLFLOW_TRACKING_URI`` reaches the
    ``pretrain run``/``pyflyte run`` subprocesses (their env starts from os.environ), so a pipeline in a
    fresh HOME does not create and migrate a database of its own (seconds each). Created here, once,
    before any pipeline: two pipelines migrating one new database at once would race. Without MLflow (a
    GPU image running only the kernel tests, benchmarks/gpu_checks.sh) there is nothing to track into."""
    if importlib.util.find_spec("mlflow") is None:
        yield ""
        return
    uri = init_tracking_db(tmp_path_factory.mktemp("mlflow") / "mlflow.db")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        yield uri


# ----------------------------------------------------------------------------------------------
# Time and skips, guarded (see docs/testing.md): a test's own time over LONG_S needs a reason; on CI
# a skip needs a line in SKIPS_ALLOWED.


def long_s() -> float:
    """``LONG_S``, or ``PRETRAIN_TEST_LONG_S`` where set (the guard's own test sets a fraction of a second)."""
    return float(os.environ.get("PRETRAIN_TEST_LONG_S", LONG_S))


LONG_S = 60.0
"""Seconds of wall time: a test whose own time (its setup less shared fixtures, plus its call) passes this
needs ``@pytest.mark.long("why")``; a shared fixture that builds for longer needs ``@long_fixture("why")``.
The same 60 s whatever the number of xdist workers: under ``make test`` (three workers on two cores) a test
is slower than alone, and one that comes near the limit there is marked with its reason."""
SKIPS_ALLOWED = Path(__file__).with_name("skips_allowed.txt")

_shared_setup: dict[str, float] = {}  # test id -> seconds its setup spent building shared fixtures
_long_fixtures: list[str] = []  # shared fixtures over LONG_S without a reason
_current = [""]  # the test being set up (a shared fixture's request names its own scope's node)
_started = [time.monotonic()]


def pytest_sessionstart(session: pytest.Session) -> None:
    _started[0] = time.monotonic()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _current[0] = item.nodeid


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
    started = time.perf_counter()
    yield
    if fixturedef.scope == "function":
        return
    elapsed = time.perf_counter() - started
    _shared_setup[_current[0]] = _shared_setup.get(_current[0], 0.0) + elapsed
    if elapsed > long_s() and not getattr(fixturedef.func, "long_reason", ""):
        _long_fixtures.append(f"shared fixture {fixturedef.argname} ({fixturedef.scope}) built in {elapsed:.0f} s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.when == "setup":
        item.stash[_SETUP_S] = report.duration - _shared_setup.get(item.nodeid, 0.0)
        if _long_fixtures and report.passed:  # reported on the test that built it (on its xdist worker)
            report.outcome = "failed"
            report.longrepr = (
                f"{'; '.join(_long_fixtures)}, over the {long_s():g} s a shared fixture may take unexplained: make it "
                'cheaper, or decorate it with @long_fixture("why, in one line") (tests/helpers.py)'
            )
            _long_fixtures.clear()
    if report.when != "call" or not report.passed:
        return
    own = item.stash.get(_SETUP_S, 0.0) + report.duration
    marker = item.get_closest_marker("long")
    if own > long_s() and not (marker and marker.args and str(marker.args[0]).strip()):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {own:.0f} s of its own (setup less shared fixtures, plus call), over the {long_s():g} s "
            'a test may take unexplained: make it cheaper, or mark it @pytest.mark.long("why, in one line")'
        )


_SETUP_S = pytest.StashKey[float]()


def allowed_skips() -> list[tuple[str, str]]:
    """(test id pattern, reason) per line of SKIPS_ALLOWED: ``pattern | reason``; # starts a comment."""
    rows = []
    for line in SKIPS_ALLOWED.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            pattern, _, reason = (part.strip() for part in line.partition("|"))
            rows.append((pattern, reason))
    return rows


def _skips(terminalreporter) -> list[tuple[str, str]]:
    found = []
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        found.append((report.nodeid, reason.removeprefix("Skipped: ")))
    return found


_PROBLEMS = pytest.StashKey[list[str]]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Runs before the terminal summary is written: a guard that fails sets the exit status."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skips = _skips(reporter) if reporter else []
    problems = []
    if os.environ.get("CI"):
        allowed = allowed_skips()
        problems += [
            f"{nodeid} was skipped on CI ({reason}) and {SKIPS_ALLOWED.name} does not allow it: the check did not run"
            for nodeid, reason in skips
            if not any(fnmatch.fnmatchcase(nodeid, pattern) for pattern, _ in allowed)
        ]
    session.config.stash[_PROBLEMS] = problems
    if problems and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    skips = _skips(terminalreporter)
    if skips:
        terminalreporter.section("skipped tests and why")
        for nodeid, reason in skips:
            terminalreporter.line(f"{nodeid}: {reason}")
    problems = config.stash.get(_PROBLEMS, [])
    if problems:
        terminalreporter.section("suite guards failed")
        for line in problems:
            terminalreporter.line(line, red=True)
    elapsed = time.monotonic() - _started[0]
    terminalreporter.line(f"suite wall time {elapsed:.0f} s (budget: 900 s for the whole suite on the 2-core machine)")


# The longest modules, longest first (measured under make test, docs/testing.md): each runs whole on one
# xdist worker (--dist loadscope), so one started last would finish alone while the other worker idles.
LONGEST_FIRST = (
    "test_workflow_e2e.py",
    "test_identical_runs.py",
    "test_recovery.py",
    "test_store_full.py",
    "test_tracking_server.py",
    "test_same_bytes.py",
    "test_gc.py",
    "test_hang_diagnostics.py",
    "test_training.py",
)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest modules first, then those with slow tests, each whole and in its own order: with ``-n 2``
    (make test, ``--no-loadscope-reorder``) a worker starts on the longest work while the other takes the
    many short tests, instead of one long module left for last."""
    slow = {item.module for item in items if item.get_closest_marker("slow") is not None}

    def rank(item: pytest.Item) -> tuple[int, int]:
        name = item.path.name
        return (LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST), item.module not in slow)

    items.sort(key=rank)
