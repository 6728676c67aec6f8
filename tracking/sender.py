"""The live feed of step records to MLflow during training: a buffer and a background thread.

Training only puts each step's final record on a queue (``send``: no I/O, never blocks). The
thread sends what has accumulated in one request, and when MLflow is down or slow it keeps the
records and tries again with a growing pause (``BACKOFF_S``), so an outage costs memory for a
few numbers per step and no training time. At the end ``close`` waits at most ``flush_s`` for the
buffer to drain, then warns once with the count left: the pipeline's last task replays the whole
metrics.jsonl from the store with the same timestamps, so nothing is lost and nothing doubled.

Beside the step records the sender has MLflow sample this machine's use (CPU, memory, disk, network, and GPUs
where NVIDIA's NVML bindings are installed) every ``SYSTEM_METRICS_S`` into the run's ``system/`` metrics
(MLflow's ``SystemMetricsMonitor``, the run page's "System metrics" tab), from the first record it delivers:
the launcher of the node that trains rank 0 gets records, a launcher of another node none (its samples would
land on the same names).
"""

from __future__ import annotations

import contextlib
import logging
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
SYSTEM_METRICS_S = 10.0
"""Seconds between samples of the machine's use (MLflow's ``MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`` overrides it;
0 = none): each is a few psutil reads and two small requests, nothing measurable beside training."""


class LiveSender:
    """Sends step records to the MLflow run ``run_id`` at ``uri`` from a daemon thread, and has MLflow sample this
    machine's use every ``system_metrics_s`` seconds (0: never) once a record reached the run."""

    def __init__(
        self,
        uri: str,
        run_id: str,
        timeout_s: float = 5.0,
        flush_s: float = 5.0,
        log: Callable[[str], None] | None = None,
        system_metrics_s: float = SYSTEM_METRICS_S,
    ) -> None:
        self.uri, self.run_id, self.timeout_s, self.flush_s = uri, run_id, timeout_s, flush_s
        self.log = log or to_stderr
        self.system_metrics_s = system_metrics_s
        self._system: Any = None  # MLflow's SystemMetricsMonitor, started and stopped by the sending thread only
        self._system_tried = False
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
                self._watch_system()  # MLflow's monitor stops at its first failed request: a new one goes on
            elif not self._system_tried:
                self._watch_system()
        self._stop_system()

    def _watch_system(self) -> None:
        """(Re)start MLflow's sampling of this machine into the run's ``system/`` metrics, its steps numbered on from
        the run's last (a retried task's sender goes on where the first one ended). Never fails the sender."""
        self._stop_system()
        self._system_tried = True
        if not self.system_metrics_s > 0:
            return
        # MLflow logs its start and stop at INFO and an unreachable server at WARNING: the sender says that once.
        logging.getLogger("mlflow.system_metrics").setLevel(logging.ERROR)
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            monitor = SystemMetricsMonitor(
                self.run_id, sampling_interval=self.system_metrics_s, resume_logging=True, tracking_uri=self.uri
            )
            monitor.start()
        except Exception as e:  # no psutil in this image, say: the step records matter, not these
            self.log(f"tracking: no system metrics for MLflow run {self.run_id} ({describe(e)})")
            return
        self._system = monitor

    def _stop_system(self) -> None:
        if self._system is not None:
            with contextlib.suppress(Exception):  # waits for its request in flight (request_timeout_s at most)
                self._system.finish()
            self._system = None

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
