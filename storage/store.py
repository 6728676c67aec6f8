"""One storage layer for every stage: a local directory or an ``s3://bucket/prefix``.

Keys are ``/``-separated paths relative to the store root. Every object write is atomic
(local: write a temp file then rename; S3: a single PUT). A *directory* of objects becomes
visible to readers only once its ``_COMMITTED`` marker exists; the marker is written last
and only if absent (S3 conditional create), so a crash mid-write never leaves anything
that looks complete.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import UserError

COMMIT_MARKER = "_COMMITTED"
DEFAULT_STORE_ENV = "PRETRAIN_STORE"


class StoreError(UserError, RuntimeError):
    """A storage problem the user can act on (bad URI, rejected credentials, missing key)."""


class AlreadyCommitted(StoreError):
    """A conditional create found the object already there."""


def default_store_uri() -> str:
    """``$PRETRAIN_STORE``, else a per-user data directory (XDG)."""
    if os.environ.get(DEFAULT_STORE_ENV):
        return os.environ[DEFAULT_STORE_ENV]
    data_home = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return os.path.join(data_home, "pretrain", "store")


def open_store(uri: str = "") -> Store:
    """The store at ``uri`` (``s3://bucket/prefix`` or a local path); empty means the default."""
    uri = uri or default_store_uri()
    if uri.startswith("s3://"):
        return S3Store(uri)
    if "://" in uri and not uri.startswith("file://"):
        raise StoreError(f"unsupported store URI {uri!r}: use a local path or s3://bucket/prefix")
    return LocalStore(uri.removeprefix("file://"))


@dataclass
class Store:
    uri: str

    # -- primitives every backend implements ------------------------------------------
    def put_bytes(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        raise NotImplementedError

    def put_file(self, key: str, path: str | Path) -> None:
        raise NotImplementedError

    def get_bytes(self, key: str) -> bytes:
        raise NotImplementedError

    def download(self, key: str, path: str | Path) -> None:
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    def list(self, prefix: str) -> list[str]:
        """All keys under ``prefix`` (recursive), sorted."""
        raise NotImplementedError

    def delete_prefix(self, prefix: str) -> None:
        raise NotImplementedError

    def check(self) -> None:
        """Fail now, with a clear message, if the store cannot be written."""
        raise NotImplementedError

    def open_read(self, key: str):  # -> binary file-like
        raise NotImplementedError

    # -- helpers built on the primitives ---------------------------------------------
    def url(self, key: str) -> str:
        return f"{self.uri.rstrip('/')}/{key}"

    def put_json(self, key: str, obj: Any, *, if_absent: bool = False) -> None:
        self.put_bytes(key, json.dumps(obj, indent=2, sort_keys=True).encode(), if_absent=if_absent)

    def get_json(self, key: str) -> Any:
        return json.loads(self.get_bytes(key))

    def upload_dir(self, local_dir: str | Path, prefix: str) -> list[str]:
        local_dir = Path(local_dir)
        keys = []
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            key = f"{prefix}/{path.relative_to(local_dir).as_posix()}"
            self.put_file(key, path)
            keys.append(key)
        return keys

    def download_dir(self, prefix: str, local_dir: str | Path) -> Path:
        local_dir = Path(local_dir)
        for key in self.list(prefix):
            rel = key[len(prefix) :].lstrip("/")
            self.download(key, local_dir / rel)
        return local_dir

    def commit(self, prefix: str, info: dict[str, Any] | None = None) -> None:
        """Mark ``prefix`` complete. Raises AlreadyCommitted if someone committed it first."""
        self.put_json(f"{prefix}/{COMMIT_MARKER}", info or {}, if_absent=True)

    def is_committed(self, prefix: str) -> bool:
        return self.exists(f"{prefix}/{COMMIT_MARKER}")

    def children(self, prefix: str) -> list[str]:
        """Names of the immediate sub-directories of ``prefix``."""
        prefix = prefix.rstrip("/") + "/"
        names = {k[len(prefix) :].split("/", 1)[0] for k in self.list(prefix) if "/" in k[len(prefix) :]}
        return sorted(names)


class LocalStore(Store):
    def __init__(self, root: str) -> None:
        super().__init__(uri=os.path.abspath(os.path.expanduser(root)))
        self.root = Path(self.uri)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents and path != self.root.resolve():
            raise StoreError(f"key {key!r} escapes the store root {self.root}")
        return path

    def put_bytes(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        if if_absent:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError as e:
                raise AlreadyCommitted(f"{self.url(key)} already exists") from e
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tmp-", delete=False) as f:
            f.write(data)
        os.replace(f.name, path)

    def put_file(self, key: str, path: str | Path) -> None:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f".tmp-{dest.name}-{os.getpid()}"
        shutil.copyfile(path, tmp)
        os.replace(tmp, dest)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as e:
            raise StoreError(f"{self.url(key)} does not exist") from e

    def open_read(self, key: str):
        try:
            return open(self._path(key), "rb")
        except FileNotFoundError as e:
            raise StoreError(f"{self.url(key)} does not exist") from e

    def download(self, key: str, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(self._path(key), path)
        except FileNotFoundError as e:
            raise StoreError(f"{self.url(key)} does not exist") from e

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if base.is_file():
            return [prefix]
        if not base.is_dir():
            return []
        keys = [p.relative_to(self.root).as_posix() for p in base.rglob("*") if p.is_file() and not p.name.startswith(".tmp-")]
        return sorted(keys)

    def delete_prefix(self, prefix: str) -> None:
        shutil.rmtree(self._path(prefix), ignore_errors=True)

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = tempfile.NamedTemporaryFile(dir=self.root, prefix=".tmp-probe-")
            probe.close()
        except OSError as e:
            raise StoreError(f"store directory {self.root} is not writable: {e}") from e


class S3Store(Store):
    """``s3://bucket/prefix`` through boto3.

    Endpoint and credentials come from the standard AWS environment
    (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, profiles).
    """

    def __init__(self, uri: str) -> None:
        super().__init__(uri=uri.rstrip("/"))
        bucket_and_prefix = uri[len("s3://") :]
        self.bucket, _, self.prefix = bucket_and_prefix.partition("/")
        if not self.bucket:
            raise StoreError(f"store URI {uri!r} names no bucket: use s3://bucket/prefix")
        self._client = None

    @property
    def client(self):
        if self._client is None:
            import boto3
            from botocore.config import Config

            # A new session per store: boto3's default session caches the first credentials it saw.
            self._client = boto3.session.Session().client(
                "s3",
                config=Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=60),
            )
        return self._client

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _explain(self, err: Exception, key: str) -> StoreError:
        from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

        where = self.url(key)
        endpoint = os.environ.get("AWS_ENDPOINT_URL", "the default AWS endpoint")
        if isinstance(err, NoCredentialsError):
            return StoreError(f"no S3 credentials for {where}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
        if isinstance(err, EndpointConnectionError):
            return StoreError(f"cannot reach S3 endpoint {endpoint} for {where}: is the server running?")
        if isinstance(err, ClientError):
            code = err.response.get("Error", {}).get("Code", "")
            if code in {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"}:
                return StoreError(
                    f"S3 endpoint {endpoint} rejected the credentials for {where} ({code}): "
                    "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
                )
            if code in {"NoSuchBucket"}:
                return StoreError(f"bucket {self.bucket!r} does not exist at {endpoint}: create it first")
            if code in {"NoSuchKey", "404"}:
                return StoreError(f"{where} does not exist")
            return StoreError(f"S3 error on {where}: {code}: {err}")
        return StoreError(f"S3 error on {where}: {err}")

    def _call(self, key: str, fn, **kwargs):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(**kwargs)
        except (ClientError, BotoCoreError) as e:
            raise self._explain(e, key) from e

    def put_bytes(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        from botocore.exceptions import ClientError

        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key), "Body": data}
        if if_absent:
            kwargs["IfNoneMatch"] = "*"
        try:
            self._call(key, self.client.put_object, **kwargs)
        except StoreError as e:
            cause = e.__cause__
            if isinstance(cause, ClientError) and cause.response["Error"].get("Code") in {
                "PreconditionFailed",
                "412",
                "ConditionalRequestConflict",
            }:
                raise AlreadyCommitted(f"{self.url(key)} already exists") from cause
            raise

    def put_file(self, key: str, path: str | Path) -> None:
        # upload_file does multipart with per-part checksums for large files.
        self._call(key, self.client.upload_file, Filename=str(path), Bucket=self.bucket, Key=self._key(key))

    def get_bytes(self, key: str) -> bytes:
        return self.open_read(key).read()

    def open_read(self, key: str):
        resp = self._call(key, self.client.get_object, Bucket=self.bucket, Key=self._key(key))
        return resp["Body"]

    def download(self, key: str, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tmp = f"{path}.part"
        self._call(key, self.client.download_file, Bucket=self.bucket, Key=self._key(key), Filename=tmp)
        os.replace(tmp, path)

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
                return False
            raise self._explain(e, key) from e

    def _iter_keys(self, prefix: str) -> Iterator[str]:
        full = self._key(prefix)
        paginator = self.client.get_paginator("list_objects_v2")
        strip = len(self.prefix) + 1 if self.prefix else 0
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
                for obj in page.get("Contents", []):
                    yield obj["Key"][strip:]
        except (ClientError, BotoCoreError) as e:
            raise self._explain(e, prefix) from e

    def list(self, prefix: str) -> list[str]:
        return sorted(self._iter_keys(prefix))

    def delete_prefix(self, prefix: str) -> None:
        keys = self.list(prefix)
        for i in range(0, len(keys), 1000):
            batch = [{"Key": self._key(k)} for k in keys[i : i + 1000]]
            self._call(prefix, self.client.delete_objects, Bucket=self.bucket, Delete={"Objects": batch})

    def check(self) -> None:
        probe = f"_probe/{os.getpid()}"
        self.put_bytes(probe, b"ok")
        self._call(probe, self.client.delete_object, Bucket=self.bucket, Key=self._key(probe))
