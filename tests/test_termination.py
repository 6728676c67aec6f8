"""A rank that the launcher stops (SIGTERM) cleans up the store write it was in, and still ends promptly.

Each case is a real child process sent a real SIGTERM: ``training.termination.exit_on_sigterm`` as
``training.train.train`` wraps a rank.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.helpers import ROOT
from training.termination import EXIT_TERMINATED, exit_on_sigterm

# A store write that stops inside its temporary file (after it is written, before its mode is set),
# wrapped as a rank is: the parent sends SIGTERM once it prints "writing".
WRITE_STALLED_IN_ITS_TEMP = """
import sys, time
import storage.local as local
from training.termination import exit_on_sigterm

def stalled_mode():
    print("writing", flush=True)
    time.sleep(60)
    return 0o644

local.file_mode = stalled_mode
with exit_on_sigterm():
    local.LocalStore(sys.argv[1]).put_bytes("runs/r/diagnostics/rank_00001.stacks.txt", b"x" * 4096)
"""

# A main thread that does not get back to Python (SIGTERM blocked there, as a thread inside a C call
# that retries on EINTR would be): only the grace thread hears the signal.
MAIN_THREAD_NEVER_BACK_IN_PYTHON = """
import signal, time
from training.termination import exit_on_sigterm

with exit_on_sigterm(grace_s=1.0):
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    print("writing", flush=True)
    time.sleep(60)
"""


def _asleep(pid: int, timeout_s: float = 30.0) -> None:
    """Wait until the main thread of ``pid`` is blocked in its sleep: between printing and sleeping it runs Python, and a
    signal then would be handled at once, whatever the case under test (seen once in 8 full runs, beside other tests)."""
    deadline = time.monotonic() + timeout_s
    while "nanosleep" not in Path(f"/proc/{pid}/task/{pid}/wchan").read_text():
        assert time.monotonic() < deadline, "the child never went to sleep"
        time.sleep(0.01)


def _terminate_when_writing(code: str, *args: str) -> tuple[int, float, str]:
    """Start ``code``, SIGTERM it once it prints "writing" and sleeps; its exit status, seconds from the signal, stderr."""
    command = [sys.executable, "-c", textwrap.dedent(code), *args]
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "writing\n", child.stderr.read()
        _asleep(child.pid)
        sent = time.monotonic()
        child.send_signal(signal.SIGTERM)
        _, stderr = child.communicate(timeout=60)
        return child.returncode, time.monotonic() - sent, stderr
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_terminated_write_removes_its_temporary_file_and_exits_143(tmp_path: Path):
    status, _, stderr = _terminate_when_writing(WRITE_STALLED_IN_ITS_TEMP, str(tmp_path))
    folder = tmp_path / "runs/r/diagnostics"
    assert folder.is_dir() and list(folder.iterdir()) == []  # no ".tmp-…" left, and nothing half-written
    assert status == EXIT_TERMINATED, stderr  # an exit, not death by the signal (-15)
    assert "Traceback" not in stderr, stderr


def test_a_main_thread_stuck_outside_python_is_killed_after_the_grace():
    status, seconds, stderr = _terminate_when_writing(MAIN_THREAD_NEVER_BACK_IN_PYTHON)
    assert status == -signal.SIGKILL, stderr
    assert 1.0 <= seconds < 20, seconds  # the grace, not the 60 s the main thread would have taken


def test_outside_the_block_sigterm_is_what_it_was():
    before = signal.getsignal(signal.SIGTERM)
    with exit_on_sigterm():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
    assert signal.set_wakeup_fd(-1) == -1  # no wakeup descriptor left behind
