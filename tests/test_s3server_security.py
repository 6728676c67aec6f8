"""The local S3 server holds its promise: only the S3 port serves data, only with credentials.

`weed mini` runs a master, a volume server, a filer, an S3 gateway and an admin server, each
with an HTTP and a gRPC port, plus unix sockets. The listeners are found with psutil and must be
exactly the ports and sockets weed was told to open; each is then probed the way an attacker on
the machine would, and every refusal must be the specific one that listener's guard gives:

- S3 (port and unix socket): unsigned reads, writes, deletes -> 403 AccessDenied; the same
  requests signed with SigV4 and the server's keys -> served (the object's bytes).
- volume: reads, writes, deletes without a JWT, or with one signed by another key or for another
  file -> 401 "wrong jwt"; the same requests with a JWT signed by security.toml's keys -> served.
- master, volume, filer and admin HTTP ports: TLS only, and only with a client certificate from
  this server's CA (plaintext -> 400, no certificate -> "certificate required", another CA's ->
  "unknown CA"), so their status pages (``/``, ``/cluster/status``, ``/status``, ``/metrics``)
  answer no one else; the probes below then go past TLS with this server's certificate, to test the
  guards behind it.
- master, filer (port and socket), admin: ``-disableHttp`` and ``-admin.ui=false`` remove their
  data APIs, so even a correctly signed request finds no route (Go's "404 page not found").
  Control: a reference server, the wrapper's own start with only those two flags dropped, serves
  the very same requests (assign, lookup, upload, collection delete; filer reads and writes with
  a filer JWT, 401 without; the admin API's file download and users), so the 404 is the missing
  route, not a wrong probe. Each port also answers a route it keeps (it is the right listener).
- gRPC (ports and sockets): plaintext -> closed without a byte; TLS without a client certificate
  -> "certificate required" alert; a certificate from another CA -> "bad certificate" alert;
  this server's certificate -> HTTP/2 and the component's own RPC served.

Afterwards S3 shows the planted objects unchanged. No probe counts a connection error as a refusal.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import hmac
import http.client
import json
import os
import re
import secrets
import socket
import ssl
import stat
import struct
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from storage import s3server
from storage.s3server import GRPC_PORT_OFFSET, S3Server

BUCKET = "secure"
CALLER_KEY, CALLER_SECRET = "AKCALLERENVIRONMENT", "caller-secret-from-the-environment"
ATTACKER_JWT_KEY = "known-to-an-attacker"  # put in WEED_JWT_SIGNING_KEY by the fixture; weed must not use it

# What each kind of listener answers a request it refuses: (status, a part of the body).
S3_DENIED = (403, b"<Code>AccessDenied</Code>")
WRONG_JWT = (401, b'{"error":"wrong jwt"}')  # weed's JWT guard (volume server, filer)
NO_ROUTE = (404, b"404 page not found\n")  # Go's router: no handler at all for the path
ROUTE_REMOVING_FLAGS = ("-disableHttp", "-admin.ui=false")
GRPC_COMPONENTS = ("master", "volume", "filer", "s3", "admin")  # each has a gRPC port and a gRPC unix socket
OWN_RPC = {
    "master": "/master_pb.Seaweed/GetMasterConfiguration",
    "filer": "/filer_pb.SeaweedFiler/GetFilerConfiguration",
    "volume": "/volume_server_pb.VolumeServer/VolumeServerStatus",
}
HTTPS_ROLES = ("master", "volume", "filer", "admin")  # their HTTP ports require this server's client certificate
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
JSON = {"Content-Type": "application/json"}


def plant(srv: S3Server) -> dict[str, bytes]:
    """Objects that exist, with content an unauthorised read must never return."""
    client = srv._client()
    objects = {
        "models/gpt/1/card.json": b'{"secret": "' + secrets.token_hex(16).encode() + b'"}',
        "models/gpt/1/tokenizer.json": secrets.token_hex(40_000).encode(),
    }
    for key, body in objects.items():
        client.put_object(Bucket=srv.bucket, Key=key, Body=body)
    return objects


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # The caller's own AWS keys must not become an identity of the server (weed mini does
    # that with whatever AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY it inherits).
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ACCESS_KEY_ID", CALLER_KEY)
        mp.setenv("AWS_SECRET_ACCESS_KEY", CALLER_SECRET)
        mp.setenv("WEED_JWT_SIGNING_KEY", ATTACKER_JWT_KEY)  # WEED_ variables override security.toml
        srv = S3Server(data_dir=tmp_path_factory.mktemp("s3-security"), bucket=BUCKET).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def planted(server):
    return plant(server)


@pytest.fixture
def reference(tmp_path):
    """The positive control for the removed HTTP APIs: the wrapper's own server (same keys, JWT
    guards, mutual TLS) started without the two flags that remove routes. Its admin API has no
    password, so it lives on 127.0.0.1 for one test only."""
    real_popen = subprocess.Popen
    dropped = []

    def popen(args, **kwargs):
        dropped.extend(arg for arg in args if arg in ROUTE_REMOVING_FLAGS)
        return real_popen([arg for arg in args if arg not in ROUTE_REMOVING_FLAGS], **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(s3server.subprocess, "Popen", popen)
        srv = S3Server(data_dir=tmp_path / "reference", bucket=BUCKET).start()
    try:
        assert sorted(dropped) == sorted(ROUTE_REMOVING_FLAGS), dropped  # else the reference is no control
        yield srv, plant(srv)
    finally:
        srv.stop()


def weed_flags(srv: S3Server) -> dict[str, str]:
    """The ``-name=value`` flags of the running weed, read from the process itself."""
    args = psutil.Process(srv.process.pid).cmdline()
    assert args[1] == "mini", args
    return {name: value for name, _, value in (arg.lstrip("-").partition("=") for arg in args[2:])}


def known_ports(srv: S3Server) -> dict[str, int]:
    """Role ("s3", "s3.grpc", "master", ...) -> every TCP port weed was told to open. A flag of 0
    disables a listener (Iceberg, Lance); the admin's gRPC port is its HTTP port + 10000."""
    ports = {}
    for name, value in weed_flags(srv).items():
        if match := re.fullmatch(r"(\w+)\.port(\.\w+)?", name):
            if int(value):
                ports[match.group(1) + (match.group(2) or "")] = int(value)
    ports.setdefault("admin.grpc", ports["admin"] + GRPC_PORT_OFFSET)
    return ports


def known_sockets(srv: S3Server) -> dict[str, str]:
    """Role -> unix socket: the two HTTP sockets the wrapper places, and weed's gRPC socket for
    each gRPC port (always /tmp/seaweedfs-<component>-grpc-<port>.sock)."""
    flags, ports = weed_flags(srv), known_ports(srv)
    sockets = {"s3": flags["s3.localSocket"], "filer": flags["filer.localSocket"]}
    for component in GRPC_COMPONENTS:
        sockets[f"{component}.grpc"] = f"/tmp/seaweedfs-{component}-grpc-{ports[component + '.grpc']}.sock"
    return sockets


def listeners(pid: int) -> tuple[list[tuple[str, int]], list[str]]:
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    tcp = sorted({(c.laddr.ip, c.laddr.port) for p in procs for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN})
    unix = sorted({c.laddr for p in procs for c in p.net_connections("unix") if c.laddr and c.raddr in ("", None)})
    return tcp, [path for path in unix if os.path.exists(path)]


def volume_needles(data_dir: Path) -> dict[str, bytes]:
    """File id (``vid,keycookie``) -> data of every live needle on disk, read from the .idx and .dat
    files as weed wrote them (an entry with the tombstone size, or offset 0, deletes the key's earlier
    entries). A needle is [cookie u32, key u64, size u32, data size u32, data, flags u8, ...]; flag 1:
    the data is gzipped, which weed decides per upload from a sample of its bytes (about one random hex
    object in six here)."""
    needles = {}
    for idx in data_dir.rglob("*.idx"):
        match = re.fullmatch(r"(?:.*_)?(\d+)", idx.stem)
        if not match:
            continue
        raw, dat, live = idx.read_bytes(), idx.with_suffix(".dat").read_bytes(), {}
        for i in range(0, len(raw) - 16, 17):  # key u64, offset 4+1 bytes (8000GB build), size u32
            key = struct.unpack(">Q", raw[i : i + 8])[0]
            offset = (struct.unpack(">I", raw[i + 8 : i + 12])[0] + (raw[i + 12] << 32)) * 8
            size = struct.unpack(">I", raw[i + 13 : i + 17])[0]
            if offset == 0 or size in (0, 0xFFFFFFFF):
                live.pop(key, None)
                continue
            cookie, needle_key, _, data_size = struct.unpack(">IQII", dat[offset : offset + 20])
            assert needle_key == key
            data, flags = dat[offset + 20 : offset + 20 + data_size], dat[offset + 20 + data_size]
            live[key] = f"{match.group(1)},{key:x}{cookie:08x}", gzip.decompress(data) if flags & 1 else data
        needles.update(live.values())
    return needles


def volume_file_ids(data_dir: Path) -> list[str]:
    """File ids of every live needle on disk (see volume_needles)."""
    return list(volume_needles(data_dir))


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def request(
    where: int | str, method: str, path: str, body: bytes | None = None, headers=None, tls: ssl.SSLContext | None = None
) -> tuple[int, bytes]:
    """(status, body) from a TCP port on 127.0.0.1 (over ``tls`` if given) or a unix socket. A connection
    error is raised: it is never taken for a refusal."""
    if isinstance(where, str):
        conn = UnixHTTPConnection(where, 5)
    elif tls is not None:
        conn = http.client.HTTPSConnection("127.0.0.1", where, timeout=5, context=tls)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", where, timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def mtls(srv: S3Server) -> ssl.SSLContext:
    """TLS as weed's own components speak it to each other's HTTP ports: this server's CA and client certificate."""
    ca, cert, key = srv.tls_files
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(cert, key)
    return context


def tls_of(srv: S3Server, where: int | str) -> ssl.SSLContext | None:
    """The client certificate a listener of ``srv`` requires before any HTTP (its master, volume, filer
    and admin ports), else None (the S3 port and the unix sockets speak plain HTTP)."""
    ports = known_ports(srv)
    return mtls(srv) if where in {ports[role] for role in HTTPS_ROLES} else None


def is_refusal(answer: tuple[int, bytes], refusal: tuple[int, bytes]) -> bool:
    return answer[0] == refusal[0] and refusal[1] in answer[1]


def sigv4(srv: S3Server, where: int | str, method: str, path: str, body: bytes = b"") -> dict[str, str]:
    """Headers that sign this request with the server's S3 credentials (what boto3 sends)."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    host = "localhost" if isinstance(where, str) else f"127.0.0.1:{where}"
    signed = AWSRequest(method=method, url=f"http://{host}{path}", data=body, headers={"Host": host})
    S3SigV4Auth(Credentials(srv.access_key, srv.secret_key), "s3", "us-east-1").add_auth(signed)
    return dict(signed.headers.items())


def jwt_keys(srv: S3Server) -> dict[str, str]:
    """The signing keys weed reads from this server's security.toml."""
    jwt = tomllib.loads((srv.data_dir / s3server.SECURITY).read_text())["jwt"]
    return {
        "volume.write": jwt["signing"]["key"],
        "volume.read": jwt["signing"]["read"]["key"],
        "filer.write": jwt["filer_signing"]["key"],
        "filer.read": jwt["filer_signing"]["read"]["key"],
    }


def bearer(key: str, **claims) -> dict[str, str]:
    """An ``Authorization`` header with an HS256 JWT as weed's master issues it (the volume server
    also checks the claim ``fid``; the filer only the signature and expiry)."""

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    header = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = b64(json.dumps({"exp": int(time.time()) + 300, **claims}).encode())
    signature = b64(hmac.new(key.encode(), f"{header}.{payload}".encode(), hashlib.sha256).digest())
    return {"Authorization": f"Bearer {header}.{payload}.{signature}"}


def multipart(name: str, data: bytes) -> tuple[bytes, dict[str, str]]:
    boundary = secrets.token_hex(8)
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
            f"Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + data
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def assert_intact(srv: S3Server, planted: dict[str, bytes]) -> None:
    client = srv._client()
    listed = {o["Key"] for o in client.list_objects_v2(Bucket=srv.bucket).get("Contents", [])}
    assert listed == set(planted)
    for key, body in planted.items():
        assert client.get_object(Bucket=srv.bucket, Key=key)["Body"].read() == body


def listeners_once_started(srv: S3Server, timeout: float = 60.0) -> tuple[list[tuple[str, int]], list[str]]:
    """The listeners once every port and socket weed was given is open. Weed opens some late
    (the admin's gRPC port, under load, seconds after S3 serves): reading too early would miss
    one. Extra listeners are returned as found, for the caller to refuse."""
    want_ports, want_sockets = set(known_ports(srv).values()), set(known_sockets(srv).values())
    deadline = time.monotonic() + timeout
    while True:
        tcp, unix = listeners(srv.process.pid)
        if want_ports <= {port for _, port in tcp} and want_sockets <= set(unix) or time.monotonic() > deadline:
            return tcp, unix
        time.sleep(0.2)


def test_listeners_are_exactly_the_ports_and_sockets_weed_was_given(server, planted):
    tcp, unix = listeners_once_started(server)
    ports, sockets = known_ports(server), known_sockets(server)
    assert ports["s3"] == server.port
    assert all(ip == "127.0.0.1" for ip, _ in tcp), tcp
    # A port weed opens on its own (a new component, a debug or metrics port) fails here, so
    # nothing goes unprobed by the tests below; a disabled one (flag 0) must not listen.
    assert sorted(port for _, port in tcp) == sorted(ports.values()), (tcp, ports)
    assert len(ports) == 10, ports  # s3, master, volume, filer, admin: an HTTP and a gRPC port each
    assert sorted(unix) == sorted(sockets.values()), (unix, sockets)
    for path in unix:  # only this user may connect (weed's gRPC sockets sit in the shared /tmp)
        info = os.stat(path)
        assert stat.S_ISSOCK(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077 == 0, path


def test_s3_port_and_socket_serve_only_sigv4_signed_requests(server, planted):
    for where in (server.port, known_sockets(server)["s3"]):
        for key, body in planted.items():
            path = f"/{BUCKET}/{key}"
            assert is_refusal(request(where, "GET", path), S3_DENIED), (where, path)
            # Control: the same request signed with the server's keys is served.
            assert request(where, "GET", path, headers=sigv4(server, where, "GET", path)) == (200, body), (where, path)
        assert is_refusal(request(where, "GET", "/"), S3_DENIED), where  # ListBuckets
        status, listing = request(where, "GET", "/", headers=sigv4(server, where, "GET", "/"))
        assert status == 200 and f"<Name>{BUCKET}</Name>".encode() in listing, (where, status, listing[:200])

        path, data = f"/{BUCKET}/probe/{secrets.token_hex(6)}.bin", b"written-" + secrets.token_hex(8).encode()
        assert is_refusal(request(where, "PUT", path, data), S3_DENIED), (where, path)
        assert request(where, "GET", path, headers=sigv4(server, where, "GET", path))[0] == 404, "an unsigned PUT wrote"
        assert request(where, "PUT", path, data, sigv4(server, where, "PUT", path, data))[0] == 200, (where, path)
        assert is_refusal(request(where, "GET", path), S3_DENIED), (where, path)
        assert request(where, "GET", path, headers=sigv4(server, where, "GET", path)) == (200, data), (where, path)
        assert is_refusal(request(where, "DELETE", path), S3_DENIED), (where, path)
        assert request(where, "DELETE", path, headers=sigv4(server, where, "DELETE", path))[0] == 204, (where, path)
        assert request(where, "GET", path, headers=sigv4(server, where, "GET", path))[0] == 404, (where, path)
    assert_intact(server, planted)


def test_volume_port_serves_only_requests_with_a_jwt_signed_by_this_server(server, planted):
    volume, keys = known_ports(server)["volume"], jwt_keys(server)
    past_tls = functools.partial(request, tls=mtls(server))  # what is left to guard: the JWT
    fids = volume_file_ids(server.data_dir / "data")
    assert len(fids) >= 2, fids  # the planted objects' chunks (and whatever else weed stored)
    served = []
    for fid in fids:
        path = f"/{fid}"
        assert is_refusal(past_tls(volume, "GET", path), WRONG_JWT), path
        other = next(f for f in [*fids, "1,1"] if f != fid)
        for label, token in [
            ("the WEED_JWT_SIGNING_KEY of weed's caller", bearer(ATTACKER_JWT_KEY, fid=fid)),
            ("the write key", bearer(keys["volume.write"], fid=fid)),
            ("the read key, for another file", bearer(keys["volume.read"], fid=other)),
        ]:
            assert is_refusal(past_tls(volume, "GET", path, headers=token), WRONG_JWT), (path, label)
        assert is_refusal(past_tls(volume, "PUT", path, b"PWNED"), WRONG_JWT), path
        assert is_refusal(past_tls(volume, "DELETE", path), WRONG_JWT), path
        # Control: the same read with a JWT signed by security.toml's read key is served (unless
        # weed deleted the needle meanwhile: the chunk of an object another test deleted).
        status, body = past_tls(volume, "GET", path, headers=bearer(keys["volume.read"], fid=fid))
        if status == 404 and fid not in volume_file_ids(server.data_dir / "data"):
            continue
        assert status == 200, (path, status, body[:100])
        served.append(body)
    assert set(planted.values()) <= set(served)

    # Write, read and delete a new file: each refused without a JWT, served with one.
    path = f"/{fids[0].split(',')[0]},{secrets.randbelow(1 << 40) + 1:x}{secrets.randbelow(1 << 32):08x}"
    fid, data = path[1:], b"written-" + secrets.token_hex(8).encode()
    assert is_refusal(past_tls(volume, "PUT", path, data), WRONG_JWT), path
    assert is_refusal(past_tls(volume, "PUT", path, data, bearer(ATTACKER_JWT_KEY, fid=fid)), WRONG_JWT), path
    assert past_tls(volume, "GET", path, headers=bearer(keys["volume.read"], fid=fid))[0] == 404, "an unsigned PUT wrote"
    assert past_tls(volume, "PUT", path, data, bearer(keys["volume.write"], fid=fid))[0] == 201, path
    assert is_refusal(past_tls(volume, "GET", path), WRONG_JWT), path
    assert past_tls(volume, "GET", path, headers=bearer(keys["volume.read"], fid=fid)) == (200, data), path
    assert is_refusal(past_tls(volume, "DELETE", path), WRONG_JWT), path
    assert past_tls(volume, "GET", path, headers=bearer(keys["volume.read"], fid=fid)) == (200, data), (
        "an unsigned DELETE deleted"
    )
    assert past_tls(volume, "DELETE", path, headers=bearer(keys["volume.write"], fid=fid))[0] == 202, path
    assert past_tls(volume, "GET", path, headers=bearer(keys["volume.read"], fid=fid))[0] == 404, path
    assert_intact(server, planted)


@dataclass
class Probe:
    """A request to a removed HTTP API, and what the reference server (API present) answers."""

    role: str  # "master", "filer" (its port and its unix socket) or "admin"
    method: str
    path: str
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    jwt: str | None = None  # the security.toml key a legitimate filer request is signed with
    status: int = 200  # the reference's answer to the (signed) request
    shows: bytes = b""  # ... which contains this


def removed_api_probes(srv: S3Server, objects: dict[str, bytes]) -> list[Probe]:
    """Reads first, then writes; the collection delete (it destroys the bucket's data) last."""
    ports = known_ports(srv)
    volume_id = volume_file_ids(srv.data_dir / "data")[0].split(",")[0]
    key, body = next(iter(objects.items()))
    form, form_headers = multipart("x.bin", b"PWNED-" + secrets.token_hex(8).encode())
    probes = [Probe("filer", "GET", f"/buckets/{BUCKET}/{k}", jwt="filer.read", shows=b) for k, b in objects.items()]
    scratch = f"/buckets/{BUCKET}/probe/{secrets.token_hex(6)}.bin"
    probes += [
        Probe("filer", "PUT", scratch, b"PWNED", jwt="filer.write", status=201),
        Probe("filer", "DELETE", scratch, jwt="filer.write", status=204),
        Probe("master", "GET", f"/dir/lookup?volumeId={volume_id}", shows=f'"url":"127.0.0.1:{ports["volume"]}"'.encode()),
        Probe("master", "GET", "/dir/assign", shows=b'"fid":'),
        Probe("master", "POST", "/submit", form, form_headers, status=201, shows=b'"fid":'),
        Probe("admin", "GET", f"/api/files/download?path=/buckets/{BUCKET}/{key}", shows=body),
        Probe("admin", "GET", "/api/users", shows=srv.secret_key.encode()),
        Probe(
            "admin", "POST", "/api/users", b'{"username": "intruder", "actions": ["Admin"]}', JSON, status=201, shows=b"intruder"
        ),
        Probe("master", "GET", f"/col/delete?collection={BUCKET}", status=204),
    ]
    return probes


def probe_targets(srv: S3Server, role: str) -> list[int | str]:
    return [known_ports(srv)[role], known_sockets(srv)["filer"]] if role == "filer" else [known_ports(srv)[role]]


@pytest.mark.slow
def test_master_filer_and_admin_http_apis_are_removed(server, planted, reference):
    # Control: with the APIs present, each probe is served, by a filer only with a JWT.
    ref, ref_objects = reference
    ref_keys = jwt_keys(ref)
    for probe in removed_api_probes(ref, ref_objects):
        for where in probe_targets(ref, probe.role):
            if probe.jwt:
                answer = request(where, probe.method, probe.path, probe.body, probe.headers, tls_of(ref, where))
                assert is_refusal(answer, WRONG_JWT), (where, probe.method, probe.path, answer[0], answer[1][:100])
            headers = {**probe.headers, **(bearer(ref_keys[probe.jwt]) if probe.jwt else {})}
            status, body = request(where, probe.method, probe.path, probe.body, headers, tls_of(ref, where))
            assert status == probe.status and probe.shows in body, (where, probe.method, probe.path, status, body[:100])

    # This server: the same requests, signed where a signature exists, find no route at all.
    keys = jwt_keys(server)
    for probe in removed_api_probes(server, planted):
        for where in probe_targets(server, probe.role):
            for headers in [probe.headers, {**probe.headers, **bearer(keys[probe.jwt])}] if probe.jwt else [probe.headers]:
                answer = request(where, probe.method, probe.path, probe.body, headers, tls_of(server, where))
                assert is_refusal(answer, NO_ROUTE), (where, probe.method, probe.path, answer[0], answer[1][:100])
    # ... while each listener answers what it keeps, so the probes reached the right one.
    ports = known_ports(server)
    leader = f'"Leader":"127.0.0.1:{ports["master"]}.{ports["master.grpc"]}"'.encode()
    status, body = request(ports["master"], "GET", "/cluster/status", tls=mtls(server))
    assert status == 200 and leader in body, (status, body[:200])
    assert request(ports["admin"], "GET", "/health", tls=mtls(server)) == (200, b'{"health":"ok"}\n')
    for where in probe_targets(server, "filer"):
        status, body = request(where, "GET", "/seaweedfsstatic/seaweed50x50.png", tls=tls_of(server, where))
        assert status == 200 and body.startswith(b"\x89PNG"), (where, status, body[:40])
    assert_intact(server, planted)


def test_every_http_listener_refuses_every_unsigned_probe(server, planted):
    """Every listener gets every request of its own API and of the others' (a route added to the
    wrong server is caught too), each answered with that listener's own refusal. The volume server
    parses the path as a file id before it checks the JWT (anything else: 400), so it gets file ids."""
    ports, sockets = known_ports(server), known_sockets(server)
    needles = volume_needles(server.data_dir / "data")
    fids = list(needles)
    # The needles that must outlive the probes: the planted objects' (found by their bytes on disk).
    # Not every needle read here: weed's filer deletes the chunks of an object deleted through S3 in
    # the background (a queue it drains every 1.123 s, later under load), so right after another test
    # deleted objects (test_s3_port_and_socket_serve_only_sigv4_signed_requests) their needles are
    # still on disk here and gone moments later, with no probe involved.
    kept = {fid: data for fid, data in needles.items() if data in planted.values()}
    assert sorted(kept.values()) == sorted(planted.values()), ("a planted object has no needle on disk", sorted(needles))
    volume_id = fids[0].split(",")[0]
    payload = b"PWNED-" + secrets.token_hex(8).encode()
    form, form_headers = multipart("x.json", payload)
    reads = (
        [f"/buckets/{BUCKET}/{key}" for key in planted] + [f"/{BUCKET}/{key}" for key in planted] + [f"/{fid}" for fid in fids]
    )
    reads += [f"/api/files/download?path=/buckets/{BUCKET}/{key}" for key in planted]
    reads += [f"/dir/lookup?volumeId={volume_id}", "/dir/assign", "/api/users", f"/{BUCKET}?list-type=2"]
    data_api = [("GET", path, None, {}) for path in reads]
    data_api += [("PUT", f"/buckets/{BUCKET}/models/gpt/1/card.json", payload, {})]
    data_api += [("PUT", f"/{BUCKET}/models/gpt/1/card.json", payload, {})]
    data_api += [("PUT", f"/{fid}", payload, {}) for fid in fids]
    data_api += [("GET", f"/col/delete?collection={BUCKET}", None, {})]
    data_api += [("DELETE", f"/{fid}", None, {}) for fid in fids]
    data_api += [("DELETE", f"/buckets/{BUCKET}/models/gpt/1/card.json", None, {})]
    data_api += [("DELETE", f"/{BUCKET}/models/gpt/1/card.json", None, {})]
    s3_posts = [("POST", f"/{BUCKET}/models/gpt/1/card.json?uploads", b"", {})]
    s3_posts += [
        ("POST", f"/{BUCKET}?delete", f"<Delete><Object><Key>{next(iter(planted))}</Key></Object></Delete>".encode(), {})
    ]
    forms = [("POST", f"/buckets/{BUCKET}/models/gpt/1/", form, form_headers), ("POST", "/submit", form, form_headers)]
    forms += [("POST", "/api/users", b'{"username": "intruder", "actions": ["Admin"]}', JSON)]
    by_fid = [
        (method, f"/{fid}", body, headers)
        for fid in fids
        for method, body, headers in [("GET", None, {}), ("PUT", payload, {}), ("POST", form, form_headers), ("DELETE", None, {})]
    ]
    plan = [(where, S3_DENIED, data_api + s3_posts) for where in (ports["s3"], sockets["s3"])]
    plan += [(ports["volume"], WRONG_JWT, by_fid)]
    plan += [
        (where, NO_ROUTE, data_api + s3_posts + forms)
        for where in (ports["master"], ports["filer"], sockets["filer"], ports["admin"])
    ]
    wrong = []
    for where, refusal, requests in plan:
        for method, path, body, headers in requests:
            answer = request(where, method, path, body, headers, tls_of(server, where))
            if not is_refusal(answer, refusal):
                wrong.append((where, method, path, answer[0], answer[1][:80]))
    assert not wrong, "\n".join(map(repr, wrong))
    assert_intact(server, planted)
    # On disk too (assert_intact reads through the S3 gateway; this reads the volume's own files): no
    # probe deleted or overwrote a planted needle, and none wrote its payload anywhere.
    after = volume_needles(server.data_dir / "data")
    changed = [fid for fid, data in kept.items() if after.get(fid) != data]
    assert not changed, f"planted needles deleted or overwritten on disk: {changed}"
    assert not [fid for fid, data in after.items() if payload in data], "a probe's payload was written to a volume"


def tls_probe(where: int | str, ca: Path, chain: tuple[Path, Path] | None) -> str:
    """Connect with TLS (ALPN h2, this server's CA), present ``chain`` if given, and read: the
    server's first HTTP/2 frame type ("SETTINGS") or the TLS alert it sent (ssl's reason)."""
    raw = socket.socket(socket.AF_UNIX) if isinstance(where, str) else socket.socket()
    raw.settimeout(5)
    raw.connect(where if isinstance(where, str) else ("127.0.0.1", where))
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False
    context.set_alpn_protocols(["h2"])
    if chain:
        context.load_cert_chain(*chain)
    try:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            assert tls.selected_alpn_protocol() == "h2"
            frame = tls.recv(9)  # a server speaks first in HTTP/2: its SETTINGS frame
            return {4: "SETTINGS"}.get(frame[3], repr(frame)) if len(frame) == 9 else repr(frame)
    except ssl.SSLError as e:
        return e.reason or repr(e)
    finally:
        raw.close()


def tls_alert(port: int, ca: Path, chain: tuple[Path, Path] | None) -> str:
    """The TLS alert the HTTPS ``port`` answers a client presenting ``chain`` (or none) with (ssl's reason).
    Nothing is sent after the handshake: with TLS 1.3 the server checks the certificate after the client
    has finished, and a request it never read would make it reset the connection, which can overtake the
    alert; with nothing unread it closes after the alert, and the alert always arrives."""
    context = ssl.create_default_context(cafile=str(ca))
    if chain:
        context.load_cert_chain(*chain)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        try:
            data = tls.recv(1)
        except ssl.SSLError as e:
            return e.reason or repr(e)
        return f"no alert: {'closed' if not data else 'data'}"


def test_master_volume_filer_and_admin_http_ports_require_this_servers_client_certificate(server, planted, tmp_path):
    """Issue 32 item 10: the master's status page (``/``, ``/cluster/status``), the volume server's
    ``/status`` (the data folder's path, disk use) and the admin's ``/metrics`` answered anyone on the
    machine. Now each of these ports speaks only TLS and requires a certificate from this server's CA
    before reading a byte of HTTP; with one, the same pages are served (the probe reached the page)."""
    ports = known_ports(server)
    ca, cert, key = server.tls_files
    foreign = s3server._make_tls(tmp_path / "another-ca")
    pages = {"master": ["/", "/cluster/status"], "volume": ["/status"], "filer": ["/"], "admin": ["/metrics", "/health"]}
    shows = {"/": b"SeaweedFS", "/cluster/status": b'"IsLeader":true', "/status": b'"DiskStatuses"', "/health": b"ok"}
    for role, paths in pages.items():
        assert tls_alert(ports[role], ca, None) == "TLSV13_ALERT_CERTIFICATE_REQUIRED", role
        assert tls_alert(ports[role], ca, (foreign[1], foreign[2])) == "TLSV1_ALERT_UNKNOWN_CA", role
        for path in paths:
            status, body = request(ports[role], "GET", path)  # plaintext HTTP
            assert status == 400 and b"HTTP request to an HTTPS server" in body, (role, path, status, body[:100])
            status, body = request(ports[role], "GET", path, tls=mtls(server))  # control: this server's certificate
            if role == "filer":  # -disableHttp leaves it no page, past TLS: Go's router answers
                assert (status, body) == NO_ROUTE or status == 401, (role, path, status, body[:100])
            else:
                assert status == 200 and shows.get(path, b"# HELP") in body, (role, path, status, body[:100])
    assert_intact(server, planted)


def test_grpc_ports_and_sockets_require_this_servers_client_certificate(server, planted, tmp_path):
    grpc = pytest.importorskip("grpc")
    ports, sockets = known_ports(server), known_sockets(server)
    ca, cert, key = server.tls_files
    foreign = s3server._make_tls(tmp_path / "another-ca")  # a CA and certificate this server never saw
    targets = {(c, ports[f"{c}.grpc"]) for c in GRPC_COMPONENTS} | {(c, sockets[f"{c}.grpc"]) for c in GRPC_COMPONENTS}
    ca_pem, cert_pem, key_pem = (path.read_bytes() for path in server.tls_files)
    mutual = grpc.ssl_channel_credentials(root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem)
    no_cert = grpc.ssl_channel_credentials(root_certificates=ca_pem)
    options = [("grpc.ssl_target_name_override", "localhost")]  # a unix socket has no host name to check

    def call(channel, method):
        try:
            channel.unary_unary(method)(b"", timeout=5)
            return "OK"
        except grpc.RpcError as e:
            return e.code().name

    for component, where in sorted(targets, key=str):
        with socket.socket(socket.AF_UNIX) if isinstance(where, str) else socket.socket() as plain:
            plain.settimeout(5)
            plain.connect(where if isinstance(where, str) else ("127.0.0.1", where))
            plain.sendall(H2_PREFACE)  # plaintext HTTP/2 (h2c): closed without a byte
            assert plain.recv(64) == b"", (component, where)
        assert tls_probe(where, ca, None) == "TLSV13_ALERT_CERTIFICATE_REQUIRED", (component, where)
        assert tls_probe(where, ca, (foreign[1], foreign[2])) == "SSLV3_ALERT_BAD_CERTIFICATE", (component, where)
        assert tls_probe(where, ca, (cert, key)) == "SETTINGS", (component, where)  # control: this server's certificate

        target = f"unix:{where}" if isinstance(where, str) else f"127.0.0.1:{where}"
        methods = list(OWN_RPC.values())
        with grpc.insecure_channel(target) as channel:
            assert {call(channel, m) for m in methods} == {"UNAVAILABLE"}, (component, where)
        with grpc.secure_channel(target, no_cert, options) as channel:
            assert {call(channel, m) for m in methods} == {"UNAVAILABLE"}, (component, where)
        # Control: with this server's client certificate the component's own RPC is served; the
        # S3 and admin servers have none of these services, and say so (UNIMPLEMENTED) over mTLS.
        with grpc.secure_channel(target, mutual, options) as channel:
            answers = {m: call(channel, m) for m in methods}
        expected = {m: "OK" if OWN_RPC.get(component) == m else "UNIMPLEMENTED" for m in methods}
        assert answers == expected, (component, where)


def test_s3_port_serves_only_signed_requests(server, planted, monkeypatch):
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import ClientError

    key = "models/gpt/1/card.json"
    assert server._client().get_object(Bucket=BUCKET, Key=key)["Body"].read() == planted[key]

    def client(**kwargs):
        kwargs.setdefault("config", Config(retries={"max_attempts": 1}))
        return boto3.session.Session().client("s3", endpoint_url=server.endpoint, region_name="us-east-1", **kwargs)

    for label, kwargs in [
        ("no credentials", {"config": Config(signature_version=UNSIGNED, retries={"max_attempts": 1})}),
        ("wrong secret", {"aws_access_key_id": server.access_key, "aws_secret_access_key": "wrong"}),
        ("the caller's environment keys", {"aws_access_key_id": CALLER_KEY, "aws_secret_access_key": CALLER_SECRET}),
    ]:
        c = client(**kwargs)
        for operation, extra in [(c.get_object, {}), (c.put_object, {"Body": b"x"})]:
            with pytest.raises(ClientError) as err:
                operation(Bucket=BUCKET, Key=key, **extra)
            assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403, label
    assert server._client().get_object(Bucket=BUCKET, Key=key)["Body"].read() == planted[key]


def test_secrets_are_private_and_weed_gets_a_minimal_environment(server):
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(server.data_dir) == 0o700
    assert mode(server.identities_file) == 0o600
    assert mode(server.data_dir / s3server.SECURITY) == 0o600
    assert all(mode(p) == 0o600 for p in server.tls_files)
    assert mode(server.data_dir / "data") == 0o700
    # weed runs with umask 077: object data and the filer store are private (weed itself
    # chmods the small .vif volume-info files to 0644; they sit in the 0700 folder above).
    for path in (server.data_dir / "data").rglob("*"):
        if path.suffix in {".dat", ".idx", ".ldb", ".log"} or path.is_dir():
            assert mode(path) & 0o077 == 0, path
    proc = psutil.Process(server.process.pid)
    env = proc.environ()
    assert set(env) == {"PATH", "HOME", "TMPDIR", "LANG", "GOMEMLIMIT"}, sorted(env)
    assert not any(CALLER_SECRET in value or CALLER_KEY in value for value in env.values())
    assert not any(server.secret_key in arg for arg in proc.cmdline())  # the command line is world-readable
    venv_weed = Path(sys.executable).parent / "weed"
    if venv_weed.exists():
        assert proc.exe() == str(venv_weed.resolve())


def test_private_files_are_never_readable_by_others(tmp_path, monkeypatch):
    """Created 0600 under a permissive umask, exclusively, and renamed into place only when whole."""
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append(stat.S_IMODE(os.stat(src).st_mode))
        real_replace(src, dst)

    monkeypatch.setattr(s3server.os, "replace", spy)
    old = os.umask(0)
    try:
        target = tmp_path / "s3-identities.json"
        target.write_text("old")
        target.chmod(0o644)
        s3server.write_private(target, b'{"identities": []}')
    finally:
        os.umask(old)
    assert seen == [0o600]
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 and target.read_bytes() == b'{"identities": []}'
    assert [p.name for p in tmp_path.iterdir()] == ["s3-identities.json"]


@pytest.mark.slow
def test_weed_ports_are_never_a_grpc_offset_apart():
    # weed refuses a port that is another component's HTTP port + 10000 ("reserved for gRPC
    # calculation"); a restart of the test server once failed so.
    from storage.s3server import GRPC_PORT_OFFSET, weed_ports

    names = ["s3.grpc", "master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "admin"]
    for _ in range(30):
        ports = weed_ports(names, fixed={"s3": 40000})
        values = sorted(ports.values())
        assert len(set(values)) == len(values) == len(names) + 1
        assert not {b - a for a in values for b in values} & {GRPC_PORT_OFFSET}, ports
        assert ports["admin"] + GRPC_PORT_OFFSET not in values
    assert weed_ports(["master"], fixed={"s3": 40000})["master"] not in (30000, 50000)
