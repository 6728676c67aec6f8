"""Identical executions (issue 18 item 2): the same registration replayed or made twice at once
gives one version, also after a registration SIGKILLed before its commit; three identical
``pretrain run`` on one store all finish, with one version and every checkpoint complete: two sharing
flytekit's local cache start at the same moment and race for the lease on the run, the third, with a
cache of its own, starts once one holds it; the other two wait for the holder, one beside it in the same
cache and one in another (the holder is stopped until they do: the overlap is made, not hoped for)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from common.contracts import CARD_MARKDOWN, checkpoint_prefix, committed_steps, model_prefix
from registry.card import read_card
from registry.config import LATEST
from registry.registry import CLAIM, list_models, register, registration_identity
from runs.lease import STALE_S
from storage import open_store
from tests.helpers import BIN, ROOT, distinct_corpus, kill_group, registry_inputs, report, write_config
from training.checkpointing.checkpoint import fetch

CONFIG = {"evaluation": {"batch_size": 4, "max_batches": 2}, "registry": {"model_name": "gpt"}}


def versions(store) -> list[int]:
    return [row["version"] for row in list_models(store)]


def test_a_replayed_registration_gives_the_same_version(store):
    registry_inputs(store)
    first = register(store, "gpt", report(2.0), config=CONFIG)
    again = register(store, "gpt", report(2.0), config=CONFIG)
    assert again == first and versions(store) == [1]
    assert len(store.list("models/gpt/registrations")) == 1

    other = register(store, "gpt", report(1.5), config=CONFIG)  # another evaluation: another registration
    assert other.version == 2
    late = register(store, "gpt", report(2.0), config=CONFIG)  # a replay long after: latest stays forward
    assert late == first and versions(store) == [1, 2]
    assert {row["version"]: row["aliases"] for row in list_models(store)} == {1: [], 2: ["latest"]}


def test_a_twin_registration_in_flight_keeps_versions_without_a_gap(store):
    """The twin of a registration claimed a version and has not yet named it for the identity (between its two
    conditional creates): the registration takes the twin's number, not the next one, so versions stay 1, 2."""
    registry_inputs(store)
    identity = registration_identity(store, "gpt", report(2.0), CONFIG, (LATEST,), "", 0.0)
    store.put_json(f"{model_prefix('gpt', 1)}/{CLAIM}", {"claimed": "2026-12-06T00:00:00Z", "registration": identity})
    ref = register(store, "gpt", report(2.0), config=CONFIG)
    assert ref.version == 1 and versions(store) == [1]
    other = register(store, "gpt", report(1.5), config=CONFIG)
    assert other.version == 2 and versions(store) == [1, 2]


@pytest.mark.slow
def test_identical_registrations_at_once_give_one_version(store):
    registry_inputs(store)
    with ThreadPoolExecutor(4) as pool:
        refs = list(pool.map(lambda _: register(open_store(store.uri), "gpt", report(2.0), config=CONFIG), range(4)))
    assert all(ref == refs[0] for ref in refs) and versions(store) == [1]  # one version, and no number skipped
    assert {row["version"]: row["aliases"] for row in list_models(store)} == {refs[0].version: ["latest"]}
    card = read_card(store, refs[0].prefix)
    markdown = store.get_bytes(f"{refs[0].prefix}/{CARD_MARKDOWN}").decode()
    assert f"Registered {card.registered_at}" in markdown  # the card and its page from the same writer


@pytest.mark.slow
def test_a_registration_killed_before_its_commit_is_completed_by_the_rerun(store, tmp_path):
    weights = os.urandom(200_000)
    registry_inputs(store, weights)
    script = f"from tests.helpers import register_killed_before_commit as r; r({store.uri!r}, 2.0, {CONFIG!r})"
    killed = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    entry = model_prefix("gpt", 1)
    written = store.get_json(f"{entry}/card.json")  # copied and carded, not committed: invisible
    assert not store.is_committed(entry) and versions(store) == []

    ref = register(store, "gpt", report(2.0), config=CONFIG)
    assert ref.version == 1 and versions(store) == [1]
    card = read_card(store, entry)
    assert card.registered_at == written["registered_at"]  # the killed writer's card is the card
    assert f"Registered {card.registered_at}" in store.get_bytes(f"{entry}/{CARD_MARKDOWN}").decode()
    assert store.get_bytes(f"{entry}/checkpoint/model/__0_0.distcp") == weights
    assert {row["version"]: row["aliases"] for row in list_models(store)} == {1: ["latest"]}


# ----------------------------------------------------------------------------------------------
# Three identical `pretrain run` at once

STEPS = 300
"""Long enough that the holder cannot finish training before the test stops it (the test looks for the lease
every POLL_S; the holder then has 300 steps and 2 checkpoints to go, ~0.1 s a step) nor in the short spells it
runs between pauses: ~10 steps a spell, one spell per PAUSE_S, so ~600 s (OVERLAP_DEADLINE_S) for the others to
reach the lease. At 100 steps a loaded CI machine once had the holder finish (~210 s) before they did. Cheap all
the same (the waiter trains none: it resumes from the holder's final checkpoint)."""
POLL_S = 0.05
PAUSE_S = 20.0
"""Longest the holder stays stopped past its last heartbeat: well under lease.STALE_S (60 s: the waiter
would take the lease over, and the holder, resumed, would lose it and fail), and two pauses under
parallel.collective_timeout_s (60 s: a collective a rank entered just before a pause must still finish)."""
RESUMED_S = 1.0
"""How long the holder runs between two pauses once it refreshed its lease: its ranks catch up with each other."""
OVERLAP_DEADLINE_S = 600.0
"""How long a run may take to take the lease, and the others to reach it (their data tasks and launch, on a
loaded machine)."""
WAITING = "is being trained by"
"""runs.lease's line when an identical execution holds the lease."""


def start(config: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    # Its own process group (session): the ranks, forked inside it, are stopped, resumed or killed with it.
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(BIN / "pretrain"), "run", "--config", str(config), "--json"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def waiting_lines(log: Path) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines() if "identical execution" in line or "took over" in line]


def lease_record(store_root: Path) -> dict | None:
    """The lease record (``runs/<id>/lease.json``) of the local store at ``store_root``; None while there is none."""
    for path in store_root.glob("runs/*/lease.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):  # released between the glob and the read (writes are renames: never torn)
            continue
        if isinstance(record, dict) and isinstance(record.get("pid"), int):
            return record
    return None


def lease_holder(store_root: Path, procs: list[subprocess.Popen]) -> tuple[int, dict] | None:
    """Which run holds the lease, and its record: the run whose process group has the holder (rank 0, forked
    inside it). None while there is no lease, or its holder is gone (it released it, or is releasing it)."""
    record = lease_record(store_root)
    if record is None:
        return None
    try:
        group = os.getpgid(record["pid"])
    except ProcessLookupError:
        return None
    runs = [i for i, proc in enumerate(procs) if proc.pid == group]
    assert runs, f"the lease's holder, pid {record['pid']}, is in process group {group}, not one of the runs'"
    return runs[0], record


def first_holder(store_root: Path, procs: list[subprocess.Popen]) -> tuple[int, dict]:
    """The run that takes the lease first (its index in ``procs``) and the lease record it wrote, seen within
    POLL_S of its taking it."""
    deadline = time.monotonic() + OVERLAP_DEADLINE_S
    while (found := lease_holder(store_root, procs)) is None:
        codes = [proc.poll() for proc in procs]
        assert None in codes, f"every run exited ({codes}) and none was seen holding the lease"
        assert time.monotonic() < deadline, f"no run held the lease within {OVERLAP_DEADLINE_S:.0f} s"
        time.sleep(POLL_S)
    return found


def make_the_others_wait(store_root: Path, procs: list[subprocess.Popen], logs: list[Path], holder: int, record: dict) -> None:
    """Force the overlap instead of hoping for it: stop the holder's whole process group (SIGSTOP) until every
    other run's log says it is waiting for its lease. A pause ends at most PAUSE_S past the holder's heartbeat;
    the holder is then resumed until it refreshes the lease (due at once: refresh_s passed while it was stopped)
    and stopped again, so a slow waiter is waited for without the lease going stale."""
    deadline = time.monotonic() + OVERLAP_DEADLINE_S
    others, group = [i for i in range(len(procs)) if i != holder], procs[holder].pid

    def waits(other: int) -> bool:
        if WAITING in logs[other].read_text(errors="replace"):  # a line still being written is enough
            return True
        code = procs[other].poll()
        assert code is None, (
            f"run-{other} exited ({code}) without waiting for the lease run-{holder} holds ({record}); its log ends: "
            + logs[other].read_text(errors="replace")[-1500:]
        )
        return False

    def waiting() -> bool:
        return all([waits(other) for other in others])  # each checked: one that exited without waiting fails

    held = record
    try:
        while True:
            os.killpg(group, signal.SIGSTOP)
            while time.time() < held["heartbeat"] + PAUSE_S:
                if waiting():
                    return
                time.sleep(0.2)
            os.killpg(group, signal.SIGCONT)  # to refresh its heartbeat: the lease must not go stale
            while (now := lease_record(store_root)) == held:
                assert time.time() < held["heartbeat"] + STALE_S - 10, f"run-{holder} did not refresh its lease {held}"
                time.sleep(POLL_S)
            assert now is not None and now["token"] == record["token"], (
                f"run-{holder} no longer holds the lease ({now}) and runs {others} never all waited for it"
            )
            time.sleep(RESUMED_S)
            if waiting():
                return
            assert time.monotonic() < deadline, f"runs {others} did not all reach the lease within {OVERLAP_DEADLINE_S:.0f} s"
            held = now
    finally:
        with contextlib.suppress(ProcessLookupError):  # gone already: nothing left stopped
            os.killpg(group, signal.SIGCONT)  # never leave it stopped, whatever failed


@pytest.mark.slow
@pytest.mark.long("three whole `pretrain run`s (data, training, evaluation, registration) at once, one held till the others wait")
def test_three_identical_runs_at_once_all_finish_with_one_version(tmp_path: Path) -> None:
    """Runs 0 and 1 share a HOME (flytekit's local cache, ~/.flyte) and start at the same moment: whichever
    takes the lease, the other waits for it beside it in the same cache. Run 2 has a HOME of its own and
    starts once the lease is held (the holder stopped), so it waits in another cache. Were it started with
    the others it would take the lease in about one run of three, and no waiter would share the holder's cache."""
    store_root = tmp_path / "store"
    store_uri = str(store_root)
    corpus = distinct_corpus(tmp_path / "corpus", n=30, words_per_doc=120)
    config = write_config(
        tmp_path / "tiny.yaml",
        store_uri,
        data={"sources": [str(corpus)], "max_documents": 0},
        train={"steps": STEPS, "checkpoint_every": STEPS // 2, "keep_checkpoints": 3},
    )
    homes = [tmp_path / "home-shared", tmp_path / "home-shared", tmp_path / "home-own"]  # ~/.flyte holds the local cache
    envs = [{**os.environ, "HOME": str(home), "PYTHONUNBUFFERED": "1"} for home in homes]
    logs = [tmp_path / f"run-{i}.log" for i in range(len(envs))]
    started = time.monotonic()
    procs = [start(config, envs[i], logs[i]) for i in (0, 1)]  # the two sharing a cache race for the lease
    try:
        holder, lease = first_holder(store_root, procs)
        procs.append(start(config, envs[2], logs[2]))  # the holder is stopped at once below: run 2 can only wait
        make_the_others_wait(store_root, procs, logs, holder, lease)
        waited = time.monotonic() - started
        codes = [p.wait(timeout=1500) for p in procs]
    except BaseException:
        for p in procs:
            kill_group(p)  # SIGKILL ends stopped processes too: nothing is left behind
        raise
    elapsed = time.monotonic() - started
    texts = [log.read_text(errors="replace") for log in logs]
    assert codes == [0, 0, 0], "\n\n".join(t[-4000:] for t in texts)
    printed = [json.loads(t.strip().splitlines()[-1]) for t in texts]
    assert all(p == printed[0] for p in printed) and printed[0]["version"] == 1, printed  # the waiters registered its version

    waiters = [i for i in range(len(procs)) if i != holder]
    assert holder in (0, 1) and [homes[w] == homes[holder] for w in waiters] == [True, False], (holder, homes)
    waits = [waiting_lines(log) for log in logs]
    assert waits[holder] == [], waits  # the holder never waited nor took over
    for waiter in waiters:  # each waited, once, and took nothing over, for the holder's lease
        assert len(waits[waiter]) == 1 and WAITING in waits[waiter][0], waits
        assert f"pid {lease['pid']} on host {lease['host']}" in waits[waiter][0], (lease, waits)

    listed = subprocess.run(
        [str(BIN / "pretrain"), "registry", "list", "--json", "--store", store_uri],
        cwd=ROOT,
        env=envs[0],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert listed.returncode == 0, listed.stderr
    assert [(row["name"], row["version"]) for row in json.loads(listed.stdout)] == [("gpt-e2e", 1)]

    store = open_store(store_uri)
    (run,) = [f"runs/{name}" for name in store.children("runs")]  # both trained the same run
    assert lease["run"] == run
    assert committed_steps(store, run) == [STEPS // 2, STEPS]
    for step in (STEPS // 2, STEPS):  # every file committed is there, with the digest recorded at the save
        fetch(store, checkpoint_prefix(run, step), tmp_path / "fetched" / str(step))
    assert not store.exists(f"{run}/lease.json")  # released by whoever held it last
    metrics = [json.loads(line) for line in store.get_bytes(f"{run}/metrics.jsonl").decode().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))  # one run's steps, not two interleaved
    card = store.get_json("models/gpt-e2e/1/card.json")
    assert card["lineage"]["checkpoint"] == checkpoint_prefix(run, STEPS)  # a key of the store (a copy reads too)
    print(f"runs {waiters} waited for run-{holder} after {waited:.0f} s; all finished in {elapsed:.0f} s: {waits}")
