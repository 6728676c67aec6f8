"""Training batches streamed from a dataset's WebDataset shards (local or S3).

The global sample order is a pure function of (dataset version, seed, position):

- epoch ``e`` visits the shards in a seeded permutation, cut into *windows* of
  ``window_shards`` consecutive shards;
- inside a window the rows are shuffled by a permutation seeded with (seed, epoch, window);
- global position ``p`` lies in epoch ``p // rows``; optimizer step ``s`` consumes positions
  ``[s·G, (s+1)·G)`` and a data-parallel rank takes its contiguous slice of them.

The manifest's per-shard ``sequences`` counts locate a position without reading anything,
so a rank loads only the windows its slice touches, and the same step sees the same rows
whatever the data-parallel size. Memory holds the current window and the prefetched ones
(``(1 + prefetch_windows) × window_shards`` shards); a background thread reads ahead in
consumption order so that a step rarely waits. The loader's state is the number of samples
consumed (step × G), saved in checkpoints; a resume continues the exact sequence.

Who reads (``Reading``, from megatron's groups): only the first tensor-parallel rank of the first
pipeline stage of each data-parallel replica; it broadcasts each batch to the rest of its
model-parallel group, which read nothing. The reading ranks of a node fetch each window once for
the node (``training.shard_cache``: the first one fetches, checks and writes it, the others map it).
The loader counts the bytes it fetched from the store and read from the node's cache, per epoch.
A blend of datasets (one loader per component, interleaved by weight) is ``training.blend``'s.
"""

from __future__ import annotations

import hashlib
import os
import queue
import socket
import sys
import threading
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from common.contracts import DatasetRef
from common.errors import UserError
from data_prep import shards as shard_files
from data_prep.errors import DataError
from data_prep.manifest import load_manifest, stored_shards
from data_prep.shards import read_rows
from storage import Store, open_store
from training.shard_cache import NodeCache, WindowKey

LOADER_FORMAT = "shard-window-v1"


class LoaderStateError(UserError, ValueError):
    """A checkpoint's loader state that this loader cannot continue."""


def load_split(ref: DatasetRef, split: str) -> tuple[np.ndarray, dict]:
    """All rows of a split (``[rows, seq_len + 1]``) and the manifest: for the small validation split.
    Each shard's sha256 is checked against the manifest before its rows are used."""
    store = open_store(ref.store)
    manifest = load_manifest(store, ref)
    rows = read_rows(stored_shards(store, ref, manifest, split))
    entries = manifest["splits"][split]["shards"]
    if any("excluded" in e for e in entries):  # a blend's: the rows it leaves out, shard by shard
        starts = np.cumsum([0, *(int(e["sequences"]) for e in entries)])
        rows = np.delete(rows, [int(starts[i]) + r for i, e in enumerate(entries) for r in e.get("excluded", ())], axis=0)
    return rows, manifest


@dataclass(frozen=True)
class Shard:
    url: str
    sequences: int
    sha256: str | None = None
    """The manifest's digest, checked before the shard's rows are used (``for_split`` always sets it)."""
    excluded: tuple[int, ...] = ()
    """Rows a blend leaves out (duplicates of an earlier component's documents: ``data_prep.dedup_across``)."""

    @property
    def kept(self) -> int:
        """The rows read from it."""
        return self.sequences - len(self.excluded)

    def row_in_shard(self, kept_index: int) -> int:
        """The shard's own index of its ``kept_index``-th kept row."""
        return int(np.delete(np.arange(self.sequences), self.excluded)[kept_index]) if self.excluded else kept_index


@dataclass
class Batch:
    tokens: torch.Tensor
    """This rank's rows of the step, ``[rows, seq_len + 1]``, int64."""
    wait_s: float
    """Seconds spent blocked on shard reads for this batch (0 when prefetch kept up)."""


@dataclass(frozen=True)
class Reading:
    """Which ranks of a job read shards, and what they share. The default: a rank alone, that reads."""

    rank: int = 0
    reads: bool = True
    """False: a model-parallel peer of the rank that reads; it reads nothing, its batches come from ``source``."""
    peers: Any = None
    """The model-parallel group in which the reader broadcasts each batch (None: a group of one)."""
    source: int = 0
    """The global rank that reads this rank's batches (itself where ``reads``)."""
    job: str = ""
    """The job's id (rank 0's), the same on every rank: it names the node caches."""
    node: str = "0"
    """This rank's node: torch elastic's ``GROUP_RANK``."""
    local_readers: int = 1
    """The reading ranks on this node: more than one share the node's cache."""

    @property
    def node_cache(self) -> bool:
        return self.reads and self.local_readers > 1

    @classmethod
    def of_job(cls) -> Reading:
        """Collective over the world (every rank calls it, after megatron's groups exist if they will):
        the first tensor-parallel rank of the first pipeline stage of each model-parallel group reads;
        a node is the ranks of one host with the same ``GROUP_RANK`` (so one machine can play several)."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return cls()
        # Megatron's groups exist only where something imported it: no import of megatron for a loader alone.
        ps = sys.modules.get("megatron.core.parallel_state")
        layout = ps is not None and ps.model_parallel_is_initialized()
        reads = not layout or (ps.get_tensor_model_parallel_rank() == 0 and ps.get_pipeline_model_parallel_rank() == 0)
        node = f"{socket.gethostname()}/{os.environ.get('GROUP_RANK', '0')}"
        mine = {"reads": reads, "node": node, "job": uuid.uuid4().hex}
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        rank = dist.get_rank()
        peers, source = None, rank
        if layout and dist.get_world_size(group := ps.get_model_parallel_group()) > 1:
            sources = [r for r in dist.get_process_group_ranks(group) if everyone[r]["reads"]]
            if len(sources) != 1:
                raise RuntimeError(f"model-parallel group of rank {rank} has readers {sources}, not one")
            peers, source = group, sources[0]
        local = sum(1 for r in everyone if r["reads"] and r["node"] == node)
        return cls(rank, reads, peers, source, everyone[0]["job"], os.environ.get("GROUP_RANK", "0"), local)


def split_shards(store: Store, ref: DatasetRef, manifest: dict, split: str) -> list[Shard]:
    """The split's shards with their row counts and digests, in the manifest's order."""
    entries = manifest["splits"][split]["shards"]
    stored = stored_shards(store, ref, manifest, split)
    shards = [
        Shard(s.url, int(e["sequences"]), s.sha256, tuple(e.get("excluded", ()))) for s, e in zip(stored, entries, strict=True)
    ]
    return [shard for shard in shards if shard.kept > 0]  # a shard a blend leaves out whole is not read


def step_positions(global_batch_size: int, step: int, dp_rank: int = 0, dp_size: int = 1) -> np.ndarray:
    """Global positions of a data-parallel rank's contiguous slice of step ``step``: ``[s·G, (s+1)·G)`` cut in ``dp_size``."""
    if global_batch_size % dp_size:
        raise ValueError(f"global batch {global_batch_size} does not split over {dp_size} data-parallel ranks")
    per_rank = global_batch_size // dp_size
    first = step * global_batch_size + dp_rank * per_rank
    return np.arange(first, first + per_rank, dtype=np.int64)


def shared_batch(reading: Reading, rows: int, row_len: int, read: Callable[[], Batch]) -> Batch:
    """A batch of ``rows`` rows on every rank of ``reading``'s model-parallel group: ``read()`` by its reader,
    broadcast to the others (a collective of the group; any loader's). A status goes first, so that a reader's
    error (a shard refused, say) fails its peers at once, named."""
    import torch.distributed as dist

    group, source = reading.peers, reading.source
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")
    status = torch.zeros(1, dtype=torch.int64, device=device)
    if reading.reads:
        try:
            batch = read()
        except Exception as e:
            status += 2 if isinstance(e, UserError) else 1
            dist.broadcast(status, source, group)
            dist.broadcast_object_list([f"{type(e).__name__}: {e}"], source, group)
            raise
        dist.broadcast(status, source, group)
        dist.broadcast(batch.tokens.to(device), source, group)
        return batch
    t0 = time.perf_counter()
    dist.broadcast(status, source, group)
    if failed := int(status.item()):
        message: list[Any] = [None]
        dist.broadcast_object_list(message, source, group)
        text = f"rank {source}, which reads this rank's batches, failed: {message[0]}"
        raise DataError(text) if failed == 2 else RuntimeError(text)
    tokens = torch.empty((rows, row_len), dtype=torch.int64, device=device)
    dist.broadcast(tokens, source, group)
    return Batch(tokens=tokens.cpu(), wait_s=time.perf_counter() - t0)


class ShardOrder:
    """Where each global position lies: (epoch, window) and the row inside the window's shuffled rows."""

    def __init__(self, counts: list[int], seed: int, version: str, window_shards: int) -> None:
        if not counts or min(counts) <= 0:
            raise ValueError(f"every shard needs at least one sequence, got counts {counts}")
        if window_shards < 1:
            raise ValueError(f"window_shards must be ≥ 1, got {window_shards}")
        self.counts = np.asarray(counts, dtype=np.int64)
        self.rows = int(self.counts.sum())
        self.window_shards = window_shards
        # The dataset version in the seed: two datasets of the same shape get different orders.
        self._entropy = [seed, int(hashlib.sha256(version.encode()).hexdigest()[:16], 16)]
        self._plans: OrderedDict[int, tuple[list[np.ndarray], np.ndarray]] = OrderedDict()
        self._plans_lock = threading.Lock()  # the training thread and the reader both ask for plans

    def _plan(self, epoch: int) -> tuple[list[np.ndarray], np.ndarray]:
        """The epoch's windows (shard indices, in reading order) and their cumulative row starts."""
        with self._plans_lock:
            plan = self._plans.get(epoch)
            if plan is None:
                shard_order = np.random.default_rng([*self._entropy, epoch, 0]).permutation(len(self.counts))
                windows = [shard_order[i : i + self.window_shards] for i in range(0, len(shard_order), self.window_shards)]
                starts = np.concatenate([[0], np.cumsum([self.counts[w].sum() for w in windows])])
                plan = self._plans[epoch] = (windows, starts)
                while len(self._plans) > 2:  # positions only move forward: keep this epoch and the next
                    self._plans.popitem(last=False)
            return plan

    def windows(self, epoch: int) -> int:
        return len(self._plan(epoch)[0])

    def shards_of(self, key: WindowKey) -> np.ndarray:
        return self._plan(key[0])[0][key[1]]

    def row_permutation(self, key: WindowKey) -> np.ndarray:
        size = int(self.counts[self.shards_of(key)].sum())
        return np.random.default_rng([*self._entropy, key[0], 1, key[1]]).permutation(size)

    def locate(self, positions: np.ndarray) -> list[tuple[WindowKey, np.ndarray]]:
        """Group consecutive ``positions`` by window: ``[(key, rows inside the window), …]``."""
        groups: list[tuple[WindowKey, list[int]]] = []
        for p in positions.tolist():
            epoch, offset = divmod(p, self.rows)
            _, starts = self._plan(epoch)
            w = int(np.searchsorted(starts, offset, side="right") - 1)
            key = (epoch, w)
            if not groups or groups[-1][0] != key:
                groups.append((key, []))
            groups[-1][1].append(offset - int(starts[w]))
        return [(key, np.asarray(rows, dtype=np.int64)) for key, rows in groups]

    def next_key(self, key: WindowKey) -> WindowKey:
        epoch, w = key
        return (epoch, w + 1) if w + 1 < self.windows(epoch) else (epoch + 1, 0)


class StepBatches:
    """A step's global batch cut among data-parallel ranks and shared with model-parallel peers, for any loader
    with ``global_batch_size``, ``reading``, ``row_len`` and ``rows_at`` (``StreamingLoader``, ``BlendedLoader``)."""

    global_batch_size: int
    reading: Reading
    row_len: int

    def rows_at(self, positions: np.ndarray) -> Batch:
        raise NotImplementedError

    def positions(self, step: int, dp_rank: int = 0, dp_size: int = 1) -> np.ndarray:
        """Global positions of this rank's slice of step ``step``."""
        return step_positions(self.global_batch_size, step, dp_rank, dp_size)

    def batch(self, step: int, dp_rank: int = 0, dp_size: int = 1) -> Batch:
        """This data-parallel rank's contiguous slice of step ``step``'s global batch. With model-parallel
        peers, a collective of the group: its reader reads and broadcasts, the others receive."""
        positions = self.positions(step, dp_rank, dp_size)
        if self.reading.peers is None:
            return self.rows_at(positions)
        return shared_batch(self.reading, len(positions), self.row_len, lambda: self.rows_at(positions))


class StreamingLoader(StepBatches):
    """This rank's share of each step's global batch, streamed window by window from the shards."""

    def __init__(
        self,
        shards: list[Shard],
        global_batch_size: int,
        seed: int,
        version: str = "",
        window_shards: int = 4,
        prefetch_windows: int = 1,
        reading: Reading | None = None,
        row_len: int = 0,
        split: str = "",
    ) -> None:
        """``reading``: who reads (default: this rank alone); ``row_len`` (``seq_len + 1``): the rows' width,
        which a peer that reads nothing must know; ``split`` names the node cache with ``version``."""
        self.shards = shards
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.version = version
        self.window_shards = window_shards
        self.prefetch_windows = prefetch_windows
        self.reading = reading or Reading()
        self.row_len = row_len
        if self.reading.peers is not None and row_len <= 0:
            raise ValueError("a loader whose batches are broadcast to model-parallel peers needs row_len (seq_len + 1)")
        self.order = ShardOrder([s.kept for s in shards], seed, version, window_shards)
        self.store_bytes: Counter[int] = Counter()
        """Bytes this rank fetched from the store, per epoch (the prefetch of the next epoch counts in that epoch)."""
        self.cache_bytes: Counter[int] = Counter()
        """Bytes of windows this rank read from the node's cache (fetched by another rank of the node), per epoch."""
        self.cache: NodeCache | None = None
        if self.reading.node_cache:
            name = f"{version[:16] or 'dataset'}-{split or 'split'}-{self.reading.job[:12]}-node{self.reading.node}"
            self.cache = NodeCache.open(name, self.reading.rank, self.reading.local_readers)
        self._windows: dict[WindowKey, Future[np.ndarray]] = {}
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[WindowKey, Future] | None] = queue.SimpleQueue()
        self._reader: threading.Thread | None = None  # started by the first read: a peer never reads

    @classmethod
    def for_split(cls, ref: DatasetRef, split: str, global_batch_size: int, seed: int, **kwargs) -> tuple[StreamingLoader, dict]:
        """The loader of a split and the dataset manifest (``kwargs``: the constructor's, ``reading`` among them)."""
        store = open_store(ref.store)
        manifest = load_manifest(store, ref)
        return cls.of_manifest(store, ref, manifest, split, global_batch_size, seed, **kwargs), manifest

    @classmethod
    def of_manifest(
        cls, store: Store, ref: DatasetRef, manifest: dict, split: str, global_batch_size: int, seed: int, **kwargs
    ) -> StreamingLoader:
        """``for_split`` with the manifest already loaded (and checked) from ``store``."""
        kwargs = {"row_len": int(manifest["seq_len"]) + 1, "split": split, **kwargs}
        return cls(split_shards(store, ref, manifest, split), global_batch_size, seed, ref.version, **kwargs)

    # -- order: positions and batch are StepBatches'; rows_at reads them -----------------
    def rows_at(self, positions: np.ndarray) -> Batch:
        """The rows at increasing global ``positions``; reads ahead of the last one."""
        if not self.reading.reads:
            raise RuntimeError(f"rank {self.reading.rank} reads no shards: its batches come from rank {self.reading.source}")
        groups = self.order.locate(positions)
        waited = 0.0
        parts = []
        for key, rows in groups:
            future = self._request(key)
            t0 = time.perf_counter()
            window = future.result()
            waited += time.perf_counter() - t0
            parts.append(window[rows])
        self._forget_before(groups[0][0])
        if self.cache is not None:
            self.cache.advance(groups[0][0])
        key = groups[-1][0]
        for _ in range(self.prefetch_windows):
            key = self.order.next_key(key)
            self._request(key)
        return Batch(tokens=torch.from_numpy(np.concatenate(parts).astype(np.int64)), wait_s=waited)

    def origin(self, step: int) -> dict:
        """Where step ``step``'s global batch came from: each shard's URL and the rows read from it
        (indices inside the shard), so a bad batch can be inspected."""
        return {"step": step + 1, "shards": self.shards_at(self.positions(step))}

    def shards_at(self, positions: np.ndarray) -> list[dict]:
        """The shards and rows (indices inside each shard) that hold the rows at increasing ``positions``."""
        shards: dict[int, list[int]] = {}
        for key, rows in self.order.locate(positions):
            members = self.order.shards_of(key)
            starts = np.cumsum([0, *self.order.counts[members]])
            for index in self.order.row_permutation(key)[rows].tolist():
                at = int(np.searchsorted(starts, index, side="right") - 1)
                shard = int(members[at])
                shards.setdefault(shard, []).append(self.shards[shard].row_in_shard(index - int(starts[at])))
        return [{"shard": self.shards[i].url, "rows": sorted(rows)} for i, rows in shards.items()]

    # -- state ------------------------------------------------------------------------
    def state_dict(self, step: int) -> dict:
        """What a checkpoint records: enough to check that a resume continues the same sequence."""
        return {
            "format": LOADER_FORMAT,
            "dataset": self.version,
            "seed": self.seed,
            "window_shards": self.window_shards,
            "global_batch_size": self.global_batch_size,
            "consumed_samples": step * self.global_batch_size,
        }

    def check_resume(self, state: dict, step: int) -> None:
        """Raise unless ``state`` (from a checkpoint at ``step``) continues this loader's sequence."""
        expected = self.state_dict(step)
        diff = {k: (state.get(k), v) for k, v in expected.items() if state.get(k) != v}
        if diff:
            details = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in diff.items())
            raise LoaderStateError(f"the checkpoint's data order cannot be continued ({details})")

    # -- reading ----------------------------------------------------------------------
    def _request(self, key: WindowKey) -> Future[np.ndarray]:
        with self._lock:
            if self._reader is None:
                # A daemon: a read stuck on a dead store must never keep a failed rank from exiting.
                self._reader = threading.Thread(target=self._read_loop, name="shard-prefetch", daemon=True)
                self._reader.start()
            if key not in self._windows:
                self._windows[key] = Future()
                self._queue.put((key, self._windows[key]))
            return self._windows[key]

    def _forget_before(self, key: WindowKey) -> None:
        with self._lock:
            for old in [k for k in self._windows if k < key]:
                self._windows.pop(old).cancel()  # no-op once read

    def _read_loop(self) -> None:
        while (job := self._queue.get()) is not None:
            key, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self._read_window(key))
            except BaseException as e:  # noqa: BLE001 - handed to the step that needs the window
                future.set_exception(e)

    def _read_window(self, key: WindowKey) -> np.ndarray:
        """The window's rows, shuffled: from the node's cache where the node shares one, else fetched."""
        if self.cache is None:
            return self._build_window(key)
        window, built = self.cache.window(key, lambda: self._build_window(key))
        rows = int(self.order.counts[self.order.shards_of(key)].sum())
        if window.ndim != 2 or len(window) != rows:
            raise RuntimeError(f"the node cache's window {key} in {self.cache.folder} holds {window.shape}, not {rows} rows")
        if not built:
            self.cache_bytes[key[0]] += window.nbytes
        return window

    def _build_window(self, key: WindowKey) -> np.ndarray:
        arrays = [self._read_shard(self.shards[i], key[0]) for i in self.order.shards_of(key)]
        return np.concatenate(arrays)[self.order.row_permutation(key)]

    def _read_shard(self, shard: Shard, epoch: int) -> np.ndarray:
        """``data_prep.shards.read_shard``, counting the bytes fetched: the whole shard from the store, its
        sha256 checked against the manifest's before a byte of it is parsed (unchecked only without one)."""
        data = shard_files._read_bytes(shard.url)
        self.store_bytes[epoch] += len(data)
        if shard.sha256 is not None:
            shard_files.check_digest(data, shard.url, shard.sha256)
        rows = shard_files.parse_shard(data, shard.url)
        if len(rows) != shard.sequences:
            raise ValueError(f"shard {shard.url} holds {len(rows)} sequences, the manifest says {shard.sequences}")
        return np.delete(rows, shard.excluded, axis=0) if shard.excluded else rows

    def wait_idle(self) -> None:
        """Let in-flight reads finish (before something forks, e.g. a checkpoint's writer processes)."""
        with self._lock:
            pending = list(self._windows.values())
        for future in pending:
            future.exception()  # waits; an error is raised later, by the batch that needs it

    def close(self) -> None:
        with self._lock:
            for future in self._windows.values():
                future.cancel()
            self._windows.clear()
        self._queue.put(None)
        if self.cache is not None:
            self.cache.close()

    def __enter__(self) -> StreamingLoader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
