"""The registry on a real SeaweedFS server: races, round trips, a server that dies mid-write."""

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from registry.registry import download, list_models, promote, register, resolve, show
from storage import AlreadyCommitted, StoreError, open_store
from storage.s3server import S3Server
from tests.helpers import registry_inputs, report


@pytest.mark.slow
def test_concurrent_registrations_get_distinct_versions(s3_store):
    registry_inputs(s3_store)
    stores = [open_store(s3_store.uri) for _ in range(4)]  # one client each, as separate workers would have
    with ThreadPoolExecutor(4) as pool:
        refs = list(pool.map(lambda i: register(stores[i], "gpt", report(float(i))), range(4)))
    assert sorted(r.version for r in refs) == [1, 2, 3, 4]
    for ref in refs:  # each version holds its own registration, not a mix
        loss = show(s3_store, f"gpt:{ref.version}").card.metrics["val_loss"]
        assert loss == float(next(i for i, r in enumerate(refs) if r.version == ref.version))


def test_one_version_has_one_winner(s3_store):
    s3_store.put_bytes("models/gpt/1/card.json", b"{}")
    barrier = threading.Barrier(2)

    def commit(_):
        barrier.wait()
        try:
            open_store(s3_store.uri).commit("models/gpt/1", {"by": threading.get_ident()})
            return "won"
        except AlreadyCommitted:
            return "lost"

    with ThreadPoolExecutor(2) as pool:
        assert sorted(pool.map(commit, range(2))) == ["lost", "won"]


def test_alias_race_leaves_a_valid_alias(s3_store):
    registry_inputs(s3_store)
    for i in range(3):
        register(s3_store, "gpt", report(float(i)))
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda v: promote(open_store(s3_store.uri), f"gpt:{v}", "production"), [1, 2, 3]))
    assert resolve(s3_store, "gpt:production")[1] in {1, 2, 3}
    with pytest.raises(Exception, match="invalid alias"):
        promote(s3_store, "gpt:1", "../latest")


def test_download_round_trip(s3_store, tmp_path):
    weights = os.urandom(300_000)
    registry_inputs(s3_store, weights)
    register(s3_store, "gpt", report(1.0))
    folder = download(s3_store, "gpt:latest", tmp_path / "model")
    assert (folder / "checkpoint" / "model" / "__0_0.distcp").read_bytes() == weights
    assert (folder / "card.json").exists() and not (folder / "_COMMITTED").exists()


def test_no_credentials_in_metadata_or_logs(s3_store, s3_env, capfd, caplog):
    registry_inputs(s3_store)
    register(s3_store, "gpt", report(1.0))
    secrets = [s3_env["AWS_ACCESS_KEY_ID"], s3_env["AWS_SECRET_ACCESS_KEY"]]
    stored = b"".join(s3_store.get_bytes(k) for k in s3_store.list("models"))
    logged = capfd.readouterr().out + capfd.readouterr().err + caplog.text
    for secret in secrets:
        assert secret.encode() not in stored and secret not in logged


@pytest.mark.slow
def test_server_stopped_mid_registration_leaves_no_visible_entry(tmp_path, monkeypatch):
    server = S3Server(data_dir=tmp_path / "s3", bucket="midway").start()
    try:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        store = registry_inputs(open_store("s3://midway/reg"), weights=os.urandom(48 * 1024 * 1024))
        failure: list[BaseException] = []

        def registration():
            try:
                register(open_store(store.uri), "gpt", report(1.0))
            except BaseException as e:  # noqa: BLE001 - the failure is what we want to see
                failure.append(e)

        worker = threading.Thread(target=registration)
        worker.start()
        while not store.exists("models/gpt/1/_CLAIMED") and worker.is_alive():
            time.sleep(0.01)
        server.stop()  # the server goes away while the weights are being copied
        worker.join(timeout=120)
        assert failure and isinstance(failure[0], StoreError), failure
    finally:
        server.stop()
    restarted = server.start()  # the same data, port and credentials
    try:
        store = open_store("s3://midway/reg")
        assert list_models(store) == []
        with pytest.raises(Exception, match="does not exist"):
            show(store, "gpt:1")
        assert register(store, "gpt", report(2.0)).version == 2  # the half-written 1 stays unused
    finally:
        restarted.stop()
