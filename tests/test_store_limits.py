"""Every whole read of a store object is bounded by its kind's limit (issue 50 finding 11): metrics, attempts,
doc stats and manifests were read whole whatever their size, so a planted object took the reader's memory."""

from __future__ import annotations

import json

import pytest

from cli.main import main as cli
from common.contracts import metrics_key
from storage import READ_LIMITS, ObjectTooLarge


def test_a_read_over_its_kinds_limit_fails_naming_the_key_before_the_bytes_are_held(store, monkeypatch):
    monkeypatch.setitem(READ_LIMITS, "record", 100)
    store.put_json("runs/r1/lease.json", {"pad": "x" * 200})
    store.put_json("runs/r1/small.json", {"ok": 1})
    with pytest.raises(ObjectTooLarge, match=r"runs/r1/lease\.json is 2\d\d bytes, over the 100-byte limit for a record"):
        store.get_json("runs/r1/lease.json")
    with pytest.raises(ObjectTooLarge, match=r"lease\.json is 2\d\d bytes"):
        store.get_bytes_with_etag("runs/r1/lease.json")
    assert store.get_json("runs/r1/small.json") == {"ok": 1}  # control: within the limit
    assert len(store.get_bytes("runs/r1/lease.json")) > 200  # another kind, another limit


def test_runs_show_of_a_planted_huge_log_fails_in_one_line(tmp_path, capsys, monkeypatch):
    from storage import open_store

    store = open_store(str(tmp_path / "store"))
    line = json.dumps({"step": 1, "loss": 2.0}) + "\n"
    store.put_bytes(metrics_key("runs/r1"), (line * 1000).encode())
    assert cli(["runs", "show", "r1", "--store", store.uri]) == 0  # control: as written, it reads
    monkeypatch.setitem(READ_LIMITS, "log", 10_000)  # the log now 2.5x the limit, as a planted 5 GiB one is
    capsys.readouterr()
    assert cli(["runs", "show", "r1", "--store", store.uri]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{store.url(metrics_key('runs/r1'))} is 25,000 bytes, over the 10,000-byte limit" in err
