"""A store, or the local staging folder, that runs out of space mid-write: the write fails as one
line naming the store (or folder) and the key, leaves no temporary file and nothing committed,
and the same command completes once there is room.

A real full filesystem: a tmpfs of a few megabytes, mounted for the test (root or CAP_SYS_ADMIN;
skipped, saying so, where mounting is not permitted).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import ClientError

from common.errors import NoSpaceError, user_error_in
from storage import open_store
from storage.s3 import S3Store
from storage.store import COMMIT_MARKER, StoreFullError
from tests.helpers import (
    BIN,
    ROOT,
    distinct_corpus,
    fill_once_present,
    fill_up,
    resize_tmpfs,
    run,
    temp_leftovers,
    tiny_data,
    tiny_tokenizer,
    tmpfs,
    write_config,
)

MB = 1024 * 1024


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MB tmpfs, unmounted after the test whatever happens."""
    with tmpfs(tmp_path / "disk", "1m") as folder:
        yield folder


def test_an_object_bigger_than_the_space_left_names_the_store_and_key(small_disk):
    store = open_store(str(small_disk / "store"))
    store.put_bytes("runs/r/small.json", b"{}")

    for write in (
        lambda: store.put_bytes("runs/r/big.bin", os.urandom(2 * MB)),
        lambda: store.put_bytes("runs/r/big.bin", os.urandom(2 * MB), if_absent=True),  # the fsynced, linked path
        lambda: store.put_file("runs/r/big.bin", _big_file(small_disk.parent, 2 * MB)),
    ):
        with pytest.raises(StoreFullError) as raised:
            write()
        message = str(raised.value)
        assert message.startswith(f"store {store.uri} is full (no space left on device) while writing runs/r/big.bin: ")
        assert "point store: (or $PRETRAIN_STORE) at a larger one" in message and "\n" not in message
        assert isinstance(raised.value, NoSpaceError)
        assert temp_leftovers(small_disk) == []  # the half-written temporary file is gone, and its space with it
        assert store.list("runs/r") == ["runs/r/small.json"]
    assert store.get_bytes("runs/r/small.json") == b"{}"


def test_a_full_disk_at_commit_leaves_the_folder_uncommitted_then_commits_once_freed(small_disk):
    store = open_store(str(small_disk / "store"))
    store.upload_dir(_folder_of_files(small_disk.parent / "staged", {"a.bin": 100_000, "b.bin": 200_000}), "datasets/v1")
    filler = fill_up(small_disk)  # not a byte left for the marker

    with pytest.raises(StoreFullError) as raised:
        store.commit("datasets/v1", {"version": "v1"})
    assert f"while writing datasets/v1/{COMMIT_MARKER}:" in str(raised.value)
    assert not store.is_committed("datasets/v1") and temp_leftovers(small_disk) == []

    filler.unlink()
    store.commit("datasets/v1", {"version": "v1"})
    assert store.is_committed("datasets/v1") and store.get_json(f"datasets/v1/{COMMIT_MARKER}") == {"version": "v1"}


def test_an_upload_that_runs_out_names_the_first_key_that_did_not_fit(small_disk):
    store = open_store(str(small_disk / "store"))
    staged = _folder_of_files(small_disk.parent / "staged", {f"shard-{i}.tar": 400_000 for i in range(3)})

    with pytest.raises(StoreFullError, match=r"while writing datasets/v1/shard-2\.tar: "):
        store.upload_dir(staged, "datasets/v1")
    assert store.list("datasets/v1") == ["datasets/v1/shard-0.tar", "datasets/v1/shard-1.tar"]
    assert not store.is_committed("datasets/v1") and temp_leftovers(small_disk) == []

    resize_tmpfs(small_disk, "4m")  # an operator grows the volume: the same upload completes
    store.upload_dir(staged, "datasets/v1")
    store.commit("datasets/v1")
    assert [store.get_bytes(f"datasets/v1/shard-{i}.tar") for i in range(3)] == [
        (staged / f"shard-{i}.tar").read_bytes() for i in range(3)
    ]


def test_a_download_into_a_full_folder_names_the_folder(small_disk, tmp_path):
    store = open_store(str(tmp_path / "store"))
    store.put_bytes("models/gpt/1/weights.bin", os.urandom(2 * MB))

    with pytest.raises(NoSpaceError) as raised:
        store.download("models/gpt/1/weights.bin", small_disk / "dl" / "weights.bin")
    message = str(raised.value)
    assert message.startswith(f"local folder {small_disk / 'dl'} is full (no space left on device) while writing weights.bin")
    assert store.url("models/gpt/1/weights.bin") in message
    assert temp_leftovers(small_disk) == [] and not (small_disk / "dl" / "weights.bin").exists()


@pytest.mark.slow
def test_full_local_staging_says_which_folder_and_to_set_tmpdir(small_disk, tmp_path, monkeypatch):
    """prepare_dataset writes a partition's filtered text (the scan) and token stream (encode) in the
    temporary folder before uploading them: that folder filling up is one NoSpaceError (as ``pretrain
    run`` prints it) that points at TMPDIR, not a bare OSError."""
    from data_prep.prepare import prepare_dataset

    monkeypatch.setattr(tempfile, "tempdir", str(small_disk))
    corpus = distinct_corpus(tmp_path / "corpus", n=200, words_per_doc=2000)  # ~2.5 MB of tokens to stage
    store = open_store(str(tmp_path / "store"))

    with pytest.raises(Exception) as raised:
        prepare_dataset(tiny_data(sources=[str(corpus)], max_documents=0, workers=0), tiny_tokenizer(), store)
    error = user_error_in(raised.value)
    assert isinstance(error, NoSpaceError), raised.value
    assert "no space left on device" in str(error) and "set TMPDIR to a folder with more space" in str(error)
    assert str(small_disk) in str(error) and "a partition's filtered text" in str(error)  # the scan's, the first
    assert not list((tmp_path / "store").rglob(COMMIT_MARKER))
    assert list(small_disk.iterdir()) == []  # the staging folder went with the failure


@pytest.mark.parametrize(
    "code, status",
    [("QuotaExceeded", 403), ("XMinioAdminBucketQuotaExceeded", 400), ("XMinioStorageFull", 507), ("InsufficientStorage", 507)],
)
def test_s3_answers_that_mean_no_space_name_the_store_and_key(code, status):
    """SeaweedFS 4.48 cannot fail a write for a quota: ``s3.bucket.quota.enforce -apply`` turns an
    over-quota bucket read-only afterwards, and a PUT to it then gets a generic 500 InternalError.
    The codes servers with quotas send (Ceph, MinIO, HTTP 507) are classified from botocore's
    own exception, as a PutObject or an upload_file would raise it."""
    store = S3Store("s3://bucket/prefix")
    answer = {"Error": {"Code": code, "Message": "Bucket quota exceeded."}, "ResponseMetadata": {"HTTPStatusCode": status}}
    put_error = ClientError(answer, "PutObject")
    try:
        try:
            raise put_error
        except ClientError as e:
            raise S3UploadFailedError(f"Failed to upload x to bucket/prefix/k: {e}")  # noqa: B904 - as boto3 raises it
    except S3UploadFailedError as e:
        upload_error = e

    for err in (put_error, upload_error):
        explained = store._explain(err, "runs/r/checkpoints/step-0000006/model/__0_0.distcp")
        assert isinstance(explained, StoreFullError)
        assert str(explained).startswith(
            f"store s3://bucket/prefix is full (S3 {code}: Bucket quota exceeded) while writing "
            "runs/r/checkpoints/step-0000006/model/__0_0.distcp: raise bucket 'bucket''s quota, free space in it or point store:"
        )


LEAVE = 256 * 1024
"""Bytes left free once validation is committed: room for what training writes before its first
checkpoint (the run's lease, metrics, step times: tens of KB), not for the checkpoint (~1.8 MB for the
tiny model, checked below against the checkpoint the last run commits)."""


@pytest.mark.slow
@pytest.mark.long("three pipelines on one store: full at validation, full at the first save, then complete")
def test_pretrain_run_into_a_store_that_fills_fails_in_one_line_each_time_then_completes_once_grown(tmp_path):
    """As reported, twice on one store (each failure is one line naming the store and the key, exit
    status 2, nothing after the last committed stage looks complete), then the same command completes:

    1. the 3 MB store is filled to its last byte once the dataset is committed (and its work files removed),
       so validation cannot write its report; the dataset is committed, the validation is not;
    2. grown to 16 MB, the same command validates; then the disk is filled to LEAVE bytes and the first
       checkpoint save fails on a rank: the job's one line names that rank, the key and the full
       traceback log, which holds the rank's own traceback and torch's report;
    3. grown to 64 MB, the same command completes: one version, committed, from the dataset of step 1."""
    from registry.registry import list_models

    corpus = distinct_corpus(tmp_path / "corpus")
    env = {**os.environ, "HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    for name in ("PRETRAIN_STORE", "PRETRAIN_LOG_DIR", "XDG_STATE_HOME", "XDG_DATA_HOME"):
        env.pop(name, None)
    with tmpfs(tmp_path / "disk", "3m") as disk:
        store_dir = disk / "store"
        config = write_config(tmp_path / "tiny.yaml", str(store_dir), data={"sources": [str(corpus)]})
        command = [str(BIN / "pretrain"), "run", "--config", str(config)]

        # 1. Full during validation. The output goes to files: the preparation logs more than a pipe holds
        # while this test waits for its commit.
        with open(tmp_path / "step1.out", "w") as out, open(tmp_path / "step1.err", "w") as err:
            failed = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=err, text=True)
            try:
                fill_once_present(failed, f"datasets/*/{COMMIT_MARKER}", store_dir, disk, 0, gone="datasets/work-*")
                failed.wait(timeout=900)
            finally:
                if failed.poll() is None:
                    failed.kill()
                    failed.wait()
        stderr = (tmp_path / "step1.err").read_text()
        assert failed.returncode == 2, stderr[-3000:]
        line = one_error_line(stderr)
        assert "Traceback" not in stderr and "OSError" not in stderr
        pattern = (
            rf"error: validate_data: store {re.escape(str(store_dir))} is full \(no space left on device\) "
            r"while writing datasets/([0-9a-f]+)/validation/\S+: free space there or point store: "
        )
        match = re.match(pattern, line)
        assert match, line
        version = match[1]
        markers = sorted(p.relative_to(store_dir).as_posix() for p in store_dir.rglob(COMMIT_MARKER))
        assert markers == [f"datasets/{version}/{COMMIT_MARKER}"]  # the dataset fitted; nothing after it looks complete
        assert temp_leftovers(store_dir) == []

        # 2. Full during the first checkpoint save.
        resize_tmpfs(disk, "16m")
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # The validation report takes what it takes; then only LEAVE bytes stay free.
            fill_once_present(proc, f"datasets/*/validation/{COMMIT_MARKER}", store_dir, disk, LEAVE)
            _, stderr = proc.communicate(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 2, stderr[-4000:]
        line = one_error_line(stderr)
        pattern = (
            # ", completing": the save failed in the background, raised at the step loop's wait for it.
            r"error: train_model: rank (\d) failed first, during checkpoint save at step 6(?:, completing)?: StoreFullError: "
            rf"store {re.escape(str(store_dir))} is full \(no space left on device\) while writing "
            r"(runs/[0-9a-f]+/checkpoints/step-0000006/\S+): free space there or point store: .* nothing partial was "
            r"committed \(full traceback: (\S+)\)"
        )
        match = re.fullmatch(pattern, line)
        assert match, line
        assert "Traceback" not in line and "=====" not in line and len(line) < 1000
        log = Path(match[3]).read_text()  # the whole report: the rank's own traceback, torch's report
        assert "training/checkpointing/saving.py" in log and "Root Cause (first observed failure)" in log
        assert not list((store_dir / "runs").rglob(COMMIT_MARKER))  # nothing of the run looks complete
        assert temp_leftovers(store_dir) == []

        # 3. Grown: the same command completes.
        resize_tmpfs(disk, "64m")
        done = run(command, env)
        assert done.returncode == 0, done.stderr[-3000:]
        store = open_store(str(store_dir))
        assert store.is_committed(f"datasets/{version}/validation")
        checkpoint = match[2].split("/checkpoints/")[0] + "/checkpoints/step-0000006"
        assert store.is_committed(checkpoint)
        weight = sum(p.stat().st_size for p in (store_dir / checkpoint).rglob("*") if p.is_file())
        assert weight > 4 * LEAVE, weight  # the space left could never hold the checkpoint
        assert [(m["name"], m["version"]) for m in list_models(store)] == [("gpt-e2e", 1)]  # one version, committed
        assert store.get_json("models/gpt-e2e/1/card.json")["lineage"]["dataset_version"] == version
        assert temp_leftovers(store_dir) == []


def one_error_line(stderr: str) -> str:
    """The one ``error:`` line of a failed ``pretrain run``, its last line (printed for pytest -s)."""
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == stderr.strip().splitlines()[-1], stderr[-4000:]
    print(errors[0])
    return errors[0]


def _big_file(folder: Path, size: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "big.bin"
    path.write_bytes(os.urandom(size))
    return path


def _folder_of_files(folder: Path, sizes: dict[str, int]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, size in sizes.items():
        (folder / name).write_bytes(os.urandom(size))
    return folder
