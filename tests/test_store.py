import pytest

from storage import AlreadyCommitted, StoreError, open_store


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
