"""Dead or stuck ranks become errors, never hangs.

Two mechanisms, because a rank can fail in two ways:

- a peer that died or stopped answering: every collective carries the process group's
  timeout (``parallel.collective_timeout_s``), and ``explain`` turns the backend's terse
  error into one that says what happened, where, and where to look;
- this rank stuck outside any collective (a read that never returns, a deadlock): the
  ``Watchdog`` thread notices that the current phase has lasted longer than its limit,
  prints every thread's stack with the rank and exits, so the launcher tears the job down.
  A rank whose peers are behind it is only waiting for them: its watchdog gives theirs a head
  start (``WAITING_GRACE_S``), so that the stuck rank's stacks are the ones stored.

Either way the ranks that can still run store their stacks and flight-recorder dumps under
``<run>/diagnostics/`` (``training.observe.diagnostics``), and the error names the step, the phase and
the ranks that did not arrive, read from the heartbeats the watchdog thread publishes.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable

from common.errors import first_line
from training.observe.diagnostics import Heartbeats, describe_ranks, missing_ranks, read_heartbeats
from training.observe.failures import BACKEND_SIGNS, first_failure, record_failure

EXIT_STUCK = 86
"""Exit status of a rank the watchdog ended."""

WAITING_GRACE_S = 30.0
"""At most this long (and at most the limit again) a rank waiting for peers that are behind it
lets its own watchdog wait past the limit: the launcher ends the job as soon as the first rank
exits, and the one to store its stacks first should be the stuck one."""


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
        """Start ``phase``, which may last ``limit_s`` seconds (0 = unbounded) before it counts as stuck.
        Where inside it the rank is stays unknown ('') until ``at``."""
        self.phase, self.limit_s, self.since, self.detail = phase, limit_s, time.monotonic(), ""

    def at(self, step: int, detail: str) -> None:
        """Where inside the phase the rank is (a step's data, forward_backward, collective, …); the
        phase's clock keeps running."""
        self.step, self.detail = step, detail

    def where(self) -> str:
        """'step 3 (forward_backward)': the phase and where in it, for a message."""
        return f"{self.phase} ({self.detail})" if self.detail and self.detail not in self.phase else self.phase

    def heartbeat(self) -> dict:
        """This rank's own position, as a heartbeat: fresher than the one in the store."""
        return {"step": self.step, "phase": self.detail, "time": time.time()}

    def diagnostics(self, reason: str, failure: BaseException | None = None) -> str:
        """Store this rank's diagnostics; ' This rank's stacks …: <urls>.' or '' for a message.

        ``failure``: the exception that ended the training thread; its traceback goes first, as it
        shows where that thread was (the collective that timed out): its live stack is a handler's by now.
        """
        if self.diagnose is None:
            return ""
        if failure is not None:
            trace = "".join(traceback.format_exception(failure))
            reason = f"{reason}\n\nWhere the training thread failed (most recent call last):\n{trace}"
        try:
            urls = self.diagnose(reason)
        except Exception as e:  # noqa: BLE001 - the diagnostics must not hide the failure they describe
            return f" (Storing this rank's stacks failed: {e}.)"
        return f" This rank's stacks and collective records: {', '.join(urls)}." if urls else ""


def behind(beats: dict[int, dict], rank: int, progress: Progress) -> list[int]:
    """The other ranks behind this one, with this rank's own position taken from ``progress``
    (its stored heartbeat may lag by a poll). Nobody is behind before the first step."""
    if not progress.step:
        return []
    beats = {**beats, rank: progress.heartbeat()}
    return [r for r in missing_ranks(beats, progress.world_size) if r != rank]


def explain(error: BaseException, rank: int, progress: Progress, timeout_s: float) -> PeerFailure | None:
    """Record this rank's own failure, or explain its collective's: call it first in the handler.

    An error of this rank's own is recorded as the job's first failure if it is (``training.observe.failures``),
    before the process group closes: None, re-raise it. A collective that failed because of another
    rank becomes a PeerFailure naming the rank that failed first and its error, where one recorded
    it, else the ranks that did not arrive.
    """
    import torch.distributed as dist

    text = str(error)
    backend_error = isinstance(error, dist.DistError) or (
        type(error) is RuntimeError and any(sign in text.lower() for sign in BACKEND_SIGNS)
    )
    if not backend_error:
        record_failure(error, rank, progress.where())
        return None
    headline = first_line(error)
    where = progress.where()
    first = first_failure()
    if first is not None and first.rank != rank:
        saved = progress.diagnostics(f"collective failed during {where} because {first.describe()}: {headline}", error)
        return PeerFailure(
            f"{first.describe()} ({first.traceback_at()}); rank {rank}'s collective during {where} failed because "
            f"of it.{saved} Backend said: {headline}"
        )
    beats = read_heartbeats(progress.world_size)
    missing = behind(beats, rank, progress)
    if missing:
        who = (
            f"did not arrive: {describe_ranks(beats, missing)}; their own logs and nodes hold the cause "
            "(a rank that was stopped, or hangs in a kernel or driver, logs nothing)"
        )
    else:
        who = "another rank died or is stuck; the failed rank's own log holds the cause"
    # The traceback goes into the stored stacks: the training thread's live stack is this handler's by now.
    saved = progress.diagnostics(f"collective failed during {where}: {headline}", error)
    return PeerFailure(
        f"rank {rank}: a collective with the other ranks failed during {where}, "
        f"{time.monotonic() - progress.since:.0f} s into it (each collective waits at most "
        f"parallel.collective_timeout_s={timeout_s:g} s); {who}.{saved} Backend said: {headline}"
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
            if p.step and p.detail:
                self.heartbeats.publish(p.step, p.detail)
            stuck_for = time.monotonic() - p.since
            if not p.limit_s or stuck_for <= p.limit_s:
                continue
            beats = self.heartbeats.read(p.world_size) if p.world_size > 1 else {}
            waiting_for = behind(beats, self.rank, p)
            if waiting_for and stuck_for <= p.limit_s + min(p.limit_s, WAITING_GRACE_S):
                continue  # the ranks behind are the stuck ones: their watchdogs go first
            self._end(p, stuck_for, describe_ranks(beats, waiting_for) if waiting_for else "")

    def _end(self, p: Progress, stuck_for: float, waiting_for: str) -> None:
        """Store and print this rank's stacks, then exit: a stuck main thread would never see an exception."""
        where = p.where()
        state = f"waiting for {waiting_for}, which did not arrive" if waiting_for else "this rank is stuck"
        if not waiting_for:  # the stuck rank is the first failure; one waiting for it is not
            stuck = TimeoutError(f"made no progress for {stuck_for:.0f} s (limit {p.limit_s:g} s); the watchdog ended it")
            # It exits below without an error file: the record points at its lines in the job's log.
            record_failure(stuck, self.rank, where, exits=True, log_mark="watchdog:")
        saved = p.diagnostics(f"watchdog: {where} made no progress for {stuck_for:.0f} s; {state}")
        print(
            f"[rank {self.rank}] watchdog: {where} has made no progress for {stuck_for:.0f} s "
            f"(limit {p.limit_s:g} s): {state}; its stacks follow, then it exits "
            f"with status {EXIT_STUCK} so that the launcher ends the job.{saved}",
            file=sys.stderr,
            flush=True,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(EXIT_STUCK)
