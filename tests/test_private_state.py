"""State only its owner can read (issue 32, items 2 and 8): checkpoint staging in the shared temporary
folder, the tracking database and the traceback logs."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from common.errors import write_traceback
from runs import staging
from storage import open_store


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr("tempfile.tempdir", None)  # tempfile caches $TMPDIR: read it again
    return folder


def test_checkpoint_staging_is_the_users_own(tmpdir_env):
    job = staging.store_root("s3://bucket/prefix") / "job"
    staging.make_job_folder(job)
    assert staging.root() == tmpdir_env / f"{staging.STAGING}-{os.getuid()}"  # a name of this user's (finding 10)
    assert mode(staging.root()) == 0o700 and (job / staging.STAGING_OWNER).exists()
    os.chmod(staging.root(), 0o755)  # made by an earlier release, or by hand
    staging.make_job_folder(staging.store_root("s3://bucket/prefix") / "job2")
    assert mode(staging.root()) == 0o700


def test_a_planted_staging_root_is_refused(tmpdir_env, tmp_path):
    """Another user who creates ``$TMPDIR/pretrain-staging`` first, as a link to a folder they read, would
    get every checkpoint this user stages (and could plant links for gc): refused, nothing written there."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    staging.root().symlink_to(theirs)
    with pytest.raises(NotADirectoryError, match="checkpoint staging"):
        staging.make_job_folder(staging.store_root("s3://b/p") / "job")
    assert list(theirs.iterdir()) == []


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_a_staging_root_of_another_user_is_refused(tmpdir_env):
    """Issue 50 finding 10: the root had one name for every user, so another user who made
    ``$TMPDIR/pretrain-staging`` first stopped everyone's training. The name now holds the uid: the shared name
    is nobody's, and only a root under this user's own name, made by another, is refused."""
    for name in (staging.STAGING, "pretrain-shards"):  # the names of earlier releases, taken by another user
        (tmpdir_env / name).mkdir(mode=0o777)
        os.chown(tmpdir_env / name, 65534, 65534)
    staging.make_job_folder(staging.store_root("s3://b/p") / "job")
    assert (staging.root() / staging.store_root("s3://b/p").name / "job" / staging.STAGING_OWNER).exists()
    root = tmpdir_env / f"{staging.STAGING}-{os.getuid()}"
    staging.remove_job_folder(staging.store_root("s3://b/p") / "job")
    root.rmdir()
    root.mkdir(mode=0o777)
    os.chown(root, 65534, 65534)
    with pytest.raises(PermissionError, match="belongs to another user"):
        staging.make_job_folder(staging.store_root("s3://b/p") / "job")
    assert list(root.iterdir()) == []


def test_traceback_logs_are_private(tmp_path, monkeypatch):
    monkeypatch.setenv("PRETRAIN_LOG_DIR", str(tmp_path / "state" / "logs"))
    try:
        raise ValueError("a secret value in a traceback")
    except ValueError as e:
        path = write_traceback(e, "check")
    assert path is not None and "a secret value" in path.read_text()
    assert mode(path) == 0o600 and mode(path.parent) == 0o700


def test_the_tracking_database_is_private(tmp_path):
    from tracking.client import client

    db = tmp_path / "state" / "mlflow.db"
    client(f"sqlite:///{db}").create_experiment("private")
    assert db.stat().st_size > 0  # MLflow's tables, in the file made first
    assert mode(db) == 0o600 and mode(db.parent) == 0o700


def test_the_per_user_store_is_private_and_a_named_one_keeps_its_modes(tmp_path, monkeypatch):
    """Issue 32 item 8: the default store (leases naming hosts and pids, run logs with configs, models) was
    created 0755 under ~/.local/share/pretrain; a store folder the user names keeps the umask's modes."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("PRETRAIN_STORE", raising=False)
    open_store().put_json("runs/r1/lease.json", {"host": "here", "pid": 1})
    assert mode(tmp_path / "data" / "pretrain") == 0o700  # was 0o755
    named = open_store(str(tmp_path / "team-store"))
    named.put_json("runs/r1/lease.json", {"host": "here", "pid": 1})
    umask = os.umask(0o022)
    os.umask(umask)
    assert mode(tmp_path / "team-store") == 0o777 & ~umask  # as mkdir made it
