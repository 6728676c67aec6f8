"""One storage layer for every stage: a local directory or an ``s3://bucket/prefix``.

Keys are ``/``-separated paths relative to the store root: no leading ``/``, no empty, ``.``
or ``..`` parts, no backslashes (``check_key``). Every place a key becomes a local path
checks it, so a key planted in a shared bucket cannot write outside a download folder.

Every object write is atomic (local: a uniquely named temporary file, fsynced, renamed, then
the folder fsynced; S3: a single PUT). A *directory* of objects becomes visible to readers
only once its ``_COMMITTED`` marker exists; the marker is written last and only if absent
(local: the folder tree fsynced first, then an exclusive hard link of a fsynced file; S3:
conditional create), so a crash mid-write never leaves anything that looks complete.
Deleting a directory removes its marker first, so a half-deleted one never looks complete
either. ``list(prefix)`` means the folder ``prefix/`` on every backend: ``models/gpt/1``
never matches ``models/gpt/10/...``.

Conditional writes: ``if_absent`` creates an object only if none exists (``AlreadyCommitted``
otherwise); ``if_match=etag`` replaces it only if it is still the object read with that ETag
(``get_bytes_with_etag``; ``PreconditionFailed`` otherwise). S3: ``If-None-Match: *`` and
``If-Match`` (SeaweedFS 4.48 honours both, on PutObject and on CompleteMultipartUpload); local:
an exclusive hard link, and a compare-and-swap under an exclusive ``flock`` of the folder's
lock file, the ETag being the content's sha256.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.contracts import STORE_TOPS
from common.errors import NoSpaceError, UserError, local_space

COMMIT_MARKER = "_COMMITTED"


class StoreError(UserError, RuntimeError):
    """A storage problem the user can act on (bad URI, rejected credentials, missing key)."""


MiB = 2**20
READ_LIMITS = {
    "record": 64 * MiB,
    "manifest": 1024 * MiB,
    "log": 2048 * MiB,
    "tokenizer": 256 * MiB,
    "object": 8192 * MiB,
}
"""The most bytes one whole read of each kind of object takes (docs/security.md): a JSON record (card, meta,
lease, attempt, result), a dataset manifest (an entry per shard), a run's JSONL log (a line per step), a
tokenizer, anything else (a shard, doc stats, work files). A planted object over its kind's limit fails the
read with one line naming its key, before its bytes are held."""


class ObjectTooLarge(StoreError):
    """An object over the read limit of its kind (``READ_LIMITS``)."""


class AlreadyCommitted(StoreError):
    """A conditional create found the object already there."""


class PreconditionFailed(StoreError):
    """A write conditional on an object's ETag found the object changed since it was read, or gone."""


class StoreFullError(StoreError, NoSpaceError):
    """The store's disk, or its bucket's quota, ran out mid-write. The half-written object was
    removed (locally: its temporary file) and the write's folder was not committed."""


def store_full(uri: str, key: str, reason: str, remedy: str = "free space there") -> StoreFullError:
    """The one line a full store ends a run with: which store, which key, what to do."""
    return StoreFullError(
        f"store {uri} is full ({reason}) while writing {key}: {remedy} or point store: (or $PRETRAIN_STORE) "
        "at a larger one, then run again; nothing partial was committed"
    )


"""S3 error codes that mean the store has no room for the write. AWS S3 has no bucket quotas;
``EntityTooLarge`` is left out: it is one object over the 5 GiB single-PUT limit, not a full store."""


@dataclass(frozen=True)
class ObjectInfo:
    """One object of a listing with its size and last write (``Store.list_info``)."""

    key: str
    size: int
    """Bytes."""
    modified: float
    """Seconds since the epoch (local mtime, S3 LastModified)."""


LOCK_NAME = ".tmp-lock"
"""A local folder's lock file for compare-and-swap writes (named like a temporary file, so that
listings and commits leave it out)."""


def check_conditions(if_absent: bool, if_match: str | None) -> None:
    if if_absent and if_match is not None:
        raise ValueError("a write is conditional on absence or on an ETag, not both")
    if if_match is not None and not if_match:
        raise ValueError("if_match needs the ETag the object was read with")


def check_range(start: int, end: int) -> None:
    if start < 0 or end < 0:
        raise ValueError(f"byte range [{start}, {end}) has a negative bound: offsets count from the start")


def content_etag(data: bytes) -> str:
    """A local object's ETag: the sha256 of its content."""
    return hashlib.sha256(data).hexdigest()


def key_problem(key: str) -> str:
    if not isinstance(key, str):
        return "is not a string"
    if not key:
        return "is empty"
    if key.startswith("/"):
        return "is absolute"
    if "\\" in key:
        return "holds a backslash"
    if "\0" in key:
        return "holds a NUL byte"
    parts = key.split("/")
    if "" in parts:
        return "has an empty part"
    if ".." in parts or "." in parts:
        return "has a '.' or '..' part"
    return ""


def check_key(key: str, *, folder: bool = False, what: str = "key") -> str:
    """``key`` if it is a relative ``/``-separated path that stays inside its folder.

    Refused with a StoreError naming it: absolute keys, ``..``/``.`` parts, empty parts and
    backslashes. ``folder=True`` accepts ``""`` (the root) and one trailing ``/`` and returns
    the folder without it.
    """
    body = key[:-1] if folder and isinstance(key, str) and key.endswith("/") else key
    if folder and body == "":
        return ""
    problem = key_problem(body)
    if problem:
        raise StoreError(
            f"{what} {key!r} {problem}: store keys are relative '/'-separated paths "
            "without empty, '.' or '..' parts or backslashes"
        )
    return body


@functools.cache
def file_mode() -> int:
    """0666 less the process umask: the mode ``open()`` would have given a new file."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


@dataclass
class Store:
    uri: str

    # -- primitives every backend implements ------------------------------------------
    def put_bytes(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> None:
        """Write ``key``. ``if_absent``: only if it does not exist (AlreadyCommitted otherwise);
        ``if_match``: only if it is still the object whose ETag that is (PreconditionFailed otherwise)."""
        raise NotImplementedError

    def put_file(self, key: str, path: str | Path, *, if_absent: bool = False) -> None:
        raise NotImplementedError

    def get_bytes(self, key: str, kind: str = "object") -> bytes:
        """The whole object ``key``; ``ObjectTooLarge`` past ``READ_LIMITS[kind]``, checked before it is read."""
        raise NotImplementedError

    def get_bytes_with_etag(self, key: str, kind: str = "record") -> tuple[bytes, str]:
        """The object and its ETag, for a later ``put_bytes(..., if_match=etag)`` (bounded as ``get_bytes``)."""
        raise NotImplementedError

    def _within_limit(self, key: str, size: int, kind: str) -> None:
        limit = READ_LIMITS[kind]
        if size > limit:
            raise ObjectTooLarge(
                f"{self.url(key)} is {size:,} bytes, over the {limit:,}-byte limit for a {kind} read whole: "
                "no object this release writes is that large; remove it, or find who wrote it"
            )

    def download(self, key: str, path: str | Path) -> None:
        """Copy ``key`` to the local file ``path``, whole or not at all: into a temporary file of its
        own beside ``path`` (two processes downloading the same file never share one), renamed over it."""
        fetch = self._fetcher(key)  # a bad key fails before anything is created
        path = Path(path)
        with local_space(path.parent, f"{path.name} (a copy of {self.url(key)})"):
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
            os.close(fd)
            try:
                fetch(tmp)
                os.chmod(tmp, file_mode())
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise

    def _fetcher(self, key: str) -> Callable[[str], None]:
        """What writes the bytes of ``key`` into a local file (``download``'s one backend part)."""
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    def modified(self, key: str) -> float | None:
        """When ``key`` was last written (seconds since the epoch); None if it does not exist."""
        raise NotImplementedError

    def list(self, prefix: str) -> list[str]:
        """All keys under ``prefix`` (recursive), sorted."""
        raise NotImplementedError

    def list_info(self, prefix: str, *, temporary: bool = False) -> list[ObjectInfo]:
        """The objects in the folder ``prefix`` (recursive; ``""``: the whole store) with their sizes and
        last writes, sorted by key, from one listing. ``temporary``: also a local store's temporary files
        (``.tmp-*``: writes in flight, or left by a killed writer; S3 has none, a PUT is atomic)."""
        raise NotImplementedError

    def delete_prefix(self, prefix: str) -> None:
        raise NotImplementedError

    def _folder_to_delete(self, prefix: str) -> str:
        """``prefix`` as a folder a delete may remove: never the whole store, nor one of its top folders
        whole (``datasets/``, ``runs/``, ``models/``: a planted key such as ``datasets//x`` once made gc
        name ``datasets/`` as one leftover)."""
        folder = check_key(prefix, folder=True, what="prefix")
        if not folder:
            raise StoreError(f"refusing to delete the whole store {self.uri}: name a folder")
        if folder in STORE_TOPS:
            raise StoreError(f"refusing to delete {self.url(folder)}/ whole: name one of its entries")
        return folder

    def check(self) -> None:
        """Fail now, with a clear message, if the store cannot be written."""
        raise NotImplementedError

    def open_read(self, key: str):  # -> binary file-like
        raise NotImplementedError

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """The bytes ``[start, end)`` of ``key`` (``end`` exclusive), read without fetching the rest.

        An ``end`` past the object's size gives the bytes up to its end, a ``start`` at or past it
        gives ``b""``, and so does ``start >= end``; a missing key raises StoreError all the same.
        A negative ``start`` or ``end`` is a ValueError (there are no suffix ranges here)."""
        raise NotImplementedError

    def copy(self, src: str, dst: str) -> None:
        """Make ``dst`` an object with the bytes of ``src``, replacing any ``dst``, atomically (a reader
        sees the old ``dst`` or the whole copy), without the bytes passing through this process where
        the backend allows (local: a hard link; S3: a server-side copy). Later writes to either key
        leave the other as it is. A missing ``src`` raises StoreError naming it.

        The copy's ``modified()``: S3 the time of the copy; local the source's last write (the two
        share one inode, so one mtime)."""
        raise NotImplementedError

    # -- helpers built on the primitives ---------------------------------------------
    def url(self, key: str) -> str:
        return f"{self.uri.rstrip('/')}/{key}"

    def put_json(self, key: str, obj: Any, *, if_absent: bool = False, if_match: str | None = None) -> None:
        self.put_bytes(key, json.dumps(obj, indent=2, sort_keys=True).encode(), if_absent=if_absent, if_match=if_match)

    def get_json(self, key: str, kind: str = "record") -> Any:
        return json.loads(self.get_bytes(key, kind))

    def get_json_with_etag(self, key: str) -> tuple[Any, str]:
        data, etag = self.get_bytes_with_etag(key)
        return json.loads(data), etag

    def upload_dir(self, local_dir: str | Path, prefix: str, *, if_absent: bool = False) -> list[str]:
        """Upload every file under ``local_dir`` to the folder ``prefix``; ``if_absent``: each one
        only if its key does not exist yet (AlreadyCommitted at the first that does)."""
        local_dir = Path(local_dir)
        folder = check_key(prefix, folder=True, what="prefix")
        keys = []
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            rel = path.relative_to(local_dir).as_posix()
            key = f"{folder}/{rel}" if folder else rel
            self.put_file(key, path, if_absent=if_absent)
            keys.append(key)
        return keys

    def relative(self, prefix: str, key: str) -> str:
        """``key`` relative to the folder ``prefix``, checked to stay inside it (StoreError if not)."""
        folder = check_key(prefix, folder=True, what="prefix")
        if folder and not key.startswith(f"{folder}/"):
            raise StoreError(f"key {key!r} is not under {folder}/")
        rel = key[len(folder) + 1 :] if folder else key
        check_key(rel, what=f"key {key!r} under {folder or 'the store root'}: relative path")
        return rel

    def download_dir(self, prefix: str, local_dir: str | Path) -> Path:
        """Copy every object in the folder ``prefix`` to ``local_dir``, keeping relative paths.

        Every key is checked before anything is written: a listing that holds a key escaping
        the folder (``..``, an absolute or empty part, a backslash) writes nothing.
        """
        local_dir = Path(local_dir)
        folder = check_key(prefix, folder=True, what="prefix")
        planned = [(key, self.relative(folder, key)) for key in self.list(f"{folder}/" if folder else "")]
        for key, rel in planned:
            self.download(key, local_dir / rel)
        return local_dir

    def commit(self, prefix: str, info: dict[str, Any] | None = None) -> None:
        """Mark ``prefix`` complete. Raises AlreadyCommitted if someone committed it first."""
        self.put_json(f"{check_key(prefix, folder=True, what='prefix')}/{COMMIT_MARKER}", info or {}, if_absent=True)

    def is_committed(self, prefix: str) -> bool:
        return self.exists(f"{check_key(prefix, folder=True, what='prefix')}/{COMMIT_MARKER}")

    def children(self, prefix: str) -> list[str]:
        """Names of the immediate sub-directories of ``prefix`` (names no key could use, such
        as ``..`` or empty ones from a planted S3 key, are not folders and are left out)."""
        folder = check_key(prefix, folder=True, what="prefix")
        start = f"{folder}/" if folder else ""
        names = {k[len(start) :].split("/", 1)[0] for k in self.list(start) if "/" in k[len(start) :]}
        return sorted(n for n in names if not key_problem(n))
