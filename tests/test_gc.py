"""``pretrain gc``: what it removes and keeps, per category, on a local store and on S3; dry run and
apply; the age rule, run leases, registered lineage and local staging; and gc run again and again
(age rule off) while a real two-rank training run saves, is SIGKILLed mid-upload and resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli import retention
from common.contracts import checkpoint_prefix, lease_key
from runs.lease import RunLease, boot_id, this_host
from runs.staging import STAGING
from storage import Store, open_store
from tests.helpers import BIN, ROOT, fresh_copy, kill_group, run_metrics, start_launch, tiny_model, train_with_slow_uploads

HOUR = 3600.0


def put(store: Store, key: str, size: int) -> None:
    store.put_bytes(key, (key.encode() * (size // len(key) + 1))[:size])


def checkpoint(store: Store, run: str, step: int, keep: int, *, commit: bool = True, size: int = 300) -> str:
    prefix = checkpoint_prefix(run, step)
    put(store, f"{prefix}/model/__0_0.distcp", size)
    store.put_json(f"{prefix}/meta.json", {"step": step, "train": {"keep_checkpoints": keep}})
    if commit:
        store.commit(prefix, {"step": step})
    return prefix


def snapshot(store: Store) -> dict[str, bytes]:
    """Every object of the store and its bytes (by ``list``, not gc's own listing)."""
    return {key: store.get_bytes(key) for key in store.list("")}


def under(keys, prefix: str) -> set[str]:
    return {k for k in keys if k == prefix or k.startswith(f"{prefix}/")}


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def no_staging(tmp_path: Path) -> Path:
    """A staging root of this test's own (empty): gc never looks at other tests' staging folders."""
    return tmp_path / "staging-root"


def demo_like(store: Store) -> dict[str, set[str]]:
    """One thing of every category; returns the prefixes gc must remove and those it must list as kept."""
    put(store, "datasets/good/manifest.json", 120)
    put(store, "datasets/good/shards/train-000000.tar", 2000)
    store.commit("datasets/good")
    put(store, "datasets/good/validation/result.json", 90)  # the validation never committed
    put(store, "datasets/half/shards/train-000000.tar", 1000)  # prepare killed mid-upload
    for step in (2, 4, 6):
        checkpoint(store, "runs/r1", step, keep=2)
    checkpoint(store, "runs/r1", 8, keep=2, commit=False)  # the job died uploading step 8
    put(store, "runs/r1/metrics.jsonl", 400)
    put(store, "runs/r1/eval/k1/results.json", 50)  # an evaluation that never committed
    put(store, "runs/r1/eval/k2/results.json", 60)
    store.commit("runs/r1/eval/k2")
    put(store, "runs/r1/mystery.bin", 10)
    for step in (3, 6):
        checkpoint(store, "runs/r2", step, keep=1)  # step 3 is beyond keep, but gpt:1 was copied from it
    store.put_json("models/gpt/1/card.json", {"lineage": {"training_run": "runs/r2", "training_steps": 3}})
    put(store, "models/gpt/1/checkpoint/model/__0_0.distcp", 300)
    store.commit("models/gpt/1")
    store.put_json("models/gpt/aliases/latest.json", {"version": 1})
    store.put_json("models/gpt/2/_CLAIMED", {"claimed": "2026-01-01T00:00:00+00:00"})  # registration killed after its claim
    store.put_json("models/gpt/registrations/aaa.json", {"version": 2})  # ... which a rerun would refill: it goes first
    store.put_json("models/gpt/registrations/bbb.json", {"version": 1})
    put(store, "scratch/notes.txt", 33)
    return {
        "remove": {
            "datasets/half",
            "datasets/good/validation",
            "runs/r1/checkpoints/step-0000002",
            "runs/r1/checkpoints/step-0000008",
            "runs/r1/eval/k1",
            "models/gpt/2",
        },
        "kept": {"runs/r2/checkpoints/step-0000003", "runs/r1/mystery.bin", "scratch"},
    }


def test_gc_removes_each_category_of_leftover_and_keeps_the_rest(store, no_staging):
    expected = demo_like(store)
    before = snapshot(store)
    later = time.time() + 2 * HOUR  # everything is two hours old

    plan = retention.plan(store, now=later, staging_root=no_staging)
    assert {e.where for e in plan.removals} == expected["remove"]
    assert {e.where for e in plan.kept} == expected["kept"]
    kept = {e.where: e for e in plan.kept}
    assert kept["runs/r2/checkpoints/step-0000003"].reason == "gpt:1's card names it"
    assert kept["scratch"].reason == kept["runs/r1/mystery.bin"].reason == "unknown, kept"
    assert snapshot(store) == before, "a dry run removed something"

    # Sizes as the bytes under each prefix (read object by object), in the entries and in the report.
    sizes = {prefix: sum(len(before[k]) for k in under(before, prefix)) for prefix in expected["remove"]}
    sizes["models/gpt/2"] += len(before["models/gpt/registrations/aaa.json"])
    assert {e.where: e.size for e in plan.removals} == sizes
    assert [e.records for e in plan.removals if e.what == retention.ABANDONED_CLAIM] == [["models/gpt/registrations/aaa.json"]]
    assert plan.total_bytes == sum(sizes.values())
    lines = retention.report_lines(plan)
    assert lines[0].startswith(f"store {store.uri}: dry run, nothing removed")
    assert lines[1] == f"would remove 6, {retention.human_size(plan.total_bytes)}:"
    for prefix, size in sizes.items():
        assert any(f"{retention.human_size(size)}  {prefix}/" in line for line in lines), (prefix, lines)
    assert f"  {retention.human_size(plan.total_bytes):>10}  total" in lines
    assert "kept 3:" in lines

    outcome = retention.apply(store, plan, now=later)
    assert {e.where for e in outcome.removed} == expected["remove"] and not outcome.failed and not outcome.skipped
    gone = set().union(*(under(before, prefix) for prefix in expected["remove"]), {"models/gpt/registrations/aaa.json"})
    assert snapshot(store) == {k: v for k, v in before.items() if k not in gone}  # the rest, byte for byte
    assert not retention.plan(store, now=later, staging_root=no_staging).removals


def test_recent_writes_and_live_runs_are_kept(store, no_staging):
    live, dead = "runs/live", "runs/dead"
    for step in (1, 2, 3):
        checkpoint(store, live, step, keep=1)
    checkpoint(store, live, 4, keep=1, commit=False)  # in flight
    checkpoint(store, dead, 2, keep=1, commit=False)
    store.put_json(lease_key(dead), {"host": this_host(), "boot": boot_id(), "pid": dead_pid(), "heartbeat": time.time()})
    put(store, "datasets/new/shards/train-000000.tar", 100)
    lease = RunLease(store, live)
    assert lease.try_acquire()
    try:
        # The default age rule: everything was just written, nothing goes (a live upload looks like a leftover).
        fresh = retention.plan(store, staging_root=no_staging)
        assert not fresh.removals
        assert all("within the last 60 min" in e.reason for e in fresh.kept), fresh.kept
        assert "nothing to remove" in retention.report_lines(fresh)

        # Without it: the live run's in-flight checkpoint still stays; its committed ones beyond keep go,
        # never its latest; the dead holder's leftover goes.
        plan = retention.plan(store, min_age_s=0, staging_root=no_staging)
        assert {e.where for e in plan.removals} == {
            checkpoint_prefix(live, 1),
            checkpoint_prefix(live, 2),
            checkpoint_prefix(dead, 2),
            "datasets/new",
        }
        (kept,) = plan.kept
        assert kept.where == checkpoint_prefix(live, 4) and kept.reason.startswith("its run is live (lease held by pid")
        retention.apply(store, plan)
        assert store.list(checkpoint_prefix(live, 4)) and store.is_committed(checkpoint_prefix(live, 3))
    finally:
        lease.release()
    # The lease released (the run ended or died): its leftover goes too.
    assert [e.where for e in retention.plan(store, min_age_s=0, staging_root=no_staging).removals] == [checkpoint_prefix(live, 4)]


def test_apply_looks_again_before_each_removal(store, no_staging):
    checkpoint(store, "runs/r", 5, keep=2, commit=False)
    put(store, "datasets/half/manifest.json", 10)
    later = time.time() + 2 * HOUR
    plan = retention.plan(store, now=later, staging_root=no_staging)
    assert {e.where for e in plan.removals} == {checkpoint_prefix("runs/r", 5), "datasets/half"}
    store.commit(checkpoint_prefix("runs/r", 5))  # the writer came back and committed in between
    outcome = retention.apply(store, plan, now=later)
    assert [(e.where, why) for e, why in outcome.skipped] == [(checkpoint_prefix("runs/r", 5), "committed since")]
    assert [e.where for e in outcome.removed] == ["datasets/half"]
    assert store.is_committed(checkpoint_prefix("runs/r", 5)) and not store.list("datasets/half")


def test_local_temporary_files_of_interrupted_writes(tmp_path, no_staging):
    store = open_store(str(tmp_path / "store"))
    checkpoint(store, "runs/r", 2, keep=2)
    put(store, "runs/r/metrics.jsonl", 50)
    root = Path(store.uri)
    (root / "runs/r/.tmp-abc123").write_bytes(b"x" * 70)  # a metrics rewrite, killed
    (root / "runs/r/checkpoints/step-0000002/.tmp-def456").write_bytes(b"y" * 30)
    (root / "models/gpt/aliases").mkdir(parents=True)
    (root / "models/gpt/aliases/.tmp-lock").write_bytes(b"")  # the alias lock: never a leftover
    # Even with the age rule off, a file this fresh may be a live writer's (a run's lease, in CI once).
    fresh = retention.plan(store, min_age_s=0, staging_root=no_staging)
    assert not fresh.removals and [e.what for e in fresh.kept] == [retention.TEMPORARY_FILE] * 2
    assert all("a write in flight" in e.reason for e in fresh.kept)
    later = time.time() + 2 * HOUR
    plan = retention.plan(store, now=later, staging_root=no_staging)
    assert {(e.where, e.what, e.size) for e in plan.removals} == {
        ("runs/r/.tmp-abc123", retention.TEMPORARY_FILE, 70),
        ("runs/r/checkpoints/step-0000002/.tmp-def456", retention.TEMPORARY_FILE, 30),
    }
    assert not plan.kept
    retention.apply(store, plan, now=later)
    assert not (root / "runs/r/.tmp-abc123").exists() and (root / "models/gpt/aliases/.tmp-lock").exists()
    assert store.is_committed(checkpoint_prefix("runs/r", 2))


def test_staging_folders_of_gone_processes(tmp_path):
    store = open_store(str(tmp_path / "store"))
    root = tmp_path / "tmp" / f"{STAGING}-{os.getuid()}"  # the per-user name (runs.staging.root)
    here = {"host": this_host(), "boot": boot_id()}
    folders = {name: root / "0123456789ab" / name for name in ("dead", "live", "old", "young", "elsewhere")}
    for folder in folders.values():
        (folder / "save" / "model").mkdir(parents=True)
        (folder / "save" / "model" / "x.distcp").write_bytes(b"z" * 100)
    (folders["dead"] / ".owner").write_text(json.dumps({**here, "pid": dead_pid()}))
    (folders["live"] / ".owner").write_text(json.dumps({**here, "pid": os.getpid()}))
    (folders["elsewhere"] / ".owner").write_text(json.dumps({"host": "another-host", "boot": "b", "pid": dead_pid()}))
    two_days_ago = time.time() - 2 * 86400
    for path in [folders["old"], *folders["old"].rglob("*")]:
        os.utime(path, (two_days_ago, two_days_ago))

    plan = retention.plan(store, min_age_s=0, staging_root=root)
    assert {Path(e.where).name for e in plan.removals} == {"dead", "old"}
    assert {Path(e.where).name for e in plan.kept} == {"live", "young", "elsewhere"}
    for e in plan.entries:
        assert e.local and e.size == sum(p.stat().st_size for p in Path(e.where).rglob("*") if p.is_file())
    retention.apply(store, plan)
    assert sorted(p.name for p in (root / "0123456789ab").iterdir()) == ["elsewhere", "live", "young"]


@pytest.mark.slow
def test_the_cli_dry_run_lists_and_apply_removes(tmp_path):
    store = open_store(str(tmp_path / "store"))
    checkpoint(store, "runs/r", 1, keep=1)
    checkpoint(store, "runs/r", 2, keep=1)
    put(store, "datasets/half/shards/train-000000.tar", 1500)
    before = snapshot(store)
    env = {**os.environ, "TMPDIR": str(tmp_path), "PRETRAIN_STORE": store.uri}

    def gc(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "pretrain"), "gc", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )

    default = gc()
    assert default.returncode == 0, default.stderr
    assert "nothing to remove" in default.stdout and "within the last 60 min" in default.stdout
    dry = gc("--min-age", "0")
    assert dry.returncode == 0, dry.stderr
    size = sum(len(v) for k, v in before.items() if k.startswith("datasets/half/"))
    assert f"{retention.human_size(size)}  datasets/half/  uncommitted dataset: last written " in dry.stdout
    assert "would remove 2," in dry.stdout and " total" in dry.stdout
    assert snapshot(store) == before
    applied = gc("--min-age", "0", "--apply", "--json")
    assert applied.returncode == 0, applied.stderr
    report = json.loads(applied.stdout)
    assert report["applied"] and sorted(report["removed"]) == ["datasets/half", checkpoint_prefix("runs/r", 1)]
    assert snapshot(store).keys() == before.keys() - under(before, "datasets/half") - under(
        before, checkpoint_prefix("runs/r", 1)
    )


# -- gc while a real run trains ------------------------------------------------------------------------------
def _gc_round(store: Store, staging: Path, seen: dict[str, list]) -> retention.Plan:
    """gc --apply with the age rule off, the most a user can ask of it; what it kept and removed, recorded."""
    plan = retention.plan(store, min_age_s=0, staging_root=staging)
    outcome = retention.apply(store, plan)
    assert not outcome.failed, outcome.failed
    seen["live"] += [e.where for e in plan.kept if e.reason.startswith("its run is live")]
    seen["removed"] += [(e.what, e.where) for e in outcome.removed]
    return plan


@pytest.mark.slow
@pytest.mark.long("two 2-rank trainings with slow uploads, gc run again and again beside them: 65-70 s under make test")
def test_gc_again_and_again_while_a_run_trains_is_killed_and_resumes(tiny_dataset, tmp_path):
    from training.checkpointing import checkpoint as ckpt
    from training.config import ParallelConfig, TrainConfig

    dataset = fresh_copy(tiny_dataset, tmp_path / "store")
    store = open_store(dataset.store)
    cfg = TrainConfig(
        steps=8, micro_batch_size=4, global_batch_size=8, warmup_steps=1, checkpoint_every=1, keep_checkpoints=100, seed=1818
    )
    args = (0.3, dataset, tiny_model(), ParallelConfig(tensor_parallel=1, collective_timeout_s=300), cfg)
    env = {"TMPDIR": str(tmp_path / "tmp")}  # the job's staging, where gc looks (and no other test's)
    (tmp_path / "tmp").mkdir()
    staging = tmp_path / "tmp" / f"{STAGING}-{os.getuid()}"  # the per-user name (runs.staging.root)
    seen: dict[str, list] = {"live": [], "removed": []}

    job = start_launch(tmp_path, train_with_slow_uploads, 2, *args, env=env, log_name="first.log")
    try:
        deadline = time.monotonic() + 400
        while True:  # until gc finds a checkpoint mid-upload after three committed ones: kill the job there
            assert job.poll() is None and time.monotonic() < deadline, (tmp_path / "first.log").read_text()[-3000:]
            plan = _gc_round(store, staging, seen)
            in_flight = [e for e in plan.kept if e.reason.startswith("its run is live")]
            # The run's id as the ranks computed it (the code version is part of it: read from the store).
            run = in_flight[0].run if in_flight else ""
            committed = ckpt.committed_steps(store, run) if run else []
            # The plan is a moment older than this listing: the checkpoint it saw in flight may have committed
            # since (CI: step 3 in flight in the plan, committed in the listing). Kill only on a consistent view.
            if len(committed) >= 3 and in_flight[0].where == checkpoint_prefix(run, committed[-1] + 1):
                break
            time.sleep(0.2)  # a 2-core machine: leave the ranks the CPU
    finally:
        kill_group(job)
    committed = ckpt.committed_steps(store, run)
    uploading = in_flight[0].where
    assert store.children("runs") == [run.removeprefix("runs/")] and len(in_flight) == 1
    assert uploading == checkpoint_prefix(run, committed[-1] + 1) and not store.is_committed(uploading)
    assert [p.name for p in staging.glob("*/*")], "the killed job left no staging folder"

    # Its lease and staging now belong to a dead process (once the ranks are gone: the kill reaches the
    # launcher's group at once, the reaping takes a moment): the half-uploaded checkpoint and the folder go.
    deadline = time.monotonic() + 60
    while retention.lease_holder(store, run, time.time()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not retention.lease_holder(store, run, time.time())
    _gc_round(store, staging, seen)
    assert (retention.UNCOMMITTED_CHECKPOINT, uploading) in seen["removed"] and not store.list(uploading)
    # The job's folder goes; its run's newest committed checkpoint stays on the node for a restart (local_copy).
    assert [p.name for p in staging.glob("*/*")] == [f"kept-{run.removeprefix('runs/')}"], "the dead job's folder was kept"
    assert any(e.reason.startswith(f"run {run.removeprefix('runs/')}'s newest checkpoints kept") for e in plan.kept)
    assert ckpt.committed_steps(store, run) == committed

    job = start_launch(tmp_path, train_with_slow_uploads, 2, *args, env=env, log_name="resumed.log")
    live_before = len(seen["live"])
    try:
        deadline = time.monotonic() + 400
        while job.poll() is None:
            assert time.monotonic() < deadline, (tmp_path / "resumed.log").read_text()[-3000:]
            _gc_round(store, staging, seen)
            time.sleep(0.2)  # a 2-core machine: leave the ranks the CPU
    finally:
        kill_group(job)
    log = (tmp_path / "resumed.log").read_text()
    assert job.returncode == 0, log[-3000:]
    assert f"resumed {run} from step {committed[-1]}" in log
    assert len(seen["live"]) > live_before, "gc never saw the resumed run's checkpoint in flight: the test tested nothing"

    # Nothing the run committed, or was about to commit, was lost: every checkpoint is there and is the one committed.
    assert ckpt.committed_steps(store, run) == list(range(1, cfg.steps + 1))
    for step in ckpt.committed_steps(store, run):
        ckpt.fetch(store, checkpoint_prefix(run, step), tmp_path / "fetched" / str(step))  # digests checked
    assert [r["step"] for r in run_metrics(store, run)] == list(range(1, cfg.steps + 1))
    assert not store.exists(lease_key(run))
    assert not [e for e in retention.plan(store, min_age_s=0, staging_root=staging).entries if e.run == run]
    print(f"gc kept {len(seen['live'])} in-flight checkpoints of the live run, removed {seen['removed']}", file=sys.stderr)
