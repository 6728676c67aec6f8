"""Credentials inside a URI (``tracking.uri: https://alice:TOKEN@host``) reach no MLflow param, no model
card and no printed warning (issue 32, item 7)."""

from __future__ import annotations

import json

from common.redact import redact
from registry.registry import register
from storage import open_store
from tests.helpers import registry_inputs, report
from tracking.client import describe, where
from tracking.params import flatten

SECRET = "s3cr3t-T0KEN"
URI = f"https://alice:{SECRET}@mlflow.example.com:5000/prefix"


CONFIG = {"tracking": {"uri": URI}, "data": {"sources": [f"s3://key:{SECRET}@bucket/corpus", "plain/path"]}}


def test_mlflow_params_leave_the_credentials_out():
    params = flatten(CONFIG)
    assert params["tracking.uri"] == "https://***@mlflow.example.com:5000/prefix"
    assert SECRET not in json.dumps(params) and "plain/path" in params["data.sources"]


def test_the_model_card_leaves_the_credentials_out(tmp_path):
    store = registry_inputs(open_store(str(tmp_path / "store")))
    ref = register(store, "gpt", report(3.0), config=CONFIG)
    card = store.get_bytes(f"{ref.prefix}/card.json").decode() + store.get_bytes(f"{ref.prefix}/card.md").decode()
    assert SECRET not in card and "https://***@mlflow.example.com:5000/prefix" in card


def test_warnings_leave_the_credentials_out():
    assert where(URI) == "https://***@mlflow.example.com:5000/prefix"
    failure = describe(RuntimeError(f"API request to {URI}/api/2.0/mlflow/runs/create failed with code 500"))
    assert SECRET not in failure and "***@mlflow.example.com" in failure


def test_a_password_holding_an_at_sign_is_redacted_whole():
    """Issue 50 finding 8: HTTP clients split the authority at its last "@"; the redaction stopped at the first
    and left ``ss@host``, the password's tail."""
    assert redact("see https://alice:p@ss@host:5000/x and https://bob@h2") == "see https://***@host:5000/x and https://***@h2"


def test_what_is_not_a_credential_stays():
    for text in ("s3://bucket/a@b", "sqlite:////tmp/x.db", "alice@example.com", "https://host/path?user=a@b"):
        assert redact(text) == text, text
