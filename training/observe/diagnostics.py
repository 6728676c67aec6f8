"""What each rank was doing when a job stalled: heartbeats, stacks and collective flight records.

- ``Heartbeats``: the watchdog thread publishes this rank's step and phase to the job's c10d
  key-value store whenever they change, off the training thread. Under torch.distributed.elastic
  (torchrun, Flyte's ``Elastic``, ``training.launch``) MASTER_ADDR:MASTER_PORT is the agent's
  rendezvous store (``TORCHELASTIC_USE_AGENT_STORE``), which outlives every rank; the keys carry
  the restart count, so that a restarted job does not read the last attempt's heartbeats. A rank
  that stops (SIGSTOP, a hung kernel, a deadlock) keeps its last heartbeat, so its peers can name
  it: a rank behind the others did not arrive.
- ``write_diagnostics``: this rank's Python stacks (faulthandler, every thread, after the
  traceback of the failure if there is one) and, where the backend records them
  (``TORCH_FR_BUFFER_SIZE``), the collective flight recorder's dumps as JSON, stored under
  ``<run>/diagnostics/``: ``rank_NNNNN.flight_recorder.json`` for the gloo groups (the CPU
  backend, and the checkpoint group on GPUs) and ``rank_NNNNN.flight_recorder.nccl.json`` for
  NCCL's. Each entry is one collective this rank entered: its process group, sequence number
  (``collective_seq_id``, per group), op (``profiling_name``) and sizes; compare the ranks' last
  sequence numbers per group to see who fell behind. NCCL's entries also say whether each
  collective completed; gloo's (torch 2.13) stay ``scheduled``, and its ``pg_status`` counts the
  collective that timed out as completed: there the last entry is the one that hung.
"""

from __future__ import annotations

import faulthandler
import json
import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from common.contracts import diagnostics_prefix
from training.observe.timing import PHASES

FLIGHT_RECORDER_ENTRIES = "2000"
"""Collectives the flight recorder keeps per process group (``TORCH_FR_BUFFER_SIZE``)."""

STORE_TIMEOUT_S = 3
"""How long a heartbeat read or write may wait for the store: diagnostics must not become a hang."""


def _key(rank: int) -> str:
    # The agent's store lives across restarts of the workers: one namespace per attempt.
    return f"pretrain/heartbeat/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{rank}"


def enable_flight_recorder() -> None:
    """Before the process group is created: ask the backend to keep its recent collectives."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", FLIGHT_RECORDER_ENTRIES)


def _store_client():
    """A client of the job's c10d store (MASTER_ADDR:MASTER_PORT), or None outside a launcher.

    A client of its own rather than the process group's store: the training thread may be blocked
    in a store operation of its own (a barrier) when the heartbeats are written or read.
    """
    import torch.distributed as dist

    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        return None
    timeout = timedelta(seconds=STORE_TIMEOUT_S)
    return dist.TCPStore(addr, int(port), is_master=False, timeout=timeout, wait_for_workers=False)


class Heartbeats:
    """Publishes and reads every rank's (step, phase). Failures are ignored: diagnostics must never
    be what stops training."""

    RETRY_S = 30.0
    """After a failed connection, how long to do without the store: each attempt may block the
    watchdog thread for ``STORE_TIMEOUT_S``, and that thread must keep watching."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._client = None
        self._last = None
        self._retry_at = 0.0

    def _connected(self):
        if self._client is None and time.monotonic() >= self._retry_at:
            try:
                self._client = _store_client()
            except Exception:  # noqa: BLE001 - no store to talk to: try again later
                self._retry_at = time.monotonic() + self.RETRY_S
        return self._client

    def _lost(self) -> None:
        self._client = None
        self._retry_at = time.monotonic() + self.RETRY_S

    def publish(self, step: int, phase: str) -> None:
        """Tell the store where this rank is, if that changed since the last call. The time is that
        of the change: a rank that stops keeps saying when it was last seen moving."""
        if (step, phase) == self._last:
            return
        client = self._connected()
        if client is None:
            return
        try:
            client.set(_key(self.rank), json.dumps({"step": step, "phase": phase, "time": time.time()}))
            self._last = (step, phase)
        except Exception:  # noqa: BLE001 - a store that is gone: the peers will say so
            self._lost()

    def read(self, world_size: int) -> dict[int, dict]:
        """Every rank's last heartbeat, through this object's client (one thread only)."""
        client = self._connected()
        if client is None:
            return {}
        try:
            return _read(client, world_size)
        except Exception:  # noqa: BLE001
            self._lost()
            return {}


def _read(client, world_size: int) -> dict[int, dict]:
    if client is None:
        return {}
    keys = {r: _key(r) for r in range(world_size)}
    present = [r for r, key in keys.items() if client.check([key])]
    return {r: json.loads(client.get(keys[r])) for r in present}


def read_heartbeats(world_size: int) -> dict[int, dict]:
    """Every rank's last heartbeat that can be read; {} without a store (a fresh client: called
    from the failing thread, while the watchdog thread may be using its own)."""
    try:
        return _read(_store_client(), world_size)
    except Exception:  # noqa: BLE001
        return {}


def _order(beat: dict) -> tuple[int, int]:
    phase = beat.get("phase", "")
    return beat.get("step", 0), PHASES.index(phase) if phase in PHASES else -1


def missing_ranks(beats: dict[int, dict], world_size: int) -> list[int]:
    """Ranks behind the furthest one (an earlier step, or an earlier phase of the same step), and
    ranks that never sent a heartbeat: the ones the others are waiting for."""
    if not beats:
        return []
    furthest = max(_order(b) for b in beats.values())
    return [r for r in range(world_size) if r not in beats or _order(beats[r]) < furthest]


def describe_ranks(beats: dict[int, dict], ranks: list[int]) -> str:
    """'rank 1 (last seen in step 3 forward_backward, 12 s ago), rank 2 (no heartbeat)'."""
    now = time.time()
    parts = []
    for r in ranks:
        b = beats.get(r)
        parts.append(
            f"rank {r} (no heartbeat)"
            if b is None
            else f"rank {r} (last seen in step {b['step']} {b['phase']}, {now - b['time']:.0f} s ago)"
        )
    return ", ".join(parts)


def write_diagnostics(store, run: str, rank: int, reason: str) -> list[str]:
    """Store this rank's stacks and flight-recorder dumps; returns their URLs (none if the store fails).

    ``reason`` heads the stacks file (with the failure's traceback, if any: see ``Progress.diagnostics``).
    """
    urls = []
    prefix = diagnostics_prefix(run)
    with tempfile.TemporaryDirectory(prefix="pretrain-diag-") as tmp:
        stacks = Path(tmp) / "stacks.txt"
        with stacks.open("w") as f:
            f.write(f"rank {rank}: {reason.rstrip()}\n\nEvery thread of rank {rank} now (faulthandler):\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        files = {f"rank_{rank:05d}.stacks.txt": stacks}
        for suffix, dump in flight_records().items():
            path = Path(tmp) / f"fr{suffix}"
            path.write_bytes(dump)
            files[f"rank_{rank:05d}.flight_recorder{suffix}"] = path
        for name, path in files.items():
            try:
                store.put_file(f"{prefix}/{name}", path)
                urls.append(store.url(f"{prefix}/{name}"))
            except Exception:  # noqa: BLE001 - the store may be what failed
                pass
    return urls


def flight_records() -> dict[str, bytes]:
    """This process's collective flight-recorder dumps as JSON, by file suffix: '.json' for gloo's
    recorder, '.nccl.json' for NCCL's. Empty when the recorder is off (``TORCH_FR_BUFFER_SIZE``),
    when torch has none for a backend (NCCL's exists only in CUDA builds) or when it recorded
    nothing: a dump that is not there is skipped, never an error."""
    if os.environ.get("TORCH_FR_BUFFER_SIZE", "0") in ("", "0"):
        return {}
    try:
        import torch._C._distributed_c10d as c10d
    except ImportError:  # torch without distributed support
        return {}
    dumps = {}
    for suffix, name in ((".json", "_dump_fr_trace_json"), (".nccl.json", "_dump_nccl_trace_json")):
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        try:
            data = dump()  # the defaults: every collective, completed or not
            if json.loads(data).get("entries"):
                dumps[suffix] = data
        except Exception:  # noqa: BLE001 - a recorder that cannot dump: the stacks still go
            continue
    return dumps
