"""``pretrain gc`` cannot be turned against the store or the machine: keys outside the store's layout,
links in the shared staging folder, junk in a lease, control characters in a key (issue 32, items 1, 2
and 10). Each test reproduces the attack through gc's public calls."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli import retention
from runs.lease import boot_id, this_host
from runs.staging import STAGING, STAGING_OWNER
from storage import Store, StoreError, open_store

LATER = 48 * 3600.0  # everything written is two days old when gc looks


def registered_v1_and_an_old_claim(store: Store) -> None:
    """Version 1 committed with its registration record; version 2 claimed and abandoned."""
    store.put_json("models/gpt/1/card.json", {"lineage": {"training_run": "runs/r", "training_steps": 1}})
    store.commit("models/gpt/1")
    store.put_json("models/gpt/registrations/first.json", {"version": 1})
    store.put_json("models/gpt/2/_CLAIMED", {"claimed": "2026-01-01T00:00:00+00:00"})


def test_a_folder_object_is_no_registration_record(s3_store):
    """S3 keeps a folder object (``models/gpt/registrations/``): holding ``{"version": 2}`` it read as the
    record of the abandoned claim, and deleting that "record" removed the whole registrations folder with
    the record of committed version 1 (gc's second look agreed: the folder object was still there)."""
    registered_v1_and_an_old_claim(s3_store)
    planted = "models/gpt/registrations/"
    s3_store.client.put_object(Bucket=s3_store.bucket, Key=s3_store._key(planted), Body=b'{"version": 2}')
    later = time.time() + LATER

    plan = retention.plan(s3_store, now=later, staging_root=Path("/nonexistent"))
    claim = [e for e in plan.removals if e.where == "models/gpt/2"]
    assert claim and claim[0].records == [], claim  # the planted key names nothing
    kept = {e.where: e.reason for e in plan.kept}
    assert "a key outside the store's layout" in kept[planted], kept
    outcome = retention.apply(s3_store, plan, now=later)
    assert not outcome.failed, outcome.failed
    assert s3_store.get_json("models/gpt/registrations/first.json") == {"version": 1}
    assert s3_store.is_committed("models/gpt/1") and not s3_store.exists("models/gpt/2/_CLAIMED")
    report = "\n".join(retention.report_lines(plan, outcome))
    assert f"{planted}  a key outside the store's layout (has an empty part)" in report, report


@pytest.fixture
def aws_like_store(monkeypatch) -> Iterator[Store]:
    """A store on moto's S3 server on 127.0.0.1, which keeps ``//`` in keys as AWS S3 does (SeaweedFS,
    the project's test server, folds it): the store where the planted ``datasets//x`` was found."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        for name, value in {
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "AWS_ACCESS_KEY_ID": "moto",
            "AWS_SECRET_ACCESS_KEY": "moto",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            monkeypatch.setenv(name, value)
        store = open_store("s3://gc-bucket/pretrain")
        store.client.create_bucket(Bucket="gc-bucket")
        yield store
    finally:
        server.stop()


def test_a_doubled_slash_never_names_a_top_folder(aws_like_store):
    """On a store that keeps ``//``, one planted object ``datasets//x`` made gc form the entry ``datasets/``,
    call it an uncommitted dataset and delete every committed dataset with it (and ``runs//y`` the runs)."""
    store = aws_like_store
    for version in ("v1", "v2"):
        store.put_json(f"datasets/{version}/manifest.json", {"version": version})
        store.commit(f"datasets/{version}")
    store.put_json("runs/r1/checkpoints/step_1/meta.json", {})
    store.commit("runs/r1/checkpoints/step_1")
    planted = ["datasets//x", "runs//y", "models//gpt/1/card.json"]
    for key in planted:
        store.client.put_object(Bucket=store.bucket, Key=store._key(key), Body=b"{}")
    assert set(planted) <= set(store.list("")), "the server folded '//': this test would prove nothing"
    later = time.time() + LATER

    plan = retention.plan(store, now=later, staging_root=Path("/nonexistent"))
    removed = [e.where for e in plan.removals]
    assert not any(where.rstrip("/") in ("datasets", "runs", "models", "") for where in removed), removed
    kept = {e.where: e.reason for e in plan.kept}
    for key in planted:
        assert "a key outside the store's layout" in kept.get(key, ""), (key, kept)
    outcome = retention.apply(store, plan, now=later)
    assert not outcome.failed, outcome.failed
    assert store.is_committed("datasets/v1") and store.is_committed("datasets/v2")
    assert store.is_committed("runs/r1/checkpoints/step_1")
    assert set(planted) <= set(store.list(""))  # unknown keys are kept, for a person to look at


def test_the_store_refuses_to_delete_a_top_folder_whole(store):
    """``datasets//x`` on AWS S3 made gc name ``datasets/`` one uncommitted dataset and delete it; the S3
    server here folds ``//`` (so gc's own check is tested above), and the store itself refuses."""
    store.put_json("datasets/v1/manifest.json", {})
    store.commit("datasets/v1")
    for prefix in ("datasets/", "datasets", "runs/", "models", ""):
        with pytest.raises(StoreError, match="refusing to delete"):
            store.delete_prefix(prefix)
    assert store.is_committed("datasets/v1")
    store.delete_prefix("datasets/v1")  # an entry still goes
    assert not store.exists("datasets/v1/manifest.json")


def old(path: Path) -> None:
    for folder, _dirs, names in os.walk(path):
        for name in [None, *names]:
            target = folder if name is None else os.path.join(folder, name)
            os.utime(target, (time.time() - LATER, time.time() - LATER), follow_symlinks=False)


def victim_home(tmp_path: Path) -> Path:
    home = tmp_path / "victim"
    (home / "projects" / "thesis").mkdir(parents=True)
    (home / "projects" / "thesis" / "chapter1.tex").write_text("years of work")
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_ed25519").write_text("key")
    old(home)
    return home


def test_gc_never_follows_a_link_out_of_the_staging_root(tmp_path):
    """The staging root sits in the shared temporary folder: a link planted as a store folder
    (``pretrain-staging/evil -> /home/victim``), or as the root itself, made gc judge the victim's
    folders as staging leftovers older than 24 h and remove them."""
    home = victim_home(tmp_path)
    store = open_store(str(tmp_path / "store"))
    root = tmp_path / "tmp" / STAGING
    root.mkdir(parents=True)
    (root / "evil").symlink_to(home)
    real = root / "0123456789ab" / "job"  # a real leftover beside it: gc still removes that one
    (real / "save").mkdir(parents=True)
    (real / STAGING_OWNER).write_text(json.dumps({"host": "elsewhere", "boot": "x", "pid": 1}))
    old(real)
    later = time.time() + LATER

    plan = retention.plan(store, now=later, staging_root=root)
    assert [e.where for e in plan.entries if e.local] == [str(real)]
    retention.apply(store, plan, now=later)
    assert (home / "projects" / "thesis" / "chapter1.tex").read_text() == "years of work"
    assert not real.exists()

    linked_root = tmp_path / "tmp2" / STAGING
    linked_root.parent.mkdir()
    linked_root.symlink_to(home)
    plan = retention.plan(store, now=later, staging_root=linked_root)
    assert [(e.remove, e.reason) for e in plan.entries if e.local] == [
        (False, "a link or not a folder: gc walks only a root of yours")
    ]
    assert (home / ".ssh" / "id_ed25519").exists()


@pytest.mark.parametrize("caught_by", ["the check before the removal", "the removal itself"])
def test_a_link_swapped_in_after_the_plan_is_not_followed(tmp_path, monkeypatch, caught_by):
    """A store folder swapped for a link to the victim's home after the plan. The check just before the removal
    and the removal itself are two steps: a link swapped in between them (a loop of
    ``renameat2(RENAME_EXCHANGE)`` wins that race now and then) was followed by the delete by path (issue 50
    finding 1). The delete now goes through folder descriptors opened without following links."""
    store = open_store(str(tmp_path / "store"))
    home = victim_home(tmp_path)
    root = tmp_path / "tmp" / STAGING
    job = root / "0123456789ab" / "projects"
    job.mkdir(parents=True)
    old(root)
    later = time.time() + LATER
    plan = retention.plan(store, now=later, staging_root=root)
    assert [e.where for e in plan.removals] == [str(job)]
    store_dir = job.parent
    store_dir.rename(tmp_path / "moved")
    store_dir.symlink_to(home)  # <root>/0123456789ab -> the victim's home, which has a projects/ folder
    if caught_by == "the removal itself":
        monkeypatch.setattr(retention, "_no_link_on_the_way", lambda folder: True)  # the swap came after this check
    outcome = retention.apply(store, plan, now=later)
    assert not outcome.removed
    if caught_by == "the removal itself":
        assert outcome.failed[0][1] == "[Errno 20] Not a directory: '0123456789ab'", outcome.failed
    else:
        assert outcome.skipped[0][1] == "a symbolic link on its path: gc never follows one", outcome.skipped
    assert (home / "projects" / "thesis" / "chapter1.tex").read_text() == "years of work"


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_a_staging_root_another_user_made_is_not_walked(tmp_path):
    """Issue 50 finding 1: gc walked a staging root without checking its owner. A second user who made it, filled
    it with dead-owner job folders and swapped a folder for a link to the victim's home in a loop made the victim's
    ``gc --apply`` delete folders of the victim's home. Now gc walks only a root of the user's own."""
    home = victim_home(tmp_path)
    store = open_store(str(tmp_path / "store"))
    root = tmp_path / "tmp" / STAGING
    job = root / "0123456789ab" / "projects"
    job.mkdir(parents=True)
    (job / STAGING_OWNER).write_text(json.dumps({"host": "elsewhere", "boot": "x", "pid": 1}))
    old(root)
    for folder in (root, job.parent, job):
        os.chmod(folder, 0o777)
        os.chown(folder, 65534, 65534)  # the other user's
    later = time.time() + LATER
    plan = retention.plan(store, now=later, staging_root=root)
    assert [(e.where, e.remove) for e in plan.entries if e.local] == [(str(root), False)]
    assert "owned by uid 65534, not you: gc walks only a root of yours" in "\n".join(retention.report_lines(plan))
    os.rename(job.parent, tmp_path / "aside")
    job.parent.symlink_to(home)  # what the swap loop makes it at the moment gc deletes
    assert not retention.apply(store, plan, now=later).removed
    assert (home / "projects" / "thesis" / "chapter1.tex").read_text() == "years of work"


def test_a_lease_or_owner_with_a_pid_no_process_can_have(tmp_path):
    """A lease naming this host with ``pid: 2**64`` crashed gc with OverflowError; a staging owner too."""
    store = open_store(str(tmp_path / "store"))
    here = {"host": this_host(), "boot": boot_id()}
    store.put_json("runs/r1/lease.json", {**here, "pid": 2**64, "heartbeat": time.time()})
    store.put_json("runs/r1/checkpoints/step-0000002/meta.json", {"step": 2})  # uncommitted: the lease decides
    root = tmp_path / "tmp" / STAGING
    job = root / "0123456789ab" / "job"
    job.mkdir(parents=True)
    (job / STAGING_OWNER).write_text(json.dumps({**here, "pid": 2**64}))

    plan = retention.plan(store, now=time.time() + 60, staging_root=root)  # young: nothing to remove anyway
    entries = {e.where: e for e in plan.entries}
    assert not entries["runs/r1/checkpoints/step-0000002"].remove
    assert not entries[str(job)].remove
    assert retention.report_lines(plan)


def test_control_characters_in_a_key_are_printed_escaped(tmp_path):
    store = open_store(str(tmp_path / "store"))
    store.put_bytes("scratch/\x1b[2J\x1b[31mclean\x07.txt", b"x")
    lines = retention.report_lines(retention.plan(store, staging_root=tmp_path / "none"))
    text = "\n".join(lines)
    assert "\x1b" not in text and "\x07" not in text
    assert "scratch/" in text
    store.put_bytes("runs/r\x1b]0;owned\x07/mystery.bin", b"{}")
    text = "\n".join(retention.report_lines(retention.plan(store, staging_root=tmp_path / "none")))
    assert "\x1b" not in text and "\\x1b]0;owned\\x07" in text, text
