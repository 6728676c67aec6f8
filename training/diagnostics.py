"""What each rank was doing when a job stalled: heartbeats, stacks and collective flight records.

- ``Heartbeats``: the watchdog thread publishes this rank's step and phase to the job's c10d
  key-value store (the rendezvous store, which outlives any one rank) whenever it changes, off
  the training thread. A rank that stops (SIGSTOP, a hung kernel, a deadlock) keeps its last
  heartbeat, so its peers can name it: a rank behind the others did not arrive.
- ``write_diagnostics``: this rank's Python stacks (faulthandler, every thread) and, where the
  backend records them (``TORCH_FR_BUFFER_SIZE``; NCCL and gloo), the collective flight
  recorder's dump as JSON, stored under ``<run>/diagnostics/``.
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
from training.timing import PHASES

FLIGHT_RECORDER_ENTRIES = "2000"
"""Collectives the flight recorder keeps per process group (``TORCH_FR_BUFFER_SIZE``)."""

_KEY = "pretrain/heartbeat/"


def enable_flight_recorder() -> None:
    """Before the process group is created: ask the backend to keep its recent collectives."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", FLIGHT_RECORDER_ENTRIES)


def _store_client():
    """A client of the job's c10d store (MASTER_ADDR:MASTER_PORT), or None outside a launcher."""
    import torch.distributed as dist

    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        return None
    return dist.TCPStore(addr, int(port), is_master=False, timeout=timedelta(seconds=5), wait_for_workers=False)


class Heartbeats:
    """Publishes and reads every rank's (step, phase). Failures are ignored: diagnostics must never
    be what stops training."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._client = None
        self._last = None

    def publish(self, step: int, phase: str) -> None:
        if (step, phase) == self._last:
            return
        try:
            if self._client is None:
                self._client = _store_client()
            if self._client is not None:
                self._client.set(f"{_KEY}{self.rank}", json.dumps({"step": step, "phase": phase, "time": time.time()}))
                self._last = (step, phase)
        except Exception:  # noqa: BLE001 - a store that is gone: the peers will say so
            self._client = None


def read_heartbeats(world_size: int) -> dict[int, dict]:
    """Every rank's last heartbeat that can be read (a fresh client: called from the failing thread)."""
    try:
        client = _store_client()
        if client is None:
            return {}
        keys = [f"{_KEY}{r}" for r in range(world_size)]
        present = [r for r in range(world_size) if client.check([keys[r]])]
        return {r: json.loads(client.get(keys[r])) for r in present}
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
    """Store this rank's stacks and flight-recorder dump; returns their URLs (none if the store fails)."""
    urls = []
    prefix = diagnostics_prefix(run)
    with tempfile.TemporaryDirectory(prefix="pretrain-diag-") as tmp:
        stacks = Path(tmp) / "stacks.txt"
        with stacks.open("w") as f:
            f.write(f"rank {rank}: {reason}\n\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        files = {f"rank_{rank:05d}.stacks.txt": stacks}
        dump = _flight_recorder()
        if dump is not None:
            (Path(tmp) / "fr.json").write_bytes(dump)
            files[f"rank_{rank:05d}.flight_recorder.json"] = Path(tmp) / "fr.json"
        for name, path in files.items():
            try:
                store.put_file(f"{prefix}/{name}", path)
                urls.append(store.url(f"{prefix}/{name}"))
            except Exception:  # noqa: BLE001 - the store may be what failed
                pass
    return urls


def _flight_recorder() -> bytes | None:
    if os.environ.get("TORCH_FR_BUFFER_SIZE", "0") in ("", "0"):
        return None
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json

        return _dump_fr_trace_json(includeCollectives=True, onlyActive=False)
    except Exception:  # noqa: BLE001 - older torch or a backend without one
        return None
