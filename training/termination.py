"""A rank asked to stop (SIGTERM) unwinds as an exit, so that what it was writing is cleaned up.

torch.distributed.elastic stops a job's other ranks with SIGTERM when one fails (and waits 30 s
before SIGKILL); Kubernetes does the same when it evicts or preempts a pod. A rank taking SIGTERM's
default action dies between two instructions: a store write in flight leaves its temporary file
(``.tmp-…``) behind, on a disk that may be the very one that just filled. Here SIGTERM raises
``SystemExit(143)`` in the main thread instead, so ``finally`` blocks and the store's own cleanup run.

Python runs a signal handler only when the main thread is back in Python. A main thread blocked in
C (a gloo collective waiting for a stopped peer) would not end until its call returned, where the
default action ended it at once; so the signal also wakes a thread (through ``signal.set_wakeup_fd``,
written by the C-level handler whatever the main thread does) that SIGKILLs the process if it has
not exited ``grace_s`` seconds later.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator

GRACE_S = 5.0
"""How long a terminated rank may take to unwind before it is killed outright."""

EXIT_TERMINATED = 128 + signal.SIGTERM
"""The status a shell gives a process that SIGTERM ended."""


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(EXIT_TERMINATED)


def _kill_after_grace(wakeups: int, grace_s: float) -> None:
    """Reads the signal numbers the C-level handler writes; after a SIGTERM, waits ``grace_s``, then SIGKILLs."""
    with os.fdopen(wakeups, "rb", buffering=0) as signals:
        while True:
            got = signals.read(64)
            if not got:  # the write end closed: termination is handled by someone else again
                return
            if signal.SIGTERM in got:
                time.sleep(grace_s)
                os.kill(os.getpid(), signal.SIGKILL)


@contextlib.contextmanager
def exit_on_sigterm(grace_s: float = GRACE_S) -> Iterator[None]:
    """While inside: SIGTERM raises ``SystemExit(143)`` in the main thread, and the process is SIGKILLed
    ``grace_s`` seconds after the signal if it is still alive. Outside the main thread: nothing changes
    (only the main thread may set signal handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wakeups, wake = os.pipe()
    os.set_blocking(wake, False)  # the C-level handler must never block
    previous_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    previous_wake = signal.set_wakeup_fd(wake, warn_on_full_buffer=False)
    threading.Thread(target=_kill_after_grace, args=(wakeups, grace_s), name="sigterm-grace", daemon=True).start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_wake)
        signal.signal(signal.SIGTERM, previous_handler)
        os.close(wake)  # ends the grace thread, unless a SIGTERM already started its countdown
