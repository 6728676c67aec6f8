"""The node's shard cache: each window of shards fetched from the store once per node, not once per rank.

A step's rows lie inside one shuffled window of shards (``training.data``), so every data-parallel rank
needs every window whatever its slice. The reading ranks of a node (``training.data.Reading``) share one
folder, ``$TMPDIR/pretrain-shards-<uid>/<dataset version>-<split>-<job>-node<N>/``: private (0700, under a root
of this user's own, 0700 and not a link), with the owner record of ``runs.staging``,
whose sweep removes the folders of this host's dead processes whenever a job makes its own.

- ``<epoch>-<window>.lock``: the first local rank that needs a window takes this ``fcntl`` lock, fetches
  the window's shards from the store, checks each one's sha256 against the manifest before parsing it,
  shuffles the rows as the loader does, and writes them as ``<epoch>-<window>.npy`` with
  ``common.private.write_private`` (0600, a temporary name, fsync, rename): the file appears only whole and
  checked. The other local ranks wait on the lock, then map the file (one copy in the page cache for the
  node, not one per rank). Correctness never rests on the lock: two ranks that both build a window
  write the same rows; the lock only keeps them from both downloading it (a rank that waited
  ``LOCK_WAIT_S`` for it fetches the window itself).
- ``.at-<rank>``: the oldest window each local reader still needs. A window below every reader's is
  deleted, so the disk holds the windows the readers hold in memory (the current and the prefetched).
- When a reader's loader closes (or its process exits), its ``.at-`` says ``done``; the last one
  removes the folder.

A window is cached whole, not shard by shard: the other ranks would parse and shuffle the same shards
again, the larger part of a reader's time. The folder's name has the job's id: nothing outlives the job.
"""

from __future__ import annotations

import fcntl
import io
import multiprocessing.util
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from common.private import private_dir, user_temp, write_private
from runs.staging import remove_job_folder, sweep_dead, write_owner

CACHE_ROOT = "pretrain-shards"
"""The folder under ``$TMPDIR`` that holds every job's node caches, with the user's uid (``user_temp``)."""
LOCK_WAIT_S = 120.0
"""The longest a rank waits for another that fetches a window. Past it, it fetches the window itself: the lock
only saves bytes, and a node peer that hangs (or is stopped) holding it must not hang this rank in its data
phase, away from the step's collectives, whose timeouts name the rank that hangs."""
_WINDOW_FILE = re.compile(r"(\d+)-(\d+)\.(?:npy|lock)")
_DONE = "done"

WindowKey = tuple[int, int]  # (epoch, window index)


def root() -> Path:
    return user_temp(CACHE_ROOT)


class NodeCache:
    """One loader's share of its node's cache folder: the windows its node's readers fetched once."""

    def __init__(self, folder: Path, rank: int, readers: int) -> None:
        self.folder, self.rank, self.readers = folder, rank, readers
        self._at: WindowKey | None = None
        self._closed = threading.Event()  # a read still in flight after close must not make the folder again
        # At close, at garbage collection or at the process's exit (a rank's, through multiprocessing's
        # exit function): the trainer never closes its loaders, and a killed job is swept.
        self._leave = multiprocessing.util.Finalize(
            self, _leave, args=(folder, rank, readers, root(), self._closed), exitpriority=10
        )

    @classmethod
    def open(cls, name: str, rank: int, readers: int) -> NodeCache:
        """The folder ``name`` under the cache root, made if this is the node's first rank to get here
        (after sweeping the folders of this host's dead processes); ``readers`` ranks of the node share it."""
        top = private_dir(root(), "the node's shard cache")
        sweep_dead(top, top)
        _make(top / name)
        return cls(top / name, rank, readers)

    def window(self, key: WindowKey, build: Callable[[], np.ndarray]) -> tuple[np.ndarray, bool]:
        """The rows of window ``key``, mapped from the node's file, which ``build`` (fetch, check, shuffle)
        makes first if no rank of the node has: the rows, and whether this rank built them."""
        path = self.folder / f"{key[0]}-{key[1]}.npy"
        with self._locked(key):
            built = not path.exists()
            if built:
                write_private(path, _npy_bytes(build()))  # type: ignore[arg-type]  # any buffer: it is written whole
            return np.load(path, mmap_mode="r", allow_pickle=False), built

    def advance(self, key: WindowKey) -> None:
        """This rank needs no window before ``key`` any more: say so, and delete what no local reader needs."""
        if key == self._at:
            return
        self._at = key
        try:
            write_private(self.folder / f".at-{self.rank}", f"{key[0]} {key[1]}".encode())
        except FileNotFoundError:  # swept under us: the next window makes the folder again
            return
        _delete_unneeded(self.folder, self.readers)

    def close(self) -> None:
        self._leave()

    @contextmanager
    def _locked(self, key: WindowKey) -> Iterator[None]:
        lock = self.folder / f"{key[0]}-{key[1]}.lock"
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(lock, flags, 0o600)
        except FileNotFoundError:  # the folder was swept (its creator exited first): make it again
            if self._closed.is_set():
                raise
            _make(self.folder)
            fd = os.open(lock, flags, 0o600)
        try:
            pause, deadline = 0.001, time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:  # the holder hangs (or is stopped): read it without the lock
                        print(
                            f"[rank {self.rank}] waited {LOCK_WAIT_S:.0f} s for window {key} of the node's shard cache "
                            f"({self.folder}): fetching it from the store itself",
                            file=sys.stderr,
                            flush=True,
                        )
                        break
                    time.sleep(pause)
                    pause = min(2 * pause, 0.02)
            yield
        finally:
            os.close(fd)  # releases the lock


def _make(folder: Path) -> None:
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        return
    write_owner(folder)


def _npy_bytes(rows: np.ndarray) -> memoryview:
    """The ``.npy`` file of ``rows``, as a view of its buffer (no second copy of a window in memory)."""
    out = io.BytesIO()
    np.save(out, np.ascontiguousarray(rows), allow_pickle=False)
    return out.getbuffer()


def _marks(folder: Path) -> list[WindowKey | None]:
    """Each local reader's oldest needed window (None: done)."""
    marks: list[WindowKey | None] = []
    for path in folder.glob(".at-*"):
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        marks.append(None if text == _DONE else tuple(int(v) for v in text.split()))  # type: ignore[misc]
    return marks


def _delete_unneeded(folder: Path, readers: int) -> None:
    """Delete the windows below every local reader's oldest needed one (none until every reader said)."""
    marks = _marks(folder)
    live = [m for m in marks if m is not None]
    if len(marks) < readers or not live:
        return
    low = min(live)
    for path in folder.iterdir():
        match = _WINDOW_FILE.fullmatch(path.name)
        if match and (int(match[1]), int(match[2])) < low:
            path.unlink(missing_ok=True)


def _leave(folder: Path, rank: int, readers: int, top: Path, closed: threading.Event) -> None:
    """This reader is done: the last of the node's readers removes the folder; the others let it shrink."""
    closed.set()
    try:
        write_private(folder / f".at-{rank}", _DONE.encode())
        marks = _marks(folder)
        if len(marks) >= readers and all(m is None for m in marks):
            remove_job_folder(folder, top)
        else:
            _delete_unneeded(folder, readers)
    except OSError:  # already removed (a peer's last leave, or a sweep): nothing left to do
        pass
