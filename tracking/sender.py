"""The live feed of step records to MLflow during training: a buffer and a background thread.

Training only puts each step's final record on a queue (``send``: no I/O, never blocks). The
thread sends what has accumulated in one request, and when MLflow is down or slow it keeps the
records and tries again with a growing pause (``BACKOFF_S``), so an outage costs memory for a
few numbers per step and no training time. At the end ``close`` waits at most ``flush_s`` for the
buffer to drain, then warns once with the count left: the pipeline's last task replays the whole
metrics.jsonl from the store with the same timestamps, so nothing is lost and nothing doubled.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from tracking.client import client, describe, log_points, step_metrics, where


def to_stderr(line: str) -> None:
    """Where the feed's warnings go unless a caller says otherwise."""
    print(line, file=sys.stderr, flush=True)


BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)
"""Pauses between attempts after consecutive failures (the last one repeats)."""


class LiveSender:
    """Sends step records to the MLflow run ``run_id`` at ``uri`` from a daemon thread."""

    def __init__(
        self, uri: str, run_id: str, timeout_s: float = 5.0, flush_s: float = 5.0, log: Callable[[str], None] | None = None
    ) -> None:
        self.uri, self.run_id, self.timeout_s, self.flush_s = uri, run_id, timeout_s, flush_s
        self.log = log or to_stderr
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self._pending: list[dict[str, Any]] = []  # taken off the queue, not yet acknowledged by MLflow
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._submitted = 0
        self.sent = 0
        self.failures = 0
        self.last_error = ""
        self._thread = threading.Thread(target=self._run, name="mlflow-sender", daemon=True)
        self._thread.start()

    def send(self, record: dict[str, Any]) -> None:
        """Queue one step's final record (a copy: training may still hold the dict)."""
        with self._lock:
            self._submitted += 1
        self._queue.put(dict(record))

    def unsent(self) -> int:
        with self._lock:
            return self._submitted - self.sent

    def _take(self) -> None:
        with self._lock:
            while True:
                try:
                    self._pending.append(self._queue.get_nowait())
                except queue.Empty:
                    return

    def _run(self) -> None:
        mlflow = None
        try:  # import MLflow now, while training starts up, so that the first step goes out at once
            mlflow = client(self.uri, self.timeout_s)
        except Exception:
            pass  # not installed: each attempt below fails and says so
        while not self._stop.is_set():
            self._take()
            if not self._pending:
                try:
                    record = self._queue.get(timeout=0.2)
                except queue.Empty:
                    continue
                with self._lock:
                    self._pending.append(record)
                self._take()
            try:
                mlflow = mlflow or client(self.uri, self.timeout_s)
                points = [p for record in self._pending for p in step_metrics(record)]
                log_points(mlflow, self.run_id, points)
            except Exception as e:  # down, slow, refusing: keep the records and try again later
                self.failures += 1
                self.last_error = describe(e)
                if self.failures == 1:
                    self.log(
                        f"tracking: MLflow at {where(self.uri)} did not take step records ({self.last_error}); "
                        "buffering and retrying"
                    )
                self._stop.wait(BACKOFF_S[min(self.failures, len(BACKOFF_S)) - 1])
                continue
            with self._lock:
                self.sent += len(self._pending)
                self._pending.clear()
            if self.failures:
                self.log(f"tracking: MLflow at {where(self.uri)} answers again; buffered step records sent")
                self.failures = 0

    def close(self) -> int:
        """Wait up to ``flush_s`` for the buffer to drain; warn once if records are left. Returns their count."""
        deadline = time.monotonic() + self.flush_s
        while self.unsent() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + 1.0)
        left = self.unsent()
        if left:
            self.log(
                f"WARNING: tracking: {left} step record(s) not sent to MLflow at {where(self.uri)} within "
                f"{self.flush_s:g} s ({self.last_error or 'still sending'}); "
                "the pipeline's last step (track_run) sends them from the store"
            )
        return left
