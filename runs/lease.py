"""A run's lease: one writer of ``runs/<id>/`` at a time.

The run id is a hash of the config, the dataset and the code (``training.train.run_id``), so two
identical executions (two ``pretrain run`` of one config at once, a Flyte retry racing a task
that is not quite dead) train the same run prefix. Without a lease they would trample each
other: ``metrics.jsonl`` rewritten by both, a checkpoint's leftovers deleted while the other
uploads them, keep-pruning of steps the other is about to resume from.

``runs/<id>/lease.json`` names the holder (host, pid, a token) and its heartbeat. It is created
only if absent, refreshed every ``refresh_s`` by a thread with a write conditional on its ETag,
and deleted at the end. A lease is *stale*, and taken over with a write conditional on the ETag
it was read with (so two waiters cannot both take it), when

- its holder is a process of this host that no longer exists (a SIGKILLed run: its rerun must
  not wait), or
- its heartbeat is older than ``stale_s`` by this host's clock, or this waiter has seen the same
  object (ETag) for ``stale_s`` by its own monotonic clock (a holder on another host, its
  clock skewed or not, that stopped refreshing).

Each take of the lease hands out the run's next *sequence* number (``RunLease.sequence``: 1, 2, ...), counted
in ``runs/<id>/lease-sequence.json`` (``{"last": n}``; none: 0) beside it: read, then written n + 1 by the
new holder alone. The goodput ledger orders a run's attempts by it (``runs.ledger``), not by hosts' clocks.

A holder whose refresh finds another ETag lost the lease (it was paused or cut off from the
store for longer than ``stale_s`` and someone took over): ``check`` raises ``LeaseLost``, and
training stops rather than writing on.

Torch-free: the checkpoint manager (``training.checkpointing.manager``) drives it from rank 0 and broadcasts the outcome.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from common.contracts import lease_key, lease_sequence_key
from common.errors import UserError, first_line
from storage import AlreadyCommitted, PreconditionFailed, Store, StoreError

REFRESH_S = 10.0
"""How often the holder rewrites its heartbeat."""
STALE_S = 60.0
"""A heartbeat this old (or an object unchanged this long) means the holder is gone."""
POLL_S = 2.0
"""How often a waiter looks again."""


class LeaseLost(UserError, RuntimeError):
    """Another execution took over this run's lease: this one stops instead of writing on."""


@functools.cache
def boot_id() -> str:
    """This machine's boot (a pid is meaningful only within one boot); '' where unknown."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def this_host() -> str:
    return socket.gethostname()


PID_LIMIT = 2**22
"""Linux's ceiling for ``kernel.pid_max``: a larger pid in a record names no process, it is junk."""


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (one of another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def dead_here(record: dict) -> bool:
    """Whether ``record`` (a lease or staging owner: host, boot, pid) names a process of this
    host and boot that no longer exists."""
    same_machine = record.get("host") == this_host() and record.get("boot", "") == boot_id()
    pid = record.get("pid")
    # A pid no process can have (a record written by hand, or planted) proves nothing: the age rules decide.
    return same_machine and type(pid) is int and 0 < pid <= PID_LIMIT and not pid_alive(pid)


@dataclass
class Holder:
    """Who holds a lease, as read from the store."""

    record: dict
    etag: str
    seen_since: float
    """When this waiter first saw this very object (monotonic clock)."""

    def describe(self) -> str:
        age = time.time() - float(self.record.get("heartbeat", 0))
        return f"pid {self.record.get('pid')} on host {self.record.get('host')} (heartbeat {age:.0f} s ago)"


class RunLease:
    """The lease of run ``run`` (``runs/<id>``) in ``store``, for this process."""

    def __init__(
        self,
        store: Store,
        run: str,
        *,
        refresh_s: float = REFRESH_S,
        stale_s: float = STALE_S,
        poll_s: float = POLL_S,
        log: Callable[[str], None] = lambda line: print(line, flush=True),
    ) -> None:
        self.store, self.run, self.key = store, run, lease_key(run)
        self.refresh_s, self.stale_s, self.poll_s, self.log = refresh_s, stale_s, poll_s, log
        self.token = uuid.uuid4().hex
        self.etag: str | None = None
        self.sequence: int | None = None
        """The run's lease sequence this take handed out (None before, or where the store refused it)."""
        self.acquired_at: float | None = None
        """When this process took the lease (``time.monotonic()``)."""
        self.lost = ""
        """Why this process no longer holds the lease ('' while it does, or never did)."""
        self._seen: Holder | None = None
        self._told = False
        self.heartbeat_failing = False
        """Whether the last heartbeat failed (the store refused or did not answer): said once per streak."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- taking it ------------------------------------------------------------------------
    def _record(self) -> dict:
        return {
            "run": self.run,
            "host": this_host(),
            "boot": boot_id(),
            "pid": os.getpid(),
            "token": self.token,
            "heartbeat": time.time(),
        }

    def _read(self) -> Holder | None:
        try:
            record, etag = self.store.get_json_with_etag(self.key)
        except StoreError:
            if self.store.exists(self.key):
                raise  # there and unreadable: not something to take over blindly
            return None
        except ValueError:
            record, etag = {}, self.store.get_bytes_with_etag(self.key)[1]  # a torn or foreign file: stale by age alone
        if self._seen is not None and self._seen.etag == etag:
            return self._seen
        self._seen = Holder(record if isinstance(record, dict) else {}, etag, time.monotonic())
        return self._seen

    def stale_reason(self, holder: Holder) -> str:
        """Why ``holder`` no longer holds the lease ('' if it may still)."""
        if dead_here(holder.record):
            return f"its process {holder.record['pid']} on this host no longer exists"
        heartbeat = holder.record.get("heartbeat")
        if not isinstance(heartbeat, int | float) or time.time() - heartbeat > self.stale_s:
            return f"its heartbeat is older than {self.stale_s:.0f} s"
        if time.monotonic() - holder.seen_since > self.stale_s:
            return f"it has not refreshed the lease for {self.stale_s:.0f} s"
        return ""

    def _confirm(self) -> bool:
        """Read back what this process wrote: its ETag, for the refreshes (a write returns none)."""
        holder = self._read()
        if holder is None or holder.record.get("token") != self.token:
            return False
        self.etag = holder.etag
        return True

    def _taken(self) -> bool:
        """The lease is this process's: the run's next sequence number is its (best-effort: a store that refuses
        it leaves ``sequence`` None, said in one WARNING line; the ledger then orders this attempt by its start)."""
        self.acquired_at = time.monotonic()
        key = lease_sequence_key(self.run)
        try:
            last = self.store.get_json(key)["last"] if self.store.exists(key) else 0
            if type(last) is not int or last < 0:
                raise ValueError(f"its last number is {last!r}, not a count")
            self.store.put_json(key, {"last": last + 1})  # the holder alone writes it: no condition needed
            self.sequence = last + 1
        except (StoreError, ValueError, TypeError, KeyError) as e:
            self.log(f"WARNING: run {self.run}: its lease sequence {self.store.url(key)} was not advanced ({first_line(e)})")
        return True

    def try_acquire(self) -> bool:
        """Take the lease if it is free or stale (and its next sequence number); False if a live holder has it
        (logged once)."""
        try:
            self.store.put_json(self.key, self._record(), if_absent=True)
            return self._confirm() and self._taken()
        except AlreadyCommitted:
            pass
        holder = self._read()
        if holder is None:
            return False  # released between the create and the read: again at the next poll
        why = self.stale_reason(holder)
        if why:
            try:
                self.store.put_json(self.key, self._record(), if_match=holder.etag)
            except PreconditionFailed:
                return False  # another waiter took it, or the holder refreshed: again at the next poll
            if self._confirm():
                self.log(f"run {self.run}: took over its lease from {holder.describe()}: {why}")
                return self._taken()
            return False
        if not self._told:
            self._told = True
            self.log(
                f"run {self.run} is being trained by {holder.describe()}, lease {self.store.url(self.key)}: "
                "an identical execution (same config, data and code). Waiting for it to finish or go away; "
                "this one then resumes from the latest checkpoint it committed (its final one: nothing left to train)."
            )
        return False

    def acquire(self, timeout_s: float = 0.0) -> None:
        """Block until the lease is held (``timeout_s`` > 0: TimeoutError after that long)."""
        deadline = time.monotonic() + timeout_s
        while not self.try_acquire():
            if timeout_s and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.run}: lease {self.store.url(self.key)} still held after {timeout_s:.0f} s")
            time.sleep(self.poll_s)
        self.start_refreshing()

    # -- keeping it --------------------------------------------------------------------
    def refresh(self) -> bool:
        """Rewrite the heartbeat, conditional on the ETag this process last wrote; False (and
        ``lost`` set) if someone else's lease is there now. A store that does not answer is
        tried again at the next refresh: the lease is lost only to another writer."""
        with self._lock:
            if self.lost or self.etag is None:
                return not self.lost
            try:
                self.store.put_json(self.key, self._record(), if_match=self.etag)
            except PreconditionFailed:
                holder = self._read()
                theirs = holder.describe() if holder is not None else "nobody (it was deleted)"
                self.lost = (
                    f"run {self.run}: its lease {self.store.url(self.key)} is now held by {theirs}: this process was "
                    f"paused or cut off from the store for more than {self.stale_s:.0f} s and an identical execution "
                    "took over. Stopping instead of writing over its checkpoints; nothing is lost: a rerun resumes from "
                    "the latest committed checkpoint"
                )
                self.etag = None
                return False
            except StoreError as e:
                # Not lost (the store may come back, or let the next one through), but said, once per
                # streak: a store or bucket policy that refuses every heartbeat lets an identical
                # execution take the run over after stale_s, and gc judge the lease dead.
                if not self.heartbeat_failing:
                    self.log(
                        f"WARNING: run {self.run}: the heartbeat of its lease {self.store.url(self.key)} failed "
                        f"({first_line(e)}); trying again every "
                        f"{self.refresh_s:.0f} s. If it keeps failing for {self.stale_s:.0f} s, an identical execution "
                        "may take the run over (check the store's permissions for conditional writes of lease.json)"
                    )
                self.heartbeat_failing = True
                return True
            self.heartbeat_failing = False
            if not self._confirm():
                self.lost = f"run {self.run}: its lease {self.store.url(self.key)} changed under this process"
                self.etag = None
            return not self.lost

    def start_refreshing(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.refresh_s):
                if not self.refresh():
                    return

        self._thread = threading.Thread(target=loop, name=f"lease {self.run}", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """Raise LeaseLost if another execution took the lease over."""
        if self.lost:
            raise LeaseLost(self.lost)

    def release(self) -> None:
        """Stop refreshing and delete the lease if it is still this process's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self.etag is None:
                return
            self.etag = None
            try:
                holder = self._read()
                if holder is not None and holder.record.get("token") == self.token:
                    # Not conditional (stores delete unconditionally): a takeover can only follow
                    # a missed heartbeat, and this process refreshed within the last refresh_s.
                    self.store.delete_prefix(self.key)
            except StoreError as e:
                self.log(f"run {self.run}: could not release its lease ({e}); it goes stale in {self.stale_s:.0f} s")
