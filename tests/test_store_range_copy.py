"""``Store.get_range`` and ``Store.copy`` on a local directory and on the S3 test server."""

import os

import pytest

from storage import StoreError
from storage.local import LocalStore
from storage.s3 import S3Store

DATA = bytes(range(256)) * 4  # 1 KiB, every offset's byte distinct within a 256-byte span


def test_get_range_slices_like_bytes(store):
    store.put_bytes("tok/shard.bin", DATA)
    cases = [(0, 10), (100, 300), (1000, 1024), (1000, 5000), (1024, 2000), (5000, 6000), (7, 7), (9, 3), (0, 1024)]
    for start, end in cases:
        assert store.get_range("tok/shard.bin", start, end) == DATA[start:end], (start, end)


def test_get_range_of_an_empty_object(store):
    store.put_bytes("empty.bin", b"")
    assert store.get_range("empty.bin", 0, 10) == b""
    assert store.get_range("empty.bin", 0, 0) == b""


def test_get_range_of_a_missing_key_raises_like_every_read(store):
    for start, end in [(0, 10), (5, 5)]:
        with pytest.raises(StoreError, match="does not exist"):
            store.get_range("tok/missing.bin", start, end)


def test_get_range_refuses_negative_offsets_and_bad_keys(store):
    store.put_bytes("a.bin", DATA)
    with pytest.raises(ValueError, match="negative"):
        store.get_range("a.bin", -4, 10)
    with pytest.raises(StoreError, match="'..'"):
        store.get_range("../a.bin", 0, 10)


def test_copy_survives_later_writes_to_either_key(store, tmp_path):
    store.put_bytes("src/a.bin", b"first")
    store.copy("src/a.bin", "dst/deep/a.bin")
    assert store.get_bytes("dst/deep/a.bin") == b"first"
    store.put_bytes("src/a.bin", b"second")  # a rename over the name: the copy keeps its own bytes
    assert store.get_bytes("dst/deep/a.bin") == b"first"
    other = tmp_path / "other.bin"
    other.write_bytes(b"third")
    store.put_file("src/a.bin", other)
    assert store.get_bytes("dst/deep/a.bin") == b"first"
    store.put_bytes("dst/deep/a.bin", b"fourth")
    assert store.get_bytes("src/a.bin") == b"third"
    etag = store.get_bytes_with_etag("src/a.bin")[1]
    store.put_bytes("src/a.bin", b"fifth", if_match=etag)  # the compare-and-swap path writes anew too
    assert store.get_bytes("dst/deep/a.bin") == b"fourth"


def test_copy_replaces_the_destination_and_leaves_no_temporary_files(store):
    store.put_bytes("s.bin", DATA)
    store.put_bytes("d.bin", b"old")
    store.copy("s.bin", "d.bin")
    store.copy("s.bin", "d.bin")  # locally already one inode: rename(2) does nothing then
    store.copy("s.bin", "s.bin")
    assert store.get_bytes("d.bin") == DATA and store.get_bytes("s.bin") == DATA
    assert [o.key for o in store.list_info("", temporary=True)] == ["d.bin", "s.bin"]


def test_copy_of_a_missing_key_names_it(store):
    with pytest.raises(StoreError, match=r"nothing/here does not exist"):
        store.copy("nothing/here", "dst.bin")
    assert not store.exists("dst.bin")


def test_copy_refuses_bad_keys(store):
    store.put_bytes("ok.bin", b"x")
    with pytest.raises(StoreError, match="is absolute"):
        store.copy("/etc/passwd", "ok2.bin")
    with pytest.raises(StoreError, match="'..'"):
        store.copy("ok.bin", "../escaped.bin")


def test_local_copy_links_where_it_can_and_copies_where_it_cannot(tmp_path, monkeypatch):
    store = LocalStore(str(tmp_path / "store"))
    store.put_bytes("a.bin", DATA)
    store.copy("a.bin", "b.bin")
    assert os.path.samefile(tmp_path / "store" / "a.bin", tmp_path / "store" / "b.bin")  # no bytes moved

    def cross_device(*args, **kwargs):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    store.copy("a.bin", "c/c.bin")
    assert store.get_bytes("c/c.bin") == DATA
    assert not os.path.samefile(tmp_path / "store" / "a.bin", tmp_path / "store" / "c" / "c.bin")
    with pytest.raises(StoreError, match="missing.bin does not exist"):
        store.copy("missing.bin", "d.bin")
    assert [o.key for o in store.list_info("", temporary=True)] == ["a.bin", "b.bin", "c/c.bin"]


def test_s3_copy_in_parts(s3_store, monkeypatch):
    """Above the threshold the managed copy goes in UploadPartCopy parts (5 MiB: S3's smallest)."""
    assert isinstance(s3_store, S3Store)
    monkeypatch.setattr(s3_store, "copy_multipart_threshold", 5 * 1024**2)
    monkeypatch.setattr(s3_store, "copy_multipart_chunk", 5 * 1024**2)
    big = os.urandom(6 * 1024**2 + 17)
    s3_store.put_bytes("big.bin", big)
    parts: list[int] = []
    s3_store.client.meta.events.register("before-call.s3.UploadPartCopy", lambda params, **_: parts.append(1))
    s3_store.copy("big.bin", "big-copy.bin")
    assert len(parts) == 2
    assert s3_store.get_bytes("big-copy.bin") == big
    assert s3_store.get_range("big-copy.bin", 5 * 1024**2 - 3, 5 * 1024**2 + 3) == big[5 * 1024**2 - 3 : 5 * 1024**2 + 3]


def test_copy_onto_itself_is_a_no_op_that_still_wants_the_key(store):
    store.put_bytes("same.bin", b"x")
    store.copy("same.bin", "same.bin")
    assert store.get_bytes("same.bin") == b"x"
    with pytest.raises(StoreError, match="gone.bin does not exist"):
        store.copy("gone.bin", "gone.bin")
