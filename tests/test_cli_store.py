"""`pretrain store up`: a real SeaweedFS server whose printed environment works."""

import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.net import free_port
from storage import open_store

BIN = Path(sys.executable).parent


@pytest.mark.slow
def test_store_up_prints_a_working_environment(tmp_path, monkeypatch):
    port = free_port()
    proc = subprocess.Popen(
        [str(BIN / "pretrain"), "store", "up", "--dir", str(tmp_path / "s3"), "--port", str(port), "--bucket", "cli-test"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        env: dict[str, str] = {}
        deadline = time.monotonic() + 60
        while "PRETRAIN_STORE" not in env and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "store up exited before printing its environment"
            if line.startswith("export "):
                key, _, value = line[len("export ") :].strip().partition("=")
                env[key] = value
        assert env["AWS_ENDPOINT_URL"] == f"http://127.0.0.1:{port}"
        assert env["PRETRAIN_STORE"] == "s3://cli-test/store"
        assert stat.S_IMODE((tmp_path / "s3").stat().st_mode) == 0o700
        assert stat.S_IMODE((tmp_path / "s3" / "s3-identities.json").stat().st_mode) == 0o600
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        store = open_store(env["PRETRAIN_STORE"])
        store.put_bytes("hello", b"world")
        assert store.get_bytes("hello") == b"world"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
