import os
import threading
from pathlib import Path

import pytest

from storage import AlreadyCommitted, PreconditionFailed, StoreError, open_store
from storage.s3 import S3Store


def test_put_get_list_roundtrip(store, tmp_path):
    store.put_bytes("a/b/one.bin", b"1")
    store.put_json("a/two.json", {"x": 2})
    assert store.get_bytes("a/b/one.bin") == b"1"
    assert store.get_json("a/two.json") == {"x": 2}
    assert store.list("a/") == ["a/b/one.bin", "a/two.json"]
    assert store.children("a") == ["b"]
    assert store.exists("a/two.json") and not store.exists("a/missing")
    src = tmp_path / "dir"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f.txt").write_text("hello")
    store.upload_dir(src, "up")
    store.download_dir("up", tmp_path / "back")
    assert (tmp_path / "back" / "sub" / "f.txt").read_text() == "hello"
    store.delete_prefix("up")
    assert store.list("up") == []


def test_commit_marker_is_conditional(store):
    store.put_bytes("d/data", b"x")
    assert not store.is_committed("d")
    store.commit("d", {"n": 1})
    assert store.is_committed("d")
    with pytest.raises(AlreadyCommitted):
        store.commit("d", {"n": 2})
    assert store.get_json("d/_COMMITTED") == {"n": 1}


def test_missing_key_names_the_object(store):
    with pytest.raises(StoreError, match="does not exist"):
        store.get_bytes("nothing/here")


def test_s3_rejects_bad_credentials_with_a_clear_error(s3_server, monkeypatch):
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    store = open_store(f"s3://{s3_server.bucket}/bad-creds")
    with pytest.raises(StoreError, match="rejected the credentials"):
        store.check()


def test_s3_missing_bucket(s3_env):
    with pytest.raises(StoreError, match="does not exist"):
        open_store("s3://no-such-bucket/x").check()


def test_unsupported_uri():
    with pytest.raises(StoreError, match="unsupported store URI"):
        open_store("gs://bucket/x")


# -- durability and temporary names ------------------------------------------------------


def test_commit_makes_everything_under_the_prefix_durable_before_the_marker(tmp_path, monkeypatch):
    import storage.local as store_module

    store = open_store(str(tmp_path / "store"))
    store.put_bytes("runs/r/step-1/meta.json", b"{}")
    src = tmp_path / "w.bin"
    src.write_bytes(b"w" * 4096)
    store.put_file("runs/r/step-1/model/w.bin", src)
    other = tmp_path / "store" / "runs" / "r" / "step-1" / "model" / "by-another-process.bin"
    other.write_bytes(b"x")  # written beside the store API (another rank, say)

    events: list[tuple[str, str]] = []
    real_fsync, real_link = store_module._fsync_path, os.link
    monkeypatch.setattr(store_module, "_fsync_path", lambda p: (events.append(("fsync", str(p))), real_fsync(p)))
    monkeypatch.setattr(store_module.os, "link", lambda a, b: (events.append(("link", str(b))), real_link(a, b)))
    store.commit("runs/r/step-1", {"step": 1})

    root = (tmp_path / "store").resolve()
    step = root / "runs" / "r" / "step-1"
    link_at = events.index(("link", str(step / "_COMMITTED")))
    synced_before = {path for kind, path in events[:link_at] if kind == "fsync"}
    needed = {str(p) for p in step.rglob("*") if p.name != "_COMMITTED"} | {str(step), str(root / "runs" / "r"), str(root)}
    assert needed <= synced_before, needed - synced_before
    assert any(Path(p).name.startswith(".tmp-") for p in synced_before)  # the marker's content
    assert ("fsync", str(step)) in events[link_at + 1 :]  # the marker's name
    assert store.get_json("runs/r/step-1/_COMMITTED") == {"step": 1}
    assert not [p for p in root.rglob(".tmp-*")]


@pytest.mark.slow
def test_the_marker_is_created_once_under_concurrent_commits(store):
    store.put_bytes("d/data", b"x")
    results: list[object] = []

    def attempt(n: int) -> None:
        try:
            store.commit("d", {"n": n})
            results.append(n)
        except AlreadyCommitted as e:
            results.append(e)

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if isinstance(r, int)]
    assert len(winners) == 1 and len(results) == 6
    assert store.get_json("d/_COMMITTED") == {"n": winners[0]}


def test_a_half_deleted_prefix_never_looks_committed(store, monkeypatch):
    """delete_prefix removes the marker first: interrupted after it, nothing looks complete."""
    for i in range(3):
        store.put_bytes(f"ckpt/step-1/part-{i}", b"x")
    store.commit("ckpt/step-1")

    class Interrupted(Exception):
        pass

    def interrupted(*args, **kwargs):
        raise Interrupted

    if isinstance(store, S3Store):
        monkeypatch.setattr(store.client, "delete_objects", interrupted)
    else:
        import storage.local as store_module

        monkeypatch.setattr(store_module.shutil, "rmtree", interrupted)
    with pytest.raises(Interrupted):
        store.delete_prefix("ckpt/step-1")
    assert not store.is_committed("ckpt/step-1")
    assert store.exists("ckpt/step-1/part-0")  # the data was still there when it stopped
    monkeypatch.undo()
    store.delete_prefix("ckpt/step-1")
    assert store.list("ckpt/step-1") == []


def test_downloads_use_a_temporary_name_of_their_own(store, tmp_path):
    body = os.urandom(256 * 1024)
    store.put_bytes("m/w.bin", body)
    dest = tmp_path / "dl" / "w.bin"
    dest.parent.mkdir()
    (tmp_path / "dl" / "w.bin.part").mkdir()  # the name every process used to share
    errors: list[BaseException] = []

    def download() -> None:
        try:
            store.download("m/w.bin", dest)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=download) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert dest.read_bytes() == body
    assert sorted(p.name for p in dest.parent.iterdir()) == ["w.bin", "w.bin.part"]


def test_concurrent_writes_of_one_key_never_collide(tmp_path):
    store = open_store(str(tmp_path / "store"))
    sources = []
    for n in range(6):
        src = tmp_path / f"src-{n}"
        src.write_bytes(bytes([n]) * 100_000)
        sources.append(src)
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            for _ in range(5):
                store.put_file("k/w.bin", sources[n])
                store.put_bytes("k/small", bytes([n]) * 10)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert store.get_bytes("k/w.bin") in {s.read_bytes() for s in sources}
    assert sorted(p.name for p in (tmp_path / "store" / "k").iterdir()) == ["small", "w.bin"]


# ----------------------------------------------------------------------------------------------
# Conditional writes: create only if absent, replace only if unchanged (ETag)


def test_replace_only_if_unchanged(store):
    """put_bytes(if_match=etag) replaces the object read with that ETag and nothing else: a stale
    ETag, a wrong one or a missing object is refused and leaves the object as it was (S3: the
    server's If-Match; SeaweedFS answers 412)."""
    with pytest.raises(StoreError, match="does not exist"):
        store.get_bytes_with_etag("aliases/prod.json")
    with pytest.raises(PreconditionFailed):
        store.put_bytes("aliases/prod.json", b"v0", if_match="0" * 32)  # nothing there to replace
    store.put_bytes("aliases/prod.json", b"v1", if_absent=True)
    data, etag = store.get_bytes_with_etag("aliases/prod.json")
    assert data == b"v1" and etag
    store.put_bytes("aliases/prod.json", b"v2", if_match=etag)
    assert store.get_bytes("aliases/prod.json") == b"v2"
    with pytest.raises(PreconditionFailed, match="changed since it was read"):
        store.put_bytes("aliases/prod.json", b"v3", if_match=etag)  # stale: v1's ETag
    assert store.get_bytes_with_etag("aliases/prod.json")[0] == b"v2"
    with pytest.raises(ValueError):
        store.put_bytes("aliases/prod.json", b"v3", if_absent=True, if_match=etag)
    with pytest.raises(AlreadyCommitted):
        store.put_json("aliases/prod.json", {"v": 4}, if_absent=True)
    assert store.list("aliases/") == ["aliases/prod.json"]  # the local lock file is no object


def test_compare_and_swap_loses_no_update_under_contention(store):
    """Four writers increment one counter by read, change, conditional write, retry on a lost
    race: every increment lands (no lost update), on the local store and on the real server."""
    store.put_json("ctr.json", {"n": 0}, if_absent=True)
    clients = [open_store(store.uri) for _ in range(4)]

    def work(i: int) -> None:
        for _ in range(5):
            while True:
                value, etag = clients[i].get_json_with_etag("ctr.json")
                try:
                    clients[i].put_json("ctr.json", {"n": value["n"] + 1}, if_match=etag)
                    break
                except PreconditionFailed:
                    continue  # lost the race: read again

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.get_json("ctr.json") == {"n": 20}


def test_files_are_created_only_if_absent(store, tmp_path):
    """put_file/upload_dir with if_absent never replace an object (S3: also in parts, where the
    conditional CompleteMultipartUpload is what refuses it)."""
    if isinstance(store, S3Store):
        store.multipart_threshold = store.multipart_chunk = 5 * 1024 * 1024  # S3's smallest part
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(11 * 1024 * 1024))  # three parts on S3
    small = tmp_path / "small.bin"
    small.write_bytes(b"small")
    store.put_file("v/1/big.bin", big, if_absent=True)
    store.put_file("v/1/small.bin", small, if_absent=True)
    assert store.get_bytes("v/1/big.bin") == big.read_bytes()
    other = tmp_path / "other.bin"
    other.write_bytes(os.urandom(6 * 1024 * 1024))
    for path in (other, small):
        with pytest.raises(AlreadyCommitted):
            store.put_file("v/1/big.bin", path, if_absent=True)
    assert store.get_bytes("v/1/big.bin") == big.read_bytes()
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "small.bin").write_bytes(b"replayed")
    with pytest.raises(AlreadyCommitted):
        store.upload_dir(folder, "v/1", if_absent=True)
    assert store.get_bytes("v/1/small.bin") == b"small"
    if isinstance(store, S3Store):  # no multipart upload left behind by the refused one
        assert not store.client.list_multipart_uploads(Bucket=store.bucket, Prefix=store.prefix).get("Uploads")


def test_a_child_forked_while_a_swap_holds_the_folder_lock_never_keeps_it(tmp_path, monkeypatch):
    """A fork during a compare-and-swap (the lease thread's, while megatron's async save forks a manager
    server that lives the whole run) must not leave the child holding the folder's flock: the next swap
    in the folder (the lease's refresh) would wait for it forever. Hung a demo run in CI once."""
    import fcntl
    import time

    from storage import local

    store = open_store(str(tmp_path))
    store.put_json("runs/r/lease.json", {"n": 0})
    children: list[int] = []
    real_flock = fcntl.flock

    def flock_then_fork(fd: int, operation: int) -> None:
        real_flock(fd, operation)
        if not children:
            pid = os.fork()
            if pid == 0:  # the long-lived child: it never writes, and holds whatever it inherited
                time.sleep(30)
                os._exit(0)
            children.append(pid)

    monkeypatch.setattr(local.fcntl, "flock", flock_then_fork)
    try:
        _, etag = store.get_json_with_etag("runs/r/lease.json")
        store.put_json("runs/r/lease.json", {"n": 1}, if_match=etag)  # the child forks while the lock is held
        monkeypatch.setattr(local.fcntl, "flock", real_flock)
        _, etag = store.get_json_with_etag("runs/r/lease.json")
        second = threading.Thread(target=store.put_json, args=("runs/r/lease.json", {"n": 2}), kwargs={"if_match": etag})
        second.start()
        second.join(timeout=10)
        assert not second.is_alive(), "the second swap waits for the lock a forked child kept"
        assert store.get_json("runs/r/lease.json") == {"n": 2}
    finally:
        for pid in children:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
