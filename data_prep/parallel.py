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

log = logging.getLogger(__name__)
EXIT_GRACE_S = 60  # seconds workers have to exit after a graceful close
TERMINATE_GRACE_S = 10  # … after SIGTERM
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
    """

    def __init__(self, workers: int, initializer: Callable[..., None] | None = None, initargs: tuple = ()) -> None:
        self.workers = worker_count(workers)
        self._pool = None
        if self.workers == 1:
            if initializer:
                initializer(*initargs)
            return
        with single_threaded_env(), _default_sigterm():
            self._pool = mp.get_context("fork").Pool(self.workers, initializer=_start_worker, initargs=(initializer, initargs))

    def map_ordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[tuple[T, R]]:
        """``(item, fn(item))`` in input order, at most ``2 × workers`` items in flight."""
        if self._pool is None:
            for item in items:
                yield item, fn(item)
            return
        window: deque[tuple[T, Any]] = deque()
        for item in items:
            window.append((item, self._pool.apply_async(fn, (item,))))
            if len(window) >= 2 * self.workers:
                done, result = window.popleft()
                yield done, result.get()
        while window:
            done, result = window.popleft()
            yield done, result.get()

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
