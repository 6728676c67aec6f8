"""Hang diagnostics (issue 16, item 4): a rank that stops or hangs ends the job with an error that
names the step, the phase and the rank that did not arrive, and the ranks that can still run store
their stacks and collective flight records under ``<run>/diagnostics/``.

The two-rank runs are real: ``training.launch.launch`` (torch.distributed.elastic, spawn, c10d
rendezvous), gloo, a local store; one rank is stopped (SIGSTOP) or hangs on purpose
(``tests.helpers.train_with_stall``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from common.contracts import diagnostics_prefix, run_prefix
from common.net import free_port
from storage import open_store
from tests.helpers import ROOT, Stall, fresh_copy, kill_group, start_launch, tiny_model, train_with_stall
from training.config import ParallelConfig, TrainConfig
from training.observe.diagnostics import (
    STORE_TIMEOUT_S,
    Heartbeats,
    describe_ranks,
    flight_records,
    missing_ranks,
    read_heartbeats,
)
from training.observe.watchdog import EXIT_STUCK, Progress, behind

MODEL = tiny_model()
# Never reaches its last step: the stall ends the run.
RUN = TrainConfig(steps=1000, micro_batch_size=4, global_batch_size=8, warmup_steps=2, checkpoint_every=1000, seed=16)


def beat(step: int, phase: str, ago_s: float = 0.0) -> dict:
    return {"step": step, "phase": phase, "time": time.time() - ago_s}


# -- which ranks did not arrive --------------------------------------------------------------------


def test_missing_ranks_are_the_ones_behind_the_furthest():
    level = {0: beat(3, "collective"), 1: beat(3, "collective")}
    assert missing_ranks(level, 2) == []
    assert missing_ranks({0: beat(3, "collective"), 1: beat(2, "optimizer")}, 2) == [1]  # an earlier step
    assert missing_ranks({0: beat(3, "forward_backward"), 1: beat(3, "collective")}, 2) == [0]  # an earlier phase
    assert missing_ranks({0: beat(3, "data"), 1: beat(3, "checkpoint"), 2: beat(3, "optimizer")}, 3) == [0, 2]
    assert missing_ranks({0: beat(4, ""), 1: beat(3, "checkpoint")}, 2) == [1]  # a phase not yet known is the step's start
    # A rank that never sent a heartbeat is missing; with no heartbeats at all nobody can be named.
    assert missing_ranks({0: beat(1, "collective"), 2: beat(1, "collective")}, 4) == [1, 3]
    assert missing_ranks({}, 4) == []


def test_describe_ranks_says_where_and_when_each_rank_was_last_seen():
    beats = {1: beat(3, "forward_backward", ago_s=12.2), 2: beat(2, "optimizer", ago_s=0.4)}
    assert describe_ranks(beats, [1, 3, 2]) == (
        "rank 1 (last seen in step 3 forward_backward, 12 s ago), rank 3 (no heartbeat), "
        "rank 2 (last seen in step 2 optimizer, 0 s ago)"
    )
    assert describe_ranks(beats, []) == ""


def test_behind_uses_this_ranks_live_position_not_its_stored_heartbeat():
    progress = Progress()
    progress.world_size = 3
    stored = {0: beat(2, "optimizer"), 1: beat(3, "data"), 2: beat(3, "collective")}
    assert behind(stored, 0, progress) == []  # before the first step nobody is named
    progress.enter("step 3", 0)
    progress.at(3, "collective")  # rank 0's own heartbeat in the store still says step 2
    assert behind(stored, 0, progress) == [1]
    assert progress.where() == "step 3 (collective)"
    progress.enter("checkpoint save at step 3", 0)
    assert progress.where() == "checkpoint save at step 3"  # nothing known inside it yet
    progress.at(3, "checkpoint")
    assert progress.where() == "checkpoint save at step 3"


# -- heartbeats through a real c10d store -----------------------------------------------------------


@pytest.fixture
def job_store(monkeypatch):
    """A TCPStore server, as the elastic agent hosts one, named by MASTER_ADDR/MASTER_PORT."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    return server


def test_heartbeats_round_trip_through_the_store_and_are_kept_per_restart(job_store, monkeypatch):
    Heartbeats(0).publish(5, "collective")
    Heartbeats(2).publish(4, "data")
    beats = read_heartbeats(3)
    assert sorted(beats) == [0, 2] and beats[0]["step"] == 5 and beats[2]["phase"] == "data"
    assert missing_ranks(beats, 3) == [1, 2]
    # A restarted job (the agent's store lives on) does not see the last attempt's heartbeats.
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert read_heartbeats(3) == {}
    Heartbeats(1).publish(1, "data")
    assert sorted(Heartbeats(0).read(3)) == [1]


def test_no_store_no_heartbeats(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    Heartbeats(0).publish(1, "data")  # nothing to publish to: not an error
    assert read_heartbeats(2) == {}


@pytest.mark.slow
def test_a_store_that_is_gone_costs_one_connection_timeout_then_nothing(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))  # nothing listens there
    beats = Heartbeats(0)
    t0 = time.monotonic()
    beats.publish(1, "data")
    first = time.monotonic() - t0
    t0 = time.monotonic()
    beats.publish(2, "data")  # the watchdog thread polls every second: it must not block each time
    assert beats.read(2) == {} and time.monotonic() - t0 < 0.5
    assert first < 4 * STORE_TIMEOUT_S


def test_flight_records_are_off_without_a_buffer(monkeypatch):
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    assert flight_records() == {}


# A watchdog whose rank waits for a peer that is behind: the peer's own watchdog goes first.
_WAITING = """
import json, os, time
from datetime import timedelta
import torch.distributed as dist
from training.observe.watchdog import Progress, Watchdog
server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(server.port))
server.set("pretrain/heartbeat/0/1", json.dumps({"step": 3, "phase": "data", "time": time.time()}))
p = Progress(); p.world_size = 2
Watchdog(p, rank=0, poll_s=0.1).start()
p.enter("step 3", 1.0); p.at(3, "collective")
t0 = time.monotonic()
try:
    time.sleep(60)
finally:
    print("slept", time.monotonic() - t0)
"""


@pytest.mark.slow
def test_watchdog_of_a_rank_waiting_for_a_peer_behind_it_waits_longer_and_names_the_peer():
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _WAITING], cwd=ROOT, capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - t0
    assert done.returncode == EXIT_STUCK, done.stderr[-3000:]
    message = re.search(
        r"\[rank 0\] watchdog: step 3 \(collective\) has made no progress for (\d+) s \(limit 1 s\): (.*)", done.stderr
    )
    assert message, done.stderr[-3000:]
    # Limit 1 s plus the grace (the limit again): the peer's watchdog would have fired first.
    assert int(message[1]) >= 2 and elapsed < 30
    assert message[2].startswith("waiting for rank 1 (last seen in step 3 data, ")


# -- a stopped rank, a hung rank: real two-rank runs ----------------------------------------------


def diagnostics(dataset) -> tuple[object, dict[str, str]]:
    """The run's store (a fresh one: this test's run only) and its diagnostics files by name."""
    store = open_store(dataset.store)
    runs = {key.split("/")[1] for key in store.list("runs/")}
    assert len(runs) == 1, runs
    prefix = diagnostics_prefix(run_prefix(runs.pop()))
    return store, {key.rsplit("/", 1)[-1]: key for key in store.list(f"{prefix}/")}


def run_stalled(tmp_path, dataset, parallel: ParallelConfig, stall: Stall) -> tuple[int, str, float]:
    """Launch two ranks with ``stall``; the job's exit status, its log and how long it ran."""
    t0 = time.monotonic()
    job = start_launch(tmp_path, train_with_stall, 2, stall, dataset, MODEL, parallel, RUN)
    try:
        code = job.wait(timeout=240)
    finally:
        kill_group(job)  # the launcher and anything left of its ranks
    return code, (tmp_path / "train.log").read_text(errors="replace"), time.monotonic() - t0


@pytest.mark.slow
@pytest.mark.long("a two-rank run that waits out a 10 s collective timeout: 20 s alone, 54-68 s under make test")
def test_a_stopped_rank_is_named_and_the_others_store_their_stacks_and_collective_records(tiny_dataset, tmp_path):
    dataset = fresh_copy(tiny_dataset, tmp_path / "store")
    # Rank 0 waits one collective timeout for the stopped rank 1; no watchdog (stall_timeout_s=0).
    parallel = ParallelConfig(tensor_parallel=1, collective_timeout_s=10, stall_timeout_s=0)
    code, log, elapsed = run_stalled(tmp_path, dataset, parallel, Stall("stop", rank=1, step=3, phase="forward_backward"))
    print(f"job exited {code} after {elapsed:.0f} s")
    assert code != 0, log[-4000:]

    error = re.search(r"^\[rank 0\] (rank 0: a collective with the other ranks failed .*)$", log, re.M)
    assert error, log[-4000:]
    message = error[1]
    print(message)
    assert message.startswith("rank 0: a collective with the other ranks failed during step 3 (collective), "), message
    assert "parallel.collective_timeout_s=10 s" in message
    assert re.search(r"did not arrive: rank 1 \(last seen in step 3 forward_backward, \d+ s ago\);", message), message
    assert "PeerFailure: rank 0: a collective" in log  # what the launcher reports as the job's error

    store, files = diagnostics(dataset)
    print("diagnostics:", sorted(files))
    # Rank 1 was stopped: it could store nothing. Rank 0 stored its stacks and its flight records.
    assert sorted(files) == ["rank_00000.flight_recorder.json", "rank_00000.stacks.txt"], files
    assert store.url(files["rank_00000.stacks.txt"]) in message  # the error says where they are
    stacks = store.get_bytes(files["rank_00000.stacks.txt"]).decode()
    assert stacks.startswith("rank 0: collective failed during step 3 (collective): "), stacks[:500]
    # Where the training thread was when the collective timed out: the loss's all-reduce in its step...
    failed_at = stacks[stacks.index("Where the training thread failed") : stacks.index("Every thread of rank 0 now")]
    assert "in _train" in failed_at and "in mean_over_data_parallel" in failed_at and "all_reduce" in failed_at, failed_at
    # ...and every thread now (faulthandler): the watchdog thread too.
    assert re.search(r"Thread 0x[0-9a-f]+ .*\n(  File .*\n)*  File .*watchdog\.py.* in _watch", stacks), stacks

    records = json.loads(store.get_bytes(files["rank_00000.flight_recorder.json"]))
    last = records["entries"][-1]
    # The last collective rank 0 entered is the one that timed out: step 3's first, the all-reduce of
    # the scalar loss over the data-parallel group (the 5th there: steps 1 and 2 each reduced the loss
    # and the gradients). On gloo every entry stays 'scheduled': completion is not recorded.
    assert last["profiling_name"] == "gloo:all_reduce" and last["process_group"][1] == "DATA_PARALLEL_GROUP", last
    assert last["input_sizes"] == [[]] and last["collective_seq_id"] == 5, last


@pytest.mark.slow
def test_a_rank_hung_outside_collectives_is_ended_by_its_watchdog_with_its_stacks_stored(tiny_dataset, tmp_path):
    dataset = fresh_copy(tiny_dataset, tmp_path / "store")
    # Rank 1 hangs reading step 3's batch; rank 0 waits in the step's first collective (a long
    # collective timeout, so that only the watchdogs can end the run).
    parallel = ParallelConfig(tensor_parallel=1, collective_timeout_s=600, stall_timeout_s=8)
    code, log, elapsed = run_stalled(tmp_path, dataset, parallel, Stall("hang", rank=1, step=3, phase="data"))
    print(f"job exited {code} after {elapsed:.0f} s")
    assert code != 0 and elapsed < 180, log[-4000:]

    watchdog = re.search(r"^\[rank 1\] watchdog: .*$", log, re.M)
    assert watchdog, log[-4000:]
    print(watchdog[0])
    assert re.match(
        r"\[rank 1\] watchdog: step 3 \(data\) has made no progress for \d+ s \(limit 8 s\): this rank is stuck; "
        rf"its stacks follow, then it exits with status {EXIT_STUCK}",
        watchdog[0],
    ), watchdog[0]
    # The launcher reports the hung rank's exit status (rank 0 may fail too once its peer is gone).
    assert re.search(rf"exitcode\s*:\s*{EXIT_STUCK} \(pid: \d+\)", log), log[-4000:]

    store, files = diagnostics(dataset)
    print("diagnostics:", sorted(files))
    assert "rank_00001.stacks.txt" in files, files
    stacks = store.get_bytes(files["rank_00001.stacks.txt"]).decode()
    assert stacks.startswith("rank 1: watchdog: step 3 (data) made no progress for "), stacks[:500]
    # The hung main thread, where it hangs: in the step's data phase of the training loop.
    assert re.search(r"  File .*helpers\.py.* in _stall\n(  File .*\n)*  File .*train\.py.* in _train", stacks), stacks
