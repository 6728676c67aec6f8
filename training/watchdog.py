"""Dead or stuck ranks become errors, never hangs.

Two mechanisms, because a rank can fail in two ways:

- a peer that died or stopped answering: every collective carries the process group's
  timeout (``parallel.collective_timeout_s``), and ``explain`` turns the backend's terse
  error into one that says what happened, where, and where to look;
- this rank stuck outside any collective (a read that never returns, a deadlock): the
  ``Watchdog`` thread notices that the current phase has lasted longer than its limit,
  prints every thread's stack with the rank and exits, so the launcher tears the job down.

Either way the ranks that can still run store their stacks and flight-recorder dumps under
``<run>/diagnostics/`` (``training.diagnostics``), and the error names the step, the phase and
the ranks that did not arrive, read from the heartbeats the watchdog thread publishes.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable

from training.diagnostics import Heartbeats, describe_ranks, missing_ranks, read_heartbeats

EXIT_STUCK = 86
"""Exit status of a rank the watchdog ended."""

# Words of the backends' own errors (gloo, NCCL, the c10d layer under both).
_BACKEND_SIGNS = ("gloo", "nccl", "c10d", "processgroup")


class PeerFailure(RuntimeError):
    """Another rank died or is stuck: this rank's collective with it failed."""


class Progress:
    """What the rank is doing now, and since when: read by the watchdog and error messages."""

    def __init__(self) -> None:
        self.phase = "starting"
        self.limit_s = 0.0
        self.since = time.monotonic()
        self.step = 0
        self.detail = "starting"
        self.world_size = 1
        self.diagnose: Callable[[str], list[str]] | None = None
        """Stores this rank's diagnostics with a reason, returns where (set once the run is known)."""

    def enter(self, phase: str, limit_s: float) -> None:
        """Start ``phase``, which may last ``limit_s`` seconds (0 = unbounded) before it counts as stuck."""
        self.phase, self.limit_s, self.since = phase, limit_s, time.monotonic()

    def at(self, step: int, detail: str) -> None:
        """Where inside the phase the rank is (a step's data, forward_backward, collective, …); the
        phase's clock keeps running."""
        self.step, self.detail = step, detail

    def diagnostics(self, reason: str) -> str:
        """Store this rank's diagnostics; ' Diagnostics: <urls>.' or '' for a message."""
        if self.diagnose is None:
            return ""
        urls = self.diagnose(reason)
        return f" This rank's stacks and collective records: {', '.join(urls)}." if urls else ""


def explain(error: BaseException, rank: int, progress: Progress, timeout_s: float) -> PeerFailure | None:
    """A clear error for a collective that failed because of another rank; None for other errors."""
    import torch.distributed as dist

    text = str(error)
    backend_error = isinstance(error, dist.DistError) or (
        type(error) is RuntimeError and any(sign in text.lower() for sign in _BACKEND_SIGNS)
    )
    if not backend_error:
        return None
    first_line = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    beats = read_heartbeats(progress.world_size)
    missing = [r for r in missing_ranks(beats, progress.world_size) if r != rank]
    who = f"ranks that did not arrive: {describe_ranks(beats, missing)}" if missing else "another rank died or is stuck"
    where = f"{progress.phase} ({progress.detail})" if progress.detail not in progress.phase else progress.phase
    saved = progress.diagnostics(f"collective failed during {where}: {first_line}")
    return PeerFailure(
        f"rank {rank}: a collective with the other ranks failed during {where}, "
        f"{time.monotonic() - progress.since:.0f} s into it; {who} "
        f"(each collective waits at most parallel.collective_timeout_s={timeout_s:g} s). "
        f"The failed rank's own log holds the cause.{saved} Backend said: {first_line}"
    )


class Watchdog:
    """A daemon thread that ends this process when a phase overruns its limit."""

    def __init__(self, progress: Progress, rank: int, poll_s: float = 1.0) -> None:
        self.progress = progress
        self.rank = rank
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)
        self.heartbeats = Heartbeats(rank)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            p = self.progress
            if p.step:
                self.heartbeats.publish(p.step, p.detail)
            stuck_for = time.monotonic() - p.since
            if p.limit_s and stuck_for > p.limit_s:
                saved = p.diagnostics(f"watchdog: {p.phase} ({p.detail}) made no progress for {stuck_for:.0f} s")
                print(
                    f"[rank {self.rank}] watchdog: {p.phase} ({p.detail}) has made no progress for {stuck_for:.0f} s "
                    f"(limit {p.limit_s:g} s): this rank is stuck; its stacks follow, then it exits "
                    f"with status {EXIT_STUCK} so that the launcher ends the job.{saved}",
                    file=sys.stderr,
                    flush=True,
                )
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                sys.stderr.flush()
                os._exit(EXIT_STUCK)  # a stuck main thread would never see an exception
