"""The run lease (runs/lease.py) on a local store and on the S3 test server: one holder at a
time, a waiter that gets it on release, stale leases (dead pid on this host, no heartbeat) taken
over, and a holder that lost it told so instead of writing on."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from common.contracts import lease_key
from runs.lease import LeaseLost, RunLease, boot_id, this_host

RUN = "runs/abc123"
FAST = dict(refresh_s=0.2, stale_s=1.5, poll_s=0.1)


def lease(store, lines: list[str] | None = None, **overrides) -> RunLease:
    sink = lines if lines is not None else []
    return RunLease(store, RUN, **{**FAST, **overrides}, log=sink.append)


@pytest.mark.slow
def test_one_holder_and_the_waiter_gets_it_on_release(store):
    steady = dict(stale_s=30)  # a loaded machine may delay a refresh by seconds: no false takeover here
    first, lines = lease(store, **steady), []
    first.acquire(timeout_s=30)
    holder = store.get_json(lease_key(RUN))
    assert holder["token"] == first.token and holder["host"] == this_host() and holder["pid"] > 0

    second = lease(store, lines, **steady)
    assert not second.try_acquire() and not second.try_acquire()
    assert len(lines) == 1, lines  # said once, not at every poll
    assert "identical execution" in lines[0] and RUN in lines[0] and f"pid {holder['pid']}" in lines[0]

    got = threading.Event()
    waiter = threading.Thread(target=lambda: (second.acquire(timeout_s=60), got.set()))
    waiter.start()
    time.sleep(2)
    assert not got.is_set()
    assert store.get_json(lease_key(RUN))["heartbeat"] > holder["heartbeat"]
    first.release()
    waiter.join(timeout=60)
    assert got.is_set()
    assert store.get_json(lease_key(RUN))["token"] == second.token
    first.check()  # released, not lost
    second.release()
    assert not store.exists(lease_key(RUN))


def test_a_dead_holder_on_this_host_is_taken_over_at_once(store):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    dead = {"run": RUN, "host": this_host(), "boot": boot_id(), "pid": int(gone.stdout), "token": "x", "heartbeat": time.time()}
    store.put_json(lease_key(RUN), dead)
    lines: list[str] = []
    taker = lease(store, lines, stale_s=3600)  # no waiting on the clock: the pid says it
    assert taker.try_acquire()
    assert store.get_json(lease_key(RUN))["token"] == taker.token
    assert "took over" in lines[0] and "no longer exists" in lines[0]


def test_a_holder_without_heartbeat_is_taken_over(store):
    # Another host: its pid means nothing here, only the heartbeat counts.
    old = {"run": RUN, "host": "elsewhere", "boot": "", "pid": 1, "token": "x", "heartbeat": time.time() - 3600}
    store.put_json(lease_key(RUN), old)
    assert lease(store).try_acquire()  # an old heartbeat: at once

    store.delete_prefix(lease_key(RUN))
    store.put_json(lease_key(RUN), {**old, "heartbeat": time.time() + 3600})  # a clock ahead of ours
    lines: list[str] = []
    taker = lease(store, lines)
    start = time.monotonic()
    assert not taker.try_acquire()
    taker.acquire(timeout_s=30)  # the object did not change for stale_s by our own clock
    assert time.monotonic() - start >= FAST["stale_s"]
    assert "took over" in lines[-1] and "not refreshed" in lines[-1]
    taker.release()


def test_a_holder_that_lost_the_lease_stops(store):
    paused = lease(store)
    assert paused.try_acquire()  # holds it, but never refreshes (a process paused past stale_s)
    lines: list[str] = []
    other = lease(store, lines)
    other.acquire(timeout_s=30)
    assert "took over" in lines[-1]

    paused.check()  # nothing noticed yet: it learns at its next refresh
    assert not paused.refresh()
    with pytest.raises(LeaseLost, match="identical execution took over") as info:
        paused.check()
    assert f"pid {store.get_json(lease_key(RUN))['pid']}" in str(info.value)
    paused.release()  # not its lease any more: left alone
    assert store.get_json(lease_key(RUN))["token"] == other.token
    other.release()
