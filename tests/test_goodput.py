"""The goodput ledger without training: one attempt's file as the loop's edges fill it (a clock the test moves),
attempts combined (a kill after a save, a gap, a resume; an overlap; one killed while it resumed; a host's clock
behind or stepped back, ordered by the lease's sequence), and what reads it: `pretrain runs show` and `runs list`,
the MLflow run's metrics and the Step time Deck's bar. A real killed and resumed run: tests/test_goodput_run.py."""

from __future__ import annotations

import json
import re
import time
import uuid
from types import SimpleNamespace

import pytest

from cli.main import main as cli
from common.contracts import lease_sequence_key, metrics_key
from registry.registry import register
from runs.lease import RunLease
from runs.ledger import (
    PARTS,
    AttemptLedger,
    Goodput,
    _attempt,
    attempt_key,
    combine,
    goodput_prefix,
    load_goodput,
    process_age_s,
    read_attempts,
)
from runs.reading import load_run
from storage import Store, open_store
from tests.helpers import html_charts, registry_inputs, report, run_decks, svg_ids, svg_texts
from tracking.client import client, experiment_id, start_run
from tracking.mirror import record_execution
from training.observe.goodput import GoodputCallback

RUN = "runs/r1"


class Clock:
    """A clock the test sets."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def attempt(started: float, updated: float, resumed: int | None, last: int | None, parts: dict, saved: dict, **lease) -> dict:
    """An attempt file's record, as ``AttemptLedger.record`` writes it (``lease``: its ``sequence`` and
    ``leased_at``, format 2; none: a format-1 record, from before the lease's sequence)."""
    assert abs(sum(parts.values()) - (updated - started)) < 1e-9, "a hand-made attempt must add up"
    return {
        "format": 2 if lease else 1,
        "started_at": started,
        "updated_at": updated,
        **lease,
        "resumed_step": resumed,
        "last_step": last,
        "ended": True,
        "parts": parts,
        "productive_at_step": {str(k): v for k, v in saved.items()},
    }


def parts(startup=0.0, productive=0.0, data=0.0, save=0.0, evaluation=0.0, other=0.0, compile=0.0, restore=0.0) -> dict:
    """An attempt's parts (format 2's names)."""
    names = ("startup", "productive", "data_wait", "checkpoint_save", "evaluation", "other", "compile", "checkpoint_restore")
    return dict(zip(names, map(float, (startup, productive, data, save, evaluation, other, compile, restore)), strict=True))


def old_parts(startup, productive, data, checkpoint, evaluation, shutdown) -> dict:
    """An attempt's parts as format 1 named them."""
    return {
        "startup": startup,
        "productive": productive,
        "data_wait": data,
        "checkpoint_stall": checkpoint,
        "evaluation": evaluation,
        "shutdown": shutdown,
    }


# Killed after its save at step 4, having finished steps 5 and 6 (20 s of productive time after the save, trained
# again), 30 s before the next attempt starts; that one resumes from step 4 and finishes at step 8.
KILLED = attempt(1000.0, 1100.0, 0, 6, parts(8, 60, 5, 20, 3, 2, restore=2), {4: 40.0}, sequence=1, leased_at=1007.0)
RESUMED = attempt(1130.0, 1200.0, 4, 8, parts(9, 40, 4, 10, 2, 2, restore=3), {8: 40.0}, sequence=2, leased_at=1135.0)


def format_1(record: dict, old: dict) -> dict:
    """``record`` as a format-1 file has it: no lease's sequence, the parts ``old`` under their old names."""
    return {**{k: v for k, v in record.items() if k not in ("sequence", "leased_at")}, "format": 1, "parts": old}


def plant(store: Store, *attempts: dict) -> None:
    for record in attempts:
        store.put_json(attempt_key(RUN, record["started_at"]), record)


def test_one_attempt_splits_its_time_contiguously_and_adds_up(tmp_path):
    store = open_store(str(tmp_path / "store"))
    clock, compiled = Clock(100.0), Clock(0.0)
    ledger = AttemptLedger(store, RUN, started_at=100.0, clock=clock)
    callback = GoodputCallback(ledger, clock, compiled=compiled)
    clock.now = 101.0
    callback.restore_begins()  # the lease's wait, then the resume
    clock.now = 104.0
    callback.leased(SimpleNamespace(sequence=3, acquired_at=time.monotonic() - 1.0))  # the lease, 1 s ago
    assert store.get_json(ledger.key)["sequence"] == 3  # written at once: an attempt killed in its resume is placed
    callback.restored()
    callback.resumed(0)
    clock.now = 105.0
    callback.before_step(1)  # start-up ends: process start to the first step, less the resume
    clock.now, compiled.now = 107.0, 1.2  # step 1 compiled for 1.2 s of its 2 s
    callback.on_record({"step": 1, "time_data_s": 0.5, "time_checkpoint_s": 0.0})
    callback.before_step(2)
    clock.now = 110.0
    callback.on_record({"step": 2, "time_data_s": 0.25, "time_checkpoint_s": 1.0, "val_time_s": 0.5})
    clock.now = 110.5
    callback.on_save(2)  # the run log's publish after the save: checkpoint save too
    clock.now = 111.0
    callback.close()
    clock.now = 113.0
    callback.end()
    callback.end()  # once only
    (key,) = store.list(f"{goodput_prefix(RUN)}/")
    record = store.get_json(key)
    expected = parts(startup=4.0, productive=0.3 + 1.25, data=0.75, save=1.5, evaluation=0.5, other=2.5, compile=1.2, restore=1.0)
    assert record["parts"] == pytest.approx(expected, abs=1e-3)
    assert sum(record["parts"].values()) == pytest.approx(record["updated_at"] - record["started_at"]) == 13.0
    assert (record["format"], record["sequence"], record["leased_at"]) == (2, 3, pytest.approx(103.0, abs=1e-3))
    assert (record["resumed_step"], record["last_step"], record["ended"]) == (0, 2, True)
    assert record["productive_at_step"] == {"2": pytest.approx(1.55, abs=1e-3)}
    goodput = load_goodput(store, RUN)
    assert goodput.attempts == 1 and goodput.wall_s == 13.0 and goodput.fraction == pytest.approx(1.55 / 13.0, abs=1e-4)
    assert goodput.parts["infrastructure_recovery"] == goodput.parts["wasted_progress"] == 0.0
    assert abs(goodput.unaccounted_s) < 1e-9 and goodput.skew_s == 0.0 and goodput.warnings == ()


def test_the_ledgers_own_clock_does_not_step_with_the_wall_clock(tmp_path, monkeypatch):
    """The default clock: the wall clock at the ledger's construction, then the monotonic clock's seconds, so a
    step of the host's clock (NTP, by hand) within an attempt moves none of its intervals."""
    wall = [2_000_000_000.0]
    monkeypatch.setattr(time, "time", lambda: wall[0])
    ledger = AttemptLedger(open_store(str(tmp_path / "store")), RUN)
    before = ledger.clock()
    wall[0] -= 120.0  # the host's clock steps back
    after = ledger.clock()
    assert 0.0 <= after - before < 5.0 and abs(before - 2_000_000_000.0) < 5.0
    # The process started before, by the same clock: this (test worker) process's age, whatever it is.
    assert before - ledger.started_at == pytest.approx(process_age_s(), abs=5.0) and before >= ledger.started_at


def test_an_attempt_that_fails_mid_step_keeps_its_heartbeat_and_its_partial_step(tmp_path):
    store = open_store(str(tmp_path / "store"))
    clock = Clock(0.0)
    ledger = AttemptLedger(store, RUN, started_at=0.0, clock=clock, heartbeat_s=10.0)
    callback = GoodputCallback(ledger, clock, compiled=lambda: 0.0)
    clock.now = 2.0
    callback.before_step(1)
    for step in range(1, 8):  # 3 s a step: rewritten at the first step past 10 s since the last write (2 s)
        clock.now += 3.0
        callback.on_record({"step": step, "time_data_s": 1.0})
        if step == 3:
            assert store.get_json(ledger.key)["updated_at"] == 2.0  # 9 s since the last write: not yet
    heartbeat = store.get_json(ledger.key)
    assert heartbeat["updated_at"] == 14.0 and heartbeat["last_step"] == 4  # the write at 10 s past the one before
    clock.now = 24.5
    callback.end()  # a failure in step 8: its half step is productive time (a resume moves it to wasted progress)
    record = store.get_json(ledger.key)
    assert record["updated_at"] == 24.5 and record["parts"]["productive"] == pytest.approx(7 * 2.0 + 1.5)
    assert record["parts"]["startup"] == 2.0 and record["parts"]["data_wait"] == 7.0 and record["parts"]["other"] == 0.0


def test_other_ranks_write_nothing(tmp_path):
    store = open_store(str(tmp_path / "store"))
    callback = GoodputCallback.for_rank(store, RUN, rank0=False)
    callback.before_step(1)
    callback.on_record({"step": 1})
    callback.on_save(1)
    callback.close()
    callback.end()
    assert store.list("") == [] and load_goodput(store, RUN) is None


def test_a_killed_attempt_and_its_resume_combine_into_recovery_and_wasted_progress(tmp_path):
    store = open_store(str(tmp_path / "store"))
    plant(store, RESUMED, KILLED)  # read in the lease's order, whatever the listing's
    store.put_bytes(f"{goodput_prefix(RUN)}/attempt-planted.json", b"{not json")  # left out
    goodput = load_goodput(store, RUN)
    assert goodput.attempts == 2 and goodput.wall_s == 200.0
    assert goodput.parts == pytest.approx(
        {
            "productive": 60.0 + 40.0 - 20.0,
            "startup": 8.0 + 9.0,  # each attempt's own, the resumed one's too
            "compile": 0.0,
            "checkpoint_restore": 5.0,
            "checkpoint_save": 30.0,
            "data_wait": 9.0,
            "evaluation": 5.0,
            "wasted_progress": 60.0 - 40.0,  # steps 5-6, trained after the save the resume came from
            "infrastructure_recovery": 30.0,  # the killed attempt's last update to the next one's start
            "other": 4.0,
        }
    )
    assert list(goodput.parts) == list(PARTS)
    assert goodput.fraction == pytest.approx(0.4) and goodput.unaccounted_s == pytest.approx(0.0)
    assert goodput.to_dict() == {
        "fraction": goodput.fraction,
        "wall_s": 200.0,
        "attempts": 2,
        "parts": goodput.parts,
        "unaccounted_s": goodput.unaccounted_s,
        "skew_s": 0.0,
        "warnings": [],
    }


def test_a_run_written_before_the_lease_sequence_still_reads_in_start_order(tmp_path):
    """Format 1 (no ``sequence``): start order, ``checkpoint_stall`` read as ``checkpoint_save`` and ``shutdown``
    as ``other``, the resume inside ``startup``."""
    store = open_store(str(tmp_path / "store"))
    killed = attempt(1000.0, 1100.0, 0, 6, old_parts(10, 60, 5, 20, 3, 2), {4: 40.0})
    resumed = attempt(1130.0, 1200.0, 4, 8, old_parts(12, 40, 4, 10, 2, 2), {8: 40.0})
    plant(store, resumed, killed)
    goodput = load_goodput(store, RUN)
    assert goodput.parts == pytest.approx(
        {**dict.fromkeys(PARTS, 0.0), "productive": 80.0, "startup": 22.0, "checkpoint_save": 30.0, "data_wait": 9.0}
        | {"evaluation": 5.0, "wasted_progress": 20.0, "infrastructure_recovery": 30.0, "other": 4.0}
    )
    assert goodput.fraction == pytest.approx(0.4) and goodput.unaccounted_s == pytest.approx(0.0) and goodput.skew_s == 0.0


def test_a_resume_past_the_last_step_wastes_nothing_and_an_overlap_is_not_counted_twice(tmp_path):
    store = open_store(str(tmp_path / "store"))
    done = attempt(0.0, 100.0, 0, 8, parts(10, 70, 5, 10, 3, 2), {4: 30.0, 8: 70.0}, sequence=1, leased_at=4.0)
    # An identical execution started at 90 s, waited for the lease until 100 s, resumed for 3 s, found step 8 done:
    # 12 s of start-up, of which the last 2 s came after the first one's end.
    twin = attempt(90.0, 107.0, 8, None, parts(12, 0, 0, 0, 0, 2, restore=3), {}, sequence=2, leased_at=100.0)
    plant(store, done, twin)
    goodput = load_goodput(store, RUN)
    assert goodput.parts["wasted_progress"] == goodput.parts["infrastructure_recovery"] == 0.0
    assert goodput.parts["startup"] == pytest.approx(10.0 + 2.0) and goodput.parts["checkpoint_restore"] == 3.0
    assert goodput.wall_s == 107.0 and goodput.unaccounted_s == pytest.approx(0.0) and goodput.skew_s == 0.0


# Attempt A trained to step 150 (saved at 100: 30 s of productive time after it); B was killed while it resumed
# (its file written, no resume step, no step trained); C resumed from step 100 and trained to 250.
TRAINED_150 = attempt(0.0, 100.0, 0, 150, parts(5, 90, 2, 3), {100: 60.0}, sequence=1, leased_at=2.0)
RESUMED_100 = attempt(130.0, 230.0, 100, 250, parts(3, 90, 2, 3, restore=2), {250: 90.0}, sequence=3, leased_at=131.0)
KILLED_WHILE_RESUMING = {
    "format-1": attempt(110.0, 120.0, None, None, old_parts(10, 0, 0, 0, 0, 0), {}),
    "leased": attempt(110.0, 120.0, None, None, parts(8, restore=2), {}, sequence=2, leased_at=118.0),
    "before-the-lease": attempt(110.0, 120.0, None, None, parts(10), {}, sequence=None, leased_at=None),
}


@pytest.mark.parametrize("killed", list(KILLED_WHILE_RESUMING))
def test_an_attempt_killed_while_resuming_hides_no_steps_trained_again(tmp_path, killed):
    """Issue 49 item 3 (a): the steps C trains again are A's, though B came between (B trained none): before, C's
    were charged against B alone, and A's 30 s after step 100 counted as productive (fraction 0.78)."""
    a, c = TRAINED_150, RESUMED_100
    if killed == "format-1":  # a run from before the lease's sequence: every attempt in start order
        a, c = format_1(a, old_parts(5, 90, 2, 3, 0, 0)), format_1(c, old_parts(5, 90, 2, 3, 0, 0))
    store = open_store(str(tmp_path / "store"))
    plant(store, a, KILLED_WHILE_RESUMING[killed], c)
    goodput = load_goodput(store, RUN)
    assert goodput.fraction == pytest.approx(150.0 / 230.0) and round(goodput.fraction, 2) == 0.65
    assert goodput.parts["wasted_progress"] == pytest.approx(30.0)
    assert goodput.parts["productive"] == pytest.approx(150.0) and goodput.wall_s == 230.0
    assert goodput.attempts == 3 and abs(goodput.unaccounted_s) < 1e-9


def test_a_wasted_step_is_charged_once_and_further_back_when_the_resume_goes_further_back(tmp_path):
    """B resumed from A's step 100 (A's 30 s after it wasted) and was killed compiling its first step; C resumed
    from step 100 too (nothing more of A's), D from step 50 (A's 20 s between 50 and 100 as well, and C's all)."""
    a = attempt(0.0, 100.0, 0, 150, parts(5, 90, 2, 3), {50: 40.0, 100: 60.0}, sequence=1, leased_at=2.0)
    b = attempt(110.0, 120.0, 100, None, parts(8, restore=2), {}, sequence=2, leased_at=111.0)
    c = attempt(130.0, 150.0, 100, 110, parts(5, 10, restore=5), {}, sequence=3, leased_at=131.0)
    d = attempt(160.0, 260.0, 50, 250, parts(5, 90, 2, 3), {250: 90.0}, sequence=4, leased_at=161.0)
    goodput = combine([_attempt(r) for r in (a, b, c, d)])
    assert goodput.parts["productive"] == pytest.approx(90.0 + 10.0 + 90.0 - 60.0)
    assert goodput.parts["wasted_progress"] == pytest.approx(30.0 + 20.0 + 10.0)


# A node's clock 120 s behind: attempt A [0, 100] on a good clock, B on the slow one from 130 s to 230 s, which it
# records as [10, 110], its lease at 15 (135 s): 85 s before A's last update by the clocks.
GOOD_CLOCK = attempt(0.0, 100.0, 0, 100, parts(1, 95, 1, 1, restore=2), {100: 95.0}, sequence=1, leased_at=1.0)
TIMES = ("started_at", "updated_at", "leased_at")
SLOW_CLOCK = attempt(10.0, 110.0, 100, 200, parts(5, 85, 3, 2, restore=5), {200: 85.0}, sequence=2, leased_at=15.0)


def test_an_attempt_on_a_host_whose_clock_is_behind_is_skew_not_goodput(tmp_path, capsys):
    """Issue 49 item 3 (b): before, fraction 1.64 and unaccounted -80 s, without a warning."""
    store = open_store(str(tmp_path / "store"))
    plant(store, GOOD_CLOCK, {**SLOW_CLOCK, "host": "node-b"})
    goodput = load_goodput(store, RUN)
    assert 0.0 <= goodput.fraction <= 1.0 and goodput.fraction == pytest.approx(180.0 / 195.0)
    assert goodput.skew_s == pytest.approx(85.0) and abs(goodput.unaccounted_s) < 1e-9
    # B moved 85 s later: [95, 195], its lease at A's end; its 5 s of start-up before it overlap A's last ones.
    assert goodput.wall_s == pytest.approx(195.0) and goodput.parts["startup"] == pytest.approx(1.0 + 0.0)
    assert goodput.parts["infrastructure_recovery"] == 0.0
    (warning,) = goodput.warnings
    assert warning.startswith("clock skew: attempt 2 (lease sequence 2 on host node-b") and "85.0 s" in warning, warning
    capsys.readouterr()
    assert cli(["runs", "show", "r1", "--store", store.uri]) == 0
    text = capsys.readouterr().out
    assert f"  WARNING: {warning}" in text and "goodput: 92.3% of 195.0 s" in text
    assert [line.split()[-1] for line in text.splitlines() if line.startswith("  clock skew (left out)")] == ["85.00"]
    # A moment's skew (the previous attempt's last write follows its lease's release) is moved, not warned of.
    moment = combine([_attempt(GOOD_CLOCK), _attempt({**SLOW_CLOCK, **{k: SLOW_CLOCK[k] + 84.7 for k in TIMES}})])
    assert moment.skew_s == pytest.approx(0.3) and moment.warnings == () and abs(moment.unaccounted_s) < 1e-9


def test_attempts_follow_the_lease_sequence_when_a_hosts_clock_steps_back_between_them(tmp_path):
    """Three attempts on one host whose clock stepped back 120 s between the second and the third: the third's
    start (100) is before the second's (110), and the lease's sequence orders them. Before: C read as the second
    attempt, B's steps counted as wasted (65 s), unaccounted -62 s."""
    store = open_store(str(tmp_path / "store"))
    a = attempt(0.0, 100.0, 0, 10, parts(3, 85, 4, 4, 2, restore=2), {10: 85.0}, sequence=1, leased_at=2.0)
    b = attempt(110.0, 200.0, 10, 20, parts(5, 75, 3, 2, 2, restore=3), {20: 75.0}, sequence=2, leased_at=113.0)
    c = attempt(100.0, 180.0, 20, 30, parts(6, 65, 2, 2, 2, restore=3), {30: 65.0}, sequence=3, leased_at=104.0)
    plant(store, c, a, b)
    assert [r["started_at"] for r in read_attempts(store, RUN)] == [0.0, 110.0, 100.0]  # the lease's order
    goodput = load_goodput(store, RUN)
    assert goodput.parts["wasted_progress"] == 0.0 and goodput.parts["productive"] == 225.0
    assert goodput.skew_s == pytest.approx(96.0) and goodput.wall_s == pytest.approx(276.0)
    assert goodput.parts["infrastructure_recovery"] == pytest.approx(10.0) and abs(goodput.unaccounted_s) < 1e-9
    assert 0.0 <= goodput.fraction <= 1.0 and len(goodput.warnings) == 1 and "attempt 3 (lease sequence 3" in goodput.warnings[0]


def test_an_attempt_killed_before_the_lease_is_counted_not_combined(tmp_path):
    store = open_store(str(tmp_path / "store"))
    early = attempt(1105.0, 1125.0, None, None, parts(20), {}, sequence=None, leased_at=None)
    plant(store, KILLED, early, RESUMED)
    goodput = load_goodput(store, RUN)
    assert goodput.attempts == 3 and goodput.parts == load_goodput_of(tmp_path, KILLED, RESUMED).parts


def load_goodput_of(tmp_path, *records: dict) -> Goodput:
    store = open_store(str(tmp_path / f"other-{uuid.uuid4().hex[:6]}"))
    plant(store, *records)
    return load_goodput(store, RUN)


def test_each_take_of_the_lease_hands_out_the_runs_next_sequence_number(tmp_path):
    store = open_store(str(tmp_path / "store"))
    said: list[str] = []
    first = RunLease(store, RUN, log=said.append)
    assert first.sequence is None and first.try_acquire() and first.sequence == 1 and first.acquired_at is not None
    assert store.get_json(lease_sequence_key(RUN)) == {"last": 1} and lease_sequence_key(RUN) == f"{RUN}/lease-sequence.json"
    assert not RunLease(store, RUN, log=said.append).try_acquire()  # held: no number handed out
    first.release()
    second = RunLease(store, RUN, log=said.append)
    assert second.try_acquire() and second.sequence == 2 and store.get_json(lease_sequence_key(RUN)) == {"last": 2}
    second.release()
    store.put_bytes(lease_sequence_key(RUN), b"{not json")
    third = RunLease(store, RUN, log=said.append)
    assert third.try_acquire() and third.sequence is None  # the lease is taken all the same
    assert [line for line in said if line.startswith("WARNING")] == [
        f"WARNING: run {RUN}: its lease sequence {store.url(lease_sequence_key(RUN))} was not advanced "
        "(Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"
    ]
    third.release()


def test_runs_show_and_list_print_the_goodput_and_give_it_in_json(tmp_path, capsys):
    store = open_store(str(tmp_path / "store"))
    plant(store, KILLED, RESUMED)
    capsys.readouterr()
    assert cli(["runs", "show", "r1", "--store", store.uri, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["goodput"]
    assert shown == load_goodput(store, RUN).to_dict() and shown["fraction"] == pytest.approx(0.4)
    assert cli(["runs", "show", "r1", "--store", store.uri]) == 0
    text = capsys.readouterr().out
    assert "goodput: 40.0% of 200.0 s wall time productive, over 2 attempts" in text
    lines = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.startswith("  ") and line.split()}
    assert lines["productive"] == ["80.00", "40.0%"] and lines["infrastructure_recovery"] == ["30.00", "15.0%"]
    assert lines["wasted_progress"] == ["20.00", "10.0%"] and lines["data_wait"] == ["9.00", "4.5%"]
    assert lines["checkpoint_restore"] == ["5.00", "2.5%"] and lines["other"] == ["4.00", "2.0%"]
    assert lines["unaccounted"] == ["0.00"] and "clock" not in lines and "WARNING:" not in text
    assert [line.split()[0] for line in text.splitlines() if line.split() and line.split()[0] in PARTS] == list(PARTS)
    assert cli(["runs", "list", "--store", store.uri]) == 0
    assert "goodput 40.0%" in capsys.readouterr().out
    assert cli(["runs", "list", "--store", store.uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["goodput"] == pytest.approx(0.4)


def test_a_run_without_a_ledger_says_so(tmp_path, capsys):
    store = open_store(str(tmp_path / "store"))
    store.put_bytes(metrics_key(RUN), json.dumps({"step": 1, "loss": 2.0}).encode() + b"\n")
    capsys.readouterr()
    assert cli(["runs", "show", "r1", "--store", store.uri]) == 0
    assert "goodput: not recorded" in capsys.readouterr().out
    assert cli(["runs", "list", "--store", store.uri]) == 0
    assert "goodput -" in capsys.readouterr().out
    assert "goodput</h3><p>not recorded" in run_decks(load_run(store, "r1"))["Step time"]


def test_the_step_time_deck_draws_the_wall_time_as_one_bar_with_seconds(tmp_path):
    store = open_store(str(tmp_path / "store"))
    plant(store, KILLED, RESUMED)
    html = run_decks(load_run(store, "r1"))["Step time"]
    assert "40.0% of 200.0 s wall time in productive steps, over 2 attempts" in html
    bar = html_charts(html)[0]
    # one segment a part of some time, in order (no compiling here), each in a colour of its own
    assert svg_ids(bar, "goodput-") == [f"goodput-{p}" for p in PARTS if p != "compile"]
    legend = set(svg_texts(bar))
    assert {"productive: 80.0 s (40.0%)", "infrastructure recovery: 30.0 s (15.0%)", "wasted progress: 20.0 s (10.0%)"} <= legend
    assert "data wait: 9.0 s (4.5%)" in legend and "checkpoint save: 30.0 s (15.0%)" in legend, legend
    assert "checkpoint restore: 5.0 s (2.5%)" in legend and "other: 4.0 s (2.0%)" in legend, legend


def test_the_mlflow_run_gets_the_goodput_and_each_part(tmp_path, mlflow_tracking_uri):
    store = registry_inputs(open_store(str(tmp_path / "store")))
    store.put_bytes(metrics_key(RUN), b"".join(json.dumps({"step": s, "loss": 2.0}).encode() + b"\n" for s in (1, 10)))
    plant(store, KILLED, RESUMED)
    model = register(store, f"gpt-{uuid.uuid4().hex[:6]}", report(2.0))
    mlflow = client(mlflow_tracking_uri)
    exp = experiment_id(mlflow, f"test-{uuid.uuid4().hex[:8]}", mlflow_tracking_uri)
    run_id = start_run(mlflow, exp, f"local-{uuid.uuid4().hex[:8]}", {}, {})
    record_execution(mlflow, mlflow_tracking_uri, mlflow.get_experiment(exp).name, "exec-1", run_id, store, model, {})
    metrics = mlflow.get_run(run_id).data.metrics
    expected = Goodput(200.0, load_goodput(store, RUN).parts, 2)
    assert metrics["goodput"] == pytest.approx(0.4) and metrics["goodput_wall_s"] == 200.0 and metrics["goodput_skew_s"] == 0.0
    assert {p: metrics[f"goodput_{p}_s"] for p in PARTS} == pytest.approx(expected.parts)
    assert [m.step for m in mlflow.get_metric_history(run_id, "goodput")] == [10]  # at the run's last step


NOT_A_NUMBER = re.compile(r"\b(inf|nan)\b")
"""A figure printed as ``inf`` or ``nan`` (not the part ``infrastructure_recovery``)."""


@pytest.mark.parametrize(
    "change",
    [
        {"parts": {**KILLED["parts"], "productive": float("inf")}},
        {"parts": {**KILLED["parts"], "productive": float("nan")}},
        {"parts": {**KILLED["parts"], "startup": -1e6}},
        {"parts": {**KILLED["parts"], "other": 1e12}},  # finite, far past its 100 s span
        {"productive_at_step": {"4": float("inf")}},
        {"resumed_step": -5},
        {"sequence": -1},
        {"leased_at": float("nan")},
    ],
    ids=["infinite", "nan", "negative", "past-its-span", "infinite-save", "negative-step", "negative-sequence", "nan-lease"],
)
def test_an_attempt_file_with_impossible_seconds_is_left_out_and_every_reader_still_answers(tmp_path, capsys, change):
    """Issue 50 finding 5: an attempt file with ``Infinity``, ``NaN`` or negative parts crashed ``runs list`` (every
    run hidden), printed ``goodput inf%`` and failed ``runs report``."""
    store = open_store(str(tmp_path / "store"))
    plant(store, RESUMED, {**KILLED, **change})
    assert load_goodput(store, RUN).to_dict() == combine([_attempt(RESUMED)]).to_dict()  # the planted one left out
    capsys.readouterr()
    assert cli(["runs", "list", "--store", store.uri]) == 0
    listed = capsys.readouterr().out
    assert "r1" in listed and not NOT_A_NUMBER.search(listed)
    assert cli(["runs", "show", "r1", "--store", store.uri]) == 0
    shown = capsys.readouterr().out
    assert "goodput: " in shown and not NOT_A_NUMBER.search(shown) and "-" not in shown.split("goodput:")[1][:12]
    assert cli(["runs", "report", "r1", "--store", store.uri, "--out", str(tmp_path / "report.html")]) == 0
