"""Shared fixtures: a real SeaweedFS S3 server on 127.0.0.1, stores, and a tiny dataset.
Shared helpers (settings, corpora, run helpers) are in tests/helpers.py."""

from __future__ import annotations

import os

import pytest

from storage import open_store
from storage.s3server import S3Server
from tests.helpers import init_tracking_db, tiny_data, tiny_tokenizer


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> S3Server:
    server = S3Server(data_dir=tmp_path_factory.mktemp("seaweedfs"), bucket="pretrain-test")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch) -> dict[str, str]:
    """The AWS environment of the test server, set for this test."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    return s3_server.env()


@pytest.fixture
def s3_store(s3_env, s3_server, request):
    """A fresh prefix in the test bucket."""
    name = request.node.name.replace("[", "-").replace("]", "")
    return open_store(f"s3://{s3_server.bucket}/{name}-{os.getpid()}")


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    """Each test that takes ``store`` runs against a local directory and the S3 server."""
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    return request.getfixturevalue("s3_store")


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """A committed tiny dataset in a local store, shared read-only by the training tests."""
    from data_prep.prepare import prepare_dataset

    store = open_store(str(tmp_path_factory.mktemp("dataset-store")))
    return prepare_dataset(tiny_data(), tiny_tokenizer(), store)


@pytest.fixture(scope="session", autouse=True)
def mlflow_tracking_uri(tmp_path_factory) -> str:
    """One SQLite MLflow database for every pipeline of the session: ``MLFLOW_TRACKING_URI`` reaches the
    ``pretrain run``/``pyflyte run`` subprocesses (their env starts from os.environ), so a pipeline in a
    fresh HOME does not create and migrate a database of its own (seconds each). Created here, once,
    before any pipeline: two pipelines migrating one new database at once would race."""
    uri = init_tracking_db(tmp_path_factory.mktemp("mlflow") / "mlflow.db")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        yield uri
