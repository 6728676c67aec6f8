"""Issue 51 item 9: ``pretrain gc``'s header names one store and its age rule; this host's staging folders, every
store's, follow a rule of their own, so they are listed under their own heading, each saying whose it is."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from cli import retention
from cli.main import main
from runs import staging
from runs.lease import boot_id, this_host
from storage import Store, open_store

MINUTE = 60.0


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def size(folder: Path) -> str:
    return retention.human_size(sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()))


def job_folder(root: Path, store_hash: str, name: str, pid: int) -> Path:
    """A job's staging folder ``<root>/<store hash>/<job>`` with its owner record, as training makes it."""
    folder = root / store_hash / name
    (folder / "save").mkdir(parents=True, mode=0o700)
    (folder / "save" / "model.distcp").write_bytes(b"z" * 100)
    (folder / staging.STAGING_OWNER).write_text(json.dumps({"host": this_host(), "boot": boot_id(), "pid": pid}))
    return folder


def a_store_and_two_stores_staging(tmp_path: Path) -> tuple[Store, Path, Path, Path]:
    """A store with one uncommitted dataset; staging of a live job of this store and of a dead job of another."""
    store = open_store(str(tmp_path / "store"))
    store.put_bytes("datasets/half/shards/train-000000.tar", b"x" * 1500)
    root = tmp_path / "staging-root"
    root.mkdir(mode=0o700)
    ours = job_folder(root, staging.store_root(store.uri).name, "live-job", os.getpid())
    theirs = job_folder(root, "0123456789ab", "dead-job", dead_pid())
    return store, root, ours, theirs


def test_staging_folders_are_listed_under_their_own_rule_saying_whose_they_are(tmp_path):
    store, root, ours, theirs = a_store_and_two_stores_staging(tmp_path)
    twelve_minutes_later = time.time() + 12 * MINUTE
    lines = retention.report_lines(retention.plan(store, now=twelve_minutes_later, staging_root=root))

    heading = next(i for i, line in enumerate(lines) if line.startswith("local checkpoint staging"))
    store_part, staging_part = lines[:heading], lines[heading + 1 :]
    assert store_part[0].startswith(f"store {store.uri}: dry run") and "in the last 60 min is touched" in store_part[0]
    assert not any(str(root) in line for line in store_part), "the store's section lists local folders"
    assert store_part[1:3] == ["nothing to remove", "kept 1:"] and "datasets/half/" in store_part[3]
    assert lines[heading] == (
        f"local checkpoint staging in {root} (this host's jobs, for any store, not only this one): a job's folder goes "
        "once its process is gone, whatever its age, or once unchanged for 24 h; kept otherwise"
    )
    assert staging_part[0] == f"would remove 1, {size(theirs)}:"  # the dead job's, written 12 min ago: its own rule
    assert f"{theirs}/ (another store's)  its process " in staging_part[1] and "last written 12 min ago" in staging_part[1]
    assert staging_part[3] == "kept 1:"
    assert f"{ours}/ (this store's)  written 12 min ago, within the last 60 min" in staging_part[4]
    assert "local checkpoint staging folder:" not in "\n".join(lines)  # the heading says what they are


def test_an_apply_reports_each_part_under_its_heading(tmp_path):
    store, root, ours, theirs = a_store_and_two_stores_staging(tmp_path)
    later = time.time() + 2 * 3600
    plan = retention.plan(store, now=later, staging_root=root)
    removed = size(theirs)
    lines = retention.report_lines(plan, retention.apply(store, plan, now=later))
    heading = next(i for i, line in enumerate(lines) if line.startswith("local checkpoint staging"))
    assert lines[1] == "removed 1, 1.5 KiB:" and "datasets/half/" in lines[2]
    assert lines[heading + 1] == f"removed 1, {removed}:" and f"{theirs}/ (another store's)" in lines[heading + 2]
    assert not theirs.exists() and ours.exists()


def test_no_staging_no_staging_heading(tmp_path):
    store = open_store(str(tmp_path / "store"))
    lines = retention.report_lines(retention.plan(store, staging_root=tmp_path / "none"))
    assert lines[1:] == ["nothing to remove"]


def test_the_cli_and_its_json_name_the_staging_root(tmp_path, capsys, monkeypatch):
    store, root, _ours, _theirs = a_store_and_two_stores_staging(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where runs.staging.root() is
    (tmp_path / "tmp").mkdir()
    root.rename(staging.root())
    assert main(["gc", "--json", "--store", store.uri]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["staging_root"] == str(staging.root()) and planned["store"] == store.uri
    assert main(["gc", "--store", store.uri]) == 0
    assert f"\nlocal checkpoint staging in {staging.root()} (this host's jobs" in capsys.readouterr().out
