"""An ordered map over a forked process pool with a bounded number of batches in flight.

``Pool.imap`` would pull the whole input iterator into its task queue as fast as it can,
which for a corpus bigger than memory is the whole corpus; here at most ``2 × workers``
batches are queued or running at any time, and results come back in input order.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from common.forking import inherited_objects_frozen

log = logging.getLogger(__name__)
EXIT_GRACE_S = 60  # seconds workers have to exit after a graceful close
TERMINATE_GRACE_S = 10  # … after SIGTERM
POLL_S = 0.5  # how often a wait for a batch looks for a worker that exited
RESTARTS = 1  # fresh pools a map may start after losing a worker, before it fails
T = TypeVar("T")
R = TypeVar("R")


def worker_count(workers: int) -> int:
    return workers or len(os.sched_getaffinity(0)) or 1


@contextmanager
def single_threaded_env():
    """Processes are the parallelism: each worker keeps to one thread, and saying so before
    the fork keeps tokenizers from warning about a fork after its thread pool was used."""
    saved = {k: os.environ.get(k) for k in ("TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS")}
    os.environ.update(TOKENIZERS_PARALLELISM="false", RAYON_NUM_THREADS="1")
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def trainer_threads(n: int):
    """HF's trainer uses rayon threads: as many as our workers, unless the user chose."""
    if "RAYON_NUM_THREADS" in os.environ:
        yield
        return
    os.environ["RAYON_NUM_THREADS"] = str(n)
    try:
        yield
    finally:
        os.environ.pop("RAYON_NUM_THREADS", None)


class WorkerPool:
    """``workers`` forked processes, or the calling process itself when ``workers`` is 1.

    Fork, not spawn: a spawned worker re-imports the parent's ``__main__`` (pyflyte, a test
    runner), which costs seconds; forked workers also inherit tables built before the fork.

    A worker that exits while batches are pending (the kernel's OOM killer, a stray signal) takes
    the batch it held with it, and ``multiprocessing.Pool`` replaces the worker but waits for that
    batch for ever (a suite run hung so, 2026-12-06). ``map_ordered`` sees the exit, starts a fresh
    pool and submits the pending batches again (each is a pure function of its input); a second
    loss fails with ``WorkerLost``, naming how the worker ended.
    """

    def __init__(self, workers: int, initializer: Callable[..., None] | None = None, initargs: tuple = ()) -> None:
        self.workers = worker_count(workers)
        self._pool = None
        self._started: list[Any] = []  # the processes the current pool started with
        self._initializer, self._initargs = initializer, initargs
        if self.workers == 1:
            if initializer:
                initializer(*initargs)
            return
        self._start()

    def _start(self) -> None:
        with single_threaded_env(), _default_sigterm(), inherited_objects_frozen():
            self._pool = mp.get_context("fork").Pool(
                self.workers, initializer=_start_worker, initargs=(self._initializer, self._initargs)
            )
        self._started = list(self._pool._pool)  # the Pool has no public handle on its processes

    def _exited(self) -> list[Any]:
        """The pool's first workers that have exited: none does before the pool is closed, unless killed."""
        return [w for w in self._started if w.exitcode is not None]

    def _result(self, pending: Any) -> Any:
        while True:
            try:
                return pending.get(timeout=POLL_S)
            except mp.TimeoutError:
                if exited := self._exited():
                    raise WorkerLost(exited) from None

    def map_ordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[tuple[T, R]]:
        """``(item, fn(item))`` in input order, at most ``2 × workers`` items in flight."""
        if self._pool is None:
            for item in items:
                yield item, fn(item)
            return
        window: deque[tuple[T, Any]] = deque()
        restarts = 0

        def next_result() -> tuple[T, R]:
            nonlocal restarts, window
            while True:
                try:
                    return window[0][0], self._result(window[0][1])
                except WorkerLost as lost:
                    if restarts >= RESTARTS:
                        raise
                    restarts += 1
                    log.warning("%s; sending the %d pending batches again to %d fresh workers", lost, len(window), self.workers)
                    self.close(failed=True)
                    self._start()
                    window = deque((item, self._pool.apply_async(fn, (item,))) for item, _ in window)

        for item in items:
            window.append((item, self._pool.apply_async(fn, (item,))))
            if len(window) >= 2 * self.workers:
                yield next_result()
                window.popleft()
        while window:
            yield next_result()
            window.popleft()

    def close(self, failed: bool = False) -> None:
        """Let the workers finish and exit; after a failure, stop them at once. A worker still
        alive after the grace period (one that ignores SIGTERM, or is stuck) is killed: a hung
        close would hang its caller, the whole prepare step with it."""
        if self._pool is None:
            return
        pool, self._pool = self._pool, None

        def stop() -> None:
            if failed:
                pool.terminate()
            else:
                pool.close()
            pool.join()

        # Not SIGKILL first: an idle worker holds the task queue's lock while it waits, and
        # terminate() takes that lock, so a worker killed holding it would hang terminate().
        stopper = threading.Thread(target=stop, name="worker-pool-close", daemon=True)
        stopper.start()
        stopper.join(TERMINATE_GRACE_S if failed else EXIT_GRACE_S)
        if stopper.is_alive():
            stuck = [w for w in pool._pool if w.is_alive()]  # the Pool has no public handle on its processes
            for worker in stuck:
                os.kill(worker.pid, signal.SIGKILL)
            log.warning("killed %d data-prep worker(s) that had not exited when the pool closed", len(stuck))
            # A worker killed while holding the task queue's lock leaves terminate() waiting on it
            # for ever: after one more grace period the pool is abandoned (its thread is a daemon).
            stopper.join(TERMINATE_GRACE_S)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(failed=exc_type is not None)


class WorkerLost(RuntimeError):
    """A data-prep worker exited while batches were pending."""

    def __init__(self, exited: list[Any]) -> None:
        how = ", ".join(f"pid {w.pid} {_ending(w.exitcode)}" for w in exited)
        super().__init__(
            f"a data-prep worker exited while batches were pending ({how}): if the kernel killed it for memory, lower "
            "data.workers (each worker holds its batches and a copy of the tables forked with it)"
        )


def _ending(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


@contextmanager
def _default_sigterm() -> Iterator[None]:
    """SIGTERM's default action in this process while it forks the workers (main thread only: elsewhere the
    handler cannot be changed). A fork inherits a Python SIGTERM handler (torch elastic's raises an exception);
    a SIGTERM reaching a worker before ``_start_worker`` resets it raised inside the worker's copy of the
    parent's stack, which then ran the pool's clean-up as if it were the parent (CI, 2026-12-04:
    "can only join a child process"; the sender was not found: on a machine whose pids wrap at 32768, a
    signal meant for an exited process's pid can reach a new one). With the default, such a worker just
    dies before its first task, and the pool starts another."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        if previous is not None:  # None: a handler installed outside Python, which cannot be put back
            signal.signal(signal.SIGTERM, previous)


def _start_worker(initializer: Callable[..., None] | None, initargs: tuple) -> None:
    # A fork inherits the parent's Python signal handlers (a launcher's, a test runner's). One
    # that catches SIGTERM without exiting made Pool.terminate() wait forever for its worker.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if initializer:
        initializer(*initargs)
