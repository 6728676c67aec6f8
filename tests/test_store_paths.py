"""Keys stay inside their folders: every key the store maps to a local path is checked.

A shared bucket can hold any key (AWS S3 stores ``a/../../x`` verbatim; SeaweedFS refuses
it, so on S3 a hostile key is planted in the listing the way AWS would return it). A folder
listing means ``prefix/``: ``models/gpt/1`` never reaches ``models/gpt/10/...``.
"""

from __future__ import annotations

import os

import pytest

from storage import StoreError, open_store
from storage.s3 import S3Store
from storage.store import check_key

HOSTILE_KEYS = ["../x", "/abs/x", "a/../../x", "a//b", "a\\b", "a/./b", "a/b/..", "", "a/"]


def files_under(folder) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} if folder.exists() else set()


def plant_listing(store, monkeypatch, key: str) -> None:
    """Make ``key`` appear in the store's listings, as a bucket written by someone else would."""
    if isinstance(store, S3Store):
        real = store.client.get_paginator

        def get_paginator(name):
            paginator = real(name)

            class Planted:
                def paginate(self, **kwargs):
                    pages = list(paginator.paginate(**kwargs))
                    full = store._key(key)
                    if full.startswith(kwargs.get("Prefix", "")):
                        pages[0].setdefault("Contents", []).append({"Key": full, "Size": 1})
                    yield from pages

            return Planted()

        monkeypatch.setattr(store.client, "get_paginator", get_paginator)
    else:  # a directory cannot hold such a name; the listing is where it would come from
        real_list = store.list
        monkeypatch.setattr(store, "list", lambda prefix: sorted([*real_list(prefix), key]))


@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_check_key_refuses_keys_that_leave_their_folder(key):
    with pytest.raises(StoreError) as err:
        check_key(key)
    assert repr(key) in str(err.value)


def test_check_key_accepts_ordinary_keys_and_folders():
    assert check_key("models/gpt/1/card.json") == "models/gpt/1/card.json"
    assert check_key("models/gpt/1/", folder=True) == "models/gpt/1"
    assert check_key("", folder=True) == ""
    assert check_key("a/..b/c..d/.hidden") == "a/..b/c..d/.hidden"


@pytest.mark.parametrize("key", HOSTILE_KEYS, ids=range(len(HOSTILE_KEYS)))
def test_writes_refuse_hostile_keys(store, key):
    with pytest.raises(StoreError, match="store keys are relative"):
        store.put_bytes(key, b"x")
    with pytest.raises(StoreError, match="store keys are relative"):
        store.put_bytes(key, b"x", if_absent=True)


@pytest.mark.parametrize("key", ["../outside", "a/../../outside", "/etc/passwd"])
def test_local_reads_refuse_hostile_keys(tmp_path, key):
    (tmp_path / "outside").write_text("secret")
    store = open_store(str(tmp_path / "store"))
    for read in (store.get_bytes, store.exists, store.open_read, lambda k: store.download(k, tmp_path / "d")):
        with pytest.raises(StoreError, match="store keys are relative"):
            read(key)
    with pytest.raises(StoreError, match="store keys are relative"):
        store.delete_prefix(key)


def test_a_folder_never_matches_a_sibling_with_a_longer_name(store, tmp_path):
    store.put_bytes("models/gpt/1/card.json", b"one")
    store.put_bytes("models/gpt/1/checkpoint/model.bin", b"w1")
    store.put_bytes("models/gpt/10/tmp/x", b"ten")  # the key that used to land in /tmp/x
    store.put_bytes("models/gpt/10/card.json", b"ten")
    store.put_bytes("models/gpt/1x", b"file beside the folder")
    expected = ["models/gpt/1/card.json", "models/gpt/1/checkpoint/model.bin"]
    assert store.list("models/gpt/1") == expected
    assert store.list("models/gpt/1/") == expected
    assert store.children("models/gpt") == ["1", "10"]
    assert store.relative("models/gpt/1", "models/gpt/1/checkpoint/model.bin") == "checkpoint/model.bin"
    with pytest.raises(StoreError, match="not under models/gpt/1/"):
        store.relative("models/gpt/1", "models/gpt/10/tmp/x")

    for prefix in ("models/gpt/1", "models/gpt/1/"):
        dest = tmp_path / f"dest-{len(prefix)}"
        store.download_dir(prefix, dest)
        assert files_under(dest) == {"card.json", "checkpoint/model.bin"}
    assert not os.path.exists("/tmp/x") or open("/tmp/x", "rb").read() != b"ten"

    store.delete_prefix("models/gpt/1")
    assert store.list("models/gpt/1") == []
    assert store.list("models/gpt/10") == ["models/gpt/10/card.json", "models/gpt/10/tmp/x"]
    assert store.exists("models/gpt/1x")


@pytest.mark.parametrize(
    "planted",
    ["../../escape.txt", "sub/../../../escape.txt", "{abs}/escape-abs.txt", "a\\..\\..\\escape.txt", "./escape.txt"],
    ids=["dotdot", "nested-dotdot", "absolute", "backslash", "dot"],
)
def test_download_dir_refuses_a_planted_key_and_writes_nothing(store, tmp_path, monkeypatch, planted):
    store.put_bytes("models/gpt/1/card.json", b"card")
    store.put_bytes("models/gpt/1/weights/w.bin", b"w")
    planted = planted.format(abs=tmp_path.as_posix())  # a leading '/' after the folder's own
    key = f"models/gpt/1/{planted}"
    plant_listing(store, monkeypatch, key)
    assert key in store.list("models/gpt/1/")

    dest = tmp_path / "deep" / "er" / "dest"
    with pytest.raises(StoreError) as err:
        store.download_dir("models/gpt/1", dest)
    assert repr(key) in str(err.value) and "store keys are relative" in str(err.value)
    assert files_under(dest) == set()  # checked before anything is written
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "escape-abs.txt").exists()
    assert not any(p.name.startswith("escape") for p in tmp_path.rglob("*"))


def test_children_leave_out_names_no_folder_can_have(store, monkeypatch):
    store.put_bytes("models/gpt/1/card.json", b"x")
    plant_listing(store, monkeypatch, "models/../evil/card.json")
    assert store.children("models") == ["gpt"]


def test_local_symlink_out_of_the_store_is_refused(tmp_path):
    store = open_store(str(tmp_path / "store"))
    store.put_bytes("models/gpt/1/card.json", b"card")
    (tmp_path / "secret.txt").write_text("outside the store")
    os.symlink(tmp_path / "secret.txt", tmp_path / "store" / "models" / "gpt" / "1" / "link.txt")
    with pytest.raises(StoreError, match="escapes the store root"):
        store.download_dir("models/gpt/1", tmp_path / "dest")
    with pytest.raises(StoreError, match="escapes the store root"):
        store.get_bytes("models/gpt/1/link.txt")
    assert not (tmp_path / "dest" / "link.txt").exists()


def test_deleting_the_whole_store_is_refused(store):
    store.put_bytes("a/b", b"x")
    for prefix in ("", "/"):
        with pytest.raises(StoreError):
            store.delete_prefix(prefix)
    assert store.exists("a/b")
