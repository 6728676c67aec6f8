"""Profiles on demand: ``train.profile`` steps run under ``torch.profiler`` on every rank.

Each rank stores one gzip'd Chrome trace under ``<run>/tensorboard/plugins/profile/steps_A-B/``,
named as TensorBoard's profiler plugin expects (``<worker>.pt.trace.json.gz``); Perfetto
(ui.perfetto.dev) opens the same file. On a GPU the window also records the CUDA caching
allocator's history and stores its snapshot (``rank_N.memory_snapshot.pickle``), which
pytorch.org/memory_viz reads. Outside the window nothing is recorded and nothing is paid.
"""

from __future__ import annotations

import gzip
import shutil
import tempfile
from pathlib import Path

import torch

from common.contracts import MEMORY_SNAPSHOT_SUFFIX, TRACE_SUFFIX, profile_prefix
from storage import Store
from training.callbacks import Record, StepCallback
from training.config import TrainConfig

MEMORY_HISTORY_ENTRIES = 200_000


class WindowProfiler(StepCallback):
    """Starts before the window's first step and stores the traces after its last step."""

    def __init__(self, cfg: TrainConfig, store: Store, run: str, rank: int, device: torch.device) -> None:
        self.window = cfg.profile_window()
        self.stacks = cfg.profile_stacks
        self.store, self.run, self.rank, self.device = store, run, rank, device
        self._profiler: torch.profiler.profile | None = None
        self._first = 0
        self._last = 0
        self.stored: list[str] = []
        """Keys written by this rank."""

    def before_step(self, step: int) -> None:
        """Call with each step's 1-based number before it runs."""
        if self.window is None or self._profiler is not None:
            return
        first, last = self.window
        if not first <= step <= last:  # a resume past the window's start profiles what is left of it
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
        self._profiler = torch.profiler.profile(
            activities=activities, record_shapes=True, profile_memory=True, with_stack=self.stacks
        )
        self._profiler.start()
        self._first = step

    def after_step(self, record: Record) -> None:
        """Ends the window at its last step (``close`` ends it at the run's last step)."""
        self._last = record["step"]
        if self._profiler is not None and self._last >= self.window[1]:
            self.finish(self._last)

    def close(self) -> None:
        self.finish(self._last)

    def finish(self, step: int) -> None:
        """Stop and store the traces (also when the run ends inside the window)."""
        if self._profiler is None:
            return
        profiler, self._profiler = self._profiler, None
        profiler.stop()
        prefix = profile_prefix(self.run, self._first, step)
        folder = Path(tempfile.mkdtemp(prefix="pretrain-profile-"))
        try:
            trace = folder / "trace.json"
            profiler.export_chrome_trace(str(trace))
            packed = folder / "trace.json.gz"
            with trace.open("rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst)
            self._put(f"{prefix}/rank_{self.rank:05d}{TRACE_SUFFIX}", packed)
            if self.device.type == "cuda":
                snapshot = folder / "memory.pickle"
                torch.cuda.memory._dump_snapshot(str(snapshot))
                torch.cuda.memory._record_memory_history(enabled=None)
                self._put(f"{prefix}/rank_{self.rank:05d}{MEMORY_SNAPSHOT_SUFFIX}", snapshot)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _put(self, key: str, path: Path) -> None:
        self.store.put_file(key, path)
        self.stored.append(key)
