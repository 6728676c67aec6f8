import os
import threading
from pathlib import Path

import pytest

from storage import AlreadyCommitted, StoreError, open_store
from storage.store import S3Store


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
    import storage.store as store_module

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
        import storage.store as store_module

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
