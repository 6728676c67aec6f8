"""An S3-compatible bucket as a store, through boto3: conditional writes with ``If-None-Match: *`` and
``If-Match``, multipart uploads of large files (``storage.store``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from storage.store import (
    COMMIT_MARKER,
    AlreadyCommitted,
    ObjectInfo,
    PreconditionFailed,
    Store,
    StoreError,
    check_conditions,
    check_key,
    check_range,
    store_full,
)

S3_FULL_CODES = frozenset(
    {
        "QuotaExceeded",  # Ceph RGW and others: a user or bucket quota
        "XMinioAdminBucketQuotaExceeded",  # MinIO: a bucket quota
        "XMinioStorageFull",  # MinIO: the drives are full
        "InsufficientStorage",  # HTTP 507 from several servers
        "507",
        "StorageFull",
        "DiskFull",
    }
)


class S3Store(Store):
    """``s3://bucket/prefix`` through boto3.

    Endpoint and credentials come from the standard AWS environment
    (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, profiles).
    """

    def __init__(self, uri: str) -> None:
        super().__init__(uri=uri.rstrip("/"))
        bucket_and_prefix = self.uri[len("s3://") :]
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
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

        if isinstance(err, S3UploadFailedError) and isinstance(err.__context__, ClientError):
            err = err.__context__  # upload_file re-raises the server's answer as text: its code is here
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
            if code in S3_FULL_CODES:
                message = err.response.get("Error", {}).get("Message", "")
                reason = f"S3 {code}" + (f": {message.rstrip('.')}" if message else "")
                return store_full(self.uri, key, reason, remedy=f"raise bucket {self.bucket!r}'s quota, free space in it")
            return StoreError(f"S3 error on {where}: {code}: {err}")
        return StoreError(f"S3 error on {where}: {err}")

    def _call(self, key: str, fn, **kwargs):
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(**kwargs)
        except (ClientError, BotoCoreError, S3UploadFailedError) as e:
            raise self._explain(e, key) from e

    multipart_threshold = 64 * 1024 * 1024
    """Conditional file uploads above this size go in parts (``put_file(..., if_absent=True)``)."""
    multipart_chunk = 16 * 1024 * 1024
    """Part size of those uploads (S3: at least 5 MiB, at most 10,000 parts)."""

    def _conditional(self, key: str, fn, *, if_absent: bool, if_match: str | None, **kwargs):
        """``fn(**kwargs)`` with the condition's header; a failed precondition raised as
        AlreadyCommitted (``if_absent``) or PreconditionFailed (``if_match``)."""
        from botocore.exceptions import ClientError

        if if_absent:
            kwargs["IfNoneMatch"] = "*"
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        try:
            return self._call(key, fn, **kwargs)
        except StoreError as e:
            cause = e.__cause__
            code = cause.response["Error"].get("Code") if isinstance(cause, ClientError) else None
            # 409 ConditionalRequestConflict: another conditional write to the key was in flight.
            if if_absent and code in {"PreconditionFailed", "412", "ConditionalRequestConflict"}:
                raise AlreadyCommitted(f"{self.url(key)} already exists") from cause
            if if_match is not None and code in {"PreconditionFailed", "412", "ConditionalRequestConflict", "NoSuchKey", "404"}:
                raise PreconditionFailed(f"{self.url(key)} changed since it was read, or is gone ({code})") from cause
            raise

    def put_bytes(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> None:
        check_conditions(if_absent, if_match)
        # Writes are checked like local paths: what we write can be downloaded anywhere.
        full = self._key(check_key(key))
        put = self.client.put_object
        self._conditional(key, put, if_absent=if_absent, if_match=if_match, Bucket=self.bucket, Key=full, Body=data)

    def put_file(self, key: str, path: str | Path, *, if_absent: bool = False) -> None:
        full = self._key(check_key(key))
        if not if_absent:
            # upload_file does multipart with per-part checksums for large files.
            self._call(key, self.client.upload_file, Filename=str(path), Bucket=self.bucket, Key=full)
            return
        # upload_file cannot send If-None-Match: one conditional PUT, or parts and a conditional
        # CompleteMultipartUpload (what a bucket policy requiring the header lets through).
        size = os.path.getsize(path)
        if size <= self.multipart_threshold:
            with open(path, "rb") as body:
                put = self.client.put_object
                self._conditional(key, put, if_absent=True, if_match=None, Bucket=self.bucket, Key=full, Body=body)
            return
        create = self.client.create_multipart_upload
        upload_id = self._call(key, create, Bucket=self.bucket, Key=full, ChecksumAlgorithm="CRC32")["UploadId"]
        try:
            parts = self._upload_parts(key, full, upload_id, Path(path), size)
            self._conditional(
                key,
                self.client.complete_multipart_upload,
                if_absent=True,
                if_match=None,
                Bucket=self.bucket,
                Key=full,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            )
        except BaseException:
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
            except Exception:  # noqa: BLE001 - the upload's own error is the one to raise
                pass
            raise

    def _upload_parts(self, key: str, full: str, upload_id: str, path: Path, size: int) -> list[dict[str, Any]]:
        chunk = max(self.multipart_chunk, -(-size // 10_000))
        starts = range(0, size, chunk)

        def part(number: int, start: int) -> dict[str, Any]:
            with open(path, "rb") as f:
                data = os.pread(f.fileno(), min(chunk, size - start), start)
            resp = self._call(
                key,
                self.client.upload_part,
                Bucket=self.bucket,
                Key=full,
                UploadId=upload_id,
                PartNumber=number,
                Body=data,
                ChecksumAlgorithm="CRC32",
            )
            done = {"ETag": resp["ETag"], "PartNumber": number}
            if resp.get("ChecksumCRC32"):
                done["ChecksumCRC32"] = resp["ChecksumCRC32"]
            return done

        with ThreadPoolExecutor(max_workers=min(8, len(starts))) as pool:
            return list(pool.map(part, range(1, len(starts) + 1), starts))

    def get_bytes(self, key: str, kind: str = "object") -> bytes:
        return self.get_bytes_with_etag(key, kind)[0]

    def get_bytes_with_etag(self, key: str, kind: str = "record") -> tuple[bytes, str]:
        resp = self._call(key, self.client.get_object, Bucket=self.bucket, Key=self._key(key))
        with resp["Body"] as body:
            self._within_limit(key, int(resp.get("ContentLength", 0)), kind)
            data = body.read()
        return data, resp["ETag"]

    def open_read(self, key: str):
        resp = self._call(key, self.client.get_object, Bucket=self.bucket, Key=self._key(key))
        return resp["Body"]

    def get_range(self, key: str, start: int, end: int) -> bytes:
        from botocore.exceptions import ClientError

        check_range(start, end)
        full = self._key(check_key(key))
        if start >= end:
            # No Range header names zero bytes; the HEAD still reports a missing key as every read does.
            self._call(key, self.client.head_object, Bucket=self.bucket, Key=full)
            return b""
        try:
            resp = self._call(key, self.client.get_object, Bucket=self.bucket, Key=full, Range=f"bytes={start}-{end - 1}")
        except StoreError as e:
            cause = e.__cause__
            code = cause.response.get("Error", {}).get("Code") if isinstance(cause, ClientError) else None
            if code in {"InvalidRange", "416"}:  # ``start`` at or past the end (or an empty object)
                return b""
            raise
        return resp["Body"].read()

    copy_multipart_threshold = 5 * 1024**3
    """Copies above this size go in parts (UploadPartCopy); below, one CopyObject (S3's limit: 5 GiB)."""
    copy_multipart_chunk = 256 * 1024**2
    """Part size of those copies (raised as needed to stay within 10,000 parts)."""

    def copy(self, src: str, dst: str) -> None:
        from boto3.s3.transfer import TransferConfig
        from botocore.exceptions import ClientError

        source = {"Bucket": self.bucket, "Key": self._key(check_key(src))}
        full = self._key(check_key(dst))
        if source["Key"] == full:
            # S3 refuses a copy onto itself (InvalidRequest); the bytes are there already if the key is.
            self._call(src, self.client.head_object, Bucket=self.bucket, Key=full)
            return
        config = TransferConfig(multipart_threshold=self.copy_multipart_threshold, multipart_chunksize=self.copy_multipart_chunk)
        try:
            self._call(dst, self.client.copy, CopySource=source, Bucket=self.bucket, Key=full, Config=config)
        except StoreError as e:
            cause = e.__cause__
            code = cause.response.get("Error", {}).get("Code") if isinstance(cause, ClientError) else None
            # The managed copy HEADs the source first: a missing one is a 404 there (NoSuchKey from a
            # CopyObject when it goes away in between); errors of the write itself name ``dst``.
            if code in {"404", "NoSuchKey", "NotFound"}:
                raise StoreError(f"{self.url(src)} does not exist: nothing to copy to {self.url(dst)}") from cause
            raise

    def _fetcher(self, key: str) -> Callable[[str], None]:
        s3_key = self._key(key)
        return lambda tmp: self._call(key, self.client.download_file, Bucket=self.bucket, Key=s3_key, Filename=tmp)

    def exists(self, key: str) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
                return False
            raise self._explain(e, key) from e
        except BotoCoreError as e:  # the server unreachable: a StoreError like every other call's
            raise self._explain(e, key) from e

    def modified(self, key: str) -> float | None:
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
                return None
            raise self._explain(e, key) from e
        return head["LastModified"].timestamp()

    def _iter_keys(self, prefix: str) -> Iterator[str]:
        """Keys starting with the string ``prefix`` (relative to the store's own prefix)."""
        full = self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
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
        """The keys in the folder ``prefix`` (``prefix/``, with or without the trailing ``/``;
        ``models/gpt/1`` never matches ``models/gpt/10/...``), or ``[prefix]`` when it is itself
        an object and the folder is empty, as on a local store."""
        if not prefix:
            return sorted(self._iter_keys(""))
        if prefix.endswith("/"):
            return sorted(self._iter_keys(prefix))
        keys = sorted(self._iter_keys(f"{prefix}/"))
        if not keys and self.exists(prefix):
            return [prefix]
        return keys

    def list_info(self, prefix: str, *, temporary: bool = False) -> list[ObjectInfo]:
        folder = check_key(prefix, folder=True, what="prefix")
        start = f"{folder}/" if folder else ""
        full = self._key(start) if start else (f"{self.prefix}/" if self.prefix else "")
        strip = len(self.prefix) + 1 if self.prefix else 0
        from botocore.exceptions import BotoCoreError, ClientError

        found = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
                for obj in page.get("Contents", []):
                    found.append(ObjectInfo(obj["Key"][strip:], obj["Size"], obj["LastModified"].timestamp()))
        except (ClientError, BotoCoreError) as e:
            raise self._explain(e, start) from e
        return sorted(found, key=lambda o: o.key)

    def delete_prefix(self, prefix: str) -> None:
        """The marker first, then the rest: a half-deleted folder is never complete."""
        folder = self._folder_to_delete(prefix)
        marker = f"{folder}/{COMMIT_MARKER}"
        self._call(marker, self.client.delete_object, Bucket=self.bucket, Key=self._key(marker))
        keys = self.list(folder)
        for i in range(0, len(keys), 1000):
            batch = [{"Key": self._key(k)} for k in keys[i : i + 1000]]
            resp = self._call(prefix, self.client.delete_objects, Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            if resp.get("Errors"):
                first = resp["Errors"][0]
                raise StoreError(
                    f"S3 refused to delete {len(resp['Errors'])} object(s) under {self.url(folder)}, "
                    f"e.g. {first.get('Key')}: {first.get('Code')} {first.get('Message', '')}"
                )

    def check(self) -> None:
        probe = f"_probe/{os.getpid()}"
        self.put_bytes(probe, b"ok")
        self._call(probe, self.client.delete_object, Bucket=self.bucket, Key=self._key(probe))
