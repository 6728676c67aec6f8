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

import fcntl
import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import NoSpaceError, UserError, is_no_space, local_space

COMMIT_MARKER = "_COMMITTED"
DEFAULT_STORE_ENV = "PRETRAIN_STORE"


class StoreError(UserError, RuntimeError):
    """A storage problem the user can act on (bad URI, rejected credentials, missing key)."""


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


def _conditions(if_absent: bool, if_match: str | None) -> None:
    if if_absent and if_match is not None:
        raise ValueError("a write is conditional on absence or on an ETag, not both")
    if if_match is not None and not if_match:
        raise ValueError("if_match needs the ETag the object was read with")


def _check_range(start: int, end: int) -> None:
    if start < 0 or end < 0:
        raise ValueError(f"byte range [{start}, {end}) has a negative bound: offsets count from the start")


def content_etag(data: bytes) -> str:
    """A local object's ETag: the sha256 of its content."""
    return hashlib.sha256(data).hexdigest()


def _key_problem(key: str) -> str:
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
    problem = _key_problem(body)
    if problem:
        raise StoreError(
            f"{what} {key!r} {problem}: store keys are relative '/'-separated paths "
            "without empty, '.' or '..' parts or backslashes"
        )
    return body


@functools.cache
def _file_mode() -> int:
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


def _fsync_dir(path: str | Path) -> None:
    _fsync_path(path)


def _fsync_path(path: str | Path) -> None:
    """fsync a file or folder by name (an O_RDONLY descriptor flushes the inode all the same)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # deleted meanwhile: nothing of it to make durable
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_all(paths: list[Path]) -> None:
    """fsync every path, concurrently: the filesystem's journal commits many fsyncs at once
    (1,000 small files: ~0.2 s in 32 threads against ~2-3 s one after the other here)."""
    if len(paths) <= 2:
        for path in paths:
            _fsync_path(path)
        return
    with ThreadPoolExecutor(max_workers=min(32, len(paths))) as pool:
        list(pool.map(_fsync_path, paths))


def _replace(tmp: str, path: Path) -> None:
    try:
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


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
    def put_bytes(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> None:
        """Write ``key``. ``if_absent``: only if it does not exist (AlreadyCommitted otherwise);
        ``if_match``: only if it is still the object whose ETag that is (PreconditionFailed otherwise)."""
        raise NotImplementedError

    def put_file(self, key: str, path: str | Path, *, if_absent: bool = False) -> None:
        raise NotImplementedError

    def get_bytes(self, key: str) -> bytes:
        raise NotImplementedError

    def get_bytes_with_etag(self, key: str) -> tuple[bytes, str]:
        """The object and its ETag, for a later ``put_bytes(..., if_match=etag)``."""
        raise NotImplementedError

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
                os.chmod(tmp, _file_mode())
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

    def get_json(self, key: str) -> Any:
        return json.loads(self.get_bytes(key))

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
        return sorted(n for n in names if not _key_problem(n))


class LocalStore(Store):
    """A directory.

    Every write goes to a uniquely named temporary file in the target folder and is renamed
    into place, so a reader sees a whole object or none. Durability is the commit's job:
    ``commit`` fsyncs every file and folder under the prefix (in parallel, so the filesystem
    journal batches them) and only then creates the marker, itself fsynced and created
    exclusively. Conditional creates (``if_absent``: markers, claims) are fsynced as they
    are written, with any folder they created. Other objects are atomic but not fsynced one
    by one: 1,000 small writes took ~0.7 s without and 5-10 s with a fsync each (ext4 on a
    virtual disk), while the commit's concurrent pass costs about two fsync latencies.
    """

    def __init__(self, root: str) -> None:
        super().__init__(uri=os.path.abspath(os.path.expanduser(root)))
        self.root = Path(self.uri)

    @contextmanager
    def _space(self, key: str) -> Iterator[None]:
        """A full disk or quota under the store while writing ``key`` becomes a StoreFullError
        naming both (the temporary file is gone by then: ``_write_temp`` removes its own)."""
        try:
            yield
        except OSError as e:
            if not is_no_space(e):
                raise
            raise store_full(self.uri, key, (e.strerror or "no space left").lower()) from e

    def _path(self, key: str, *, folder: bool = False) -> Path:
        rel = check_key(key, folder=folder)
        root = self.root.resolve()
        path = (self.root / rel).resolve() if rel else root
        if path != root and root not in path.parents:  # a symlink inside the store pointing out
            raise StoreError(f"key {key!r} escapes the store root {self.root}")
        return path

    @staticmethod
    def _makedirs(folder: Path) -> list[Path]:
        """Create ``folder`` and its missing parents; the folders created, outermost first."""
        missing = []
        while not folder.is_dir():
            missing.append(folder)
            folder = folder.parent
        created = []
        for path in reversed(missing):
            try:
                path.mkdir()
                created.append(path)
            except FileExistsError:
                if not path.is_dir():
                    raise
        return created

    def _write_temp(self, folder: Path, data: bytes | None = None, source: str | Path | None = None, sync: bool = False) -> str:
        """A new temporary file in ``folder`` holding ``data`` or a copy of ``source``; removed
        again if anything fails (a full disk must not keep the little space it took)."""
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                if source is None:
                    f.write(data or b"")
                    f.flush()
                    if sync:
                        os.fsync(f.fileno())
            if source is not None:
                shutil.copyfile(source, tmp)  # sendfile into the same (truncated) file
                if sync:
                    _fsync_path(tmp)
            os.chmod(tmp, _file_mode())  # mkstemp makes 0600; objects get the usual umask mode
        except BaseException:
            os.unlink(tmp)
            raise
        return tmp

    def put_bytes(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> None:
        _conditions(if_absent, if_match)
        path = self._path(key)
        with self._space(key):
            if if_match is not None:
                self._replace_if_match(key, path, data, if_match)
                return
            created = self._makedirs(path.parent)
            tmp = self._write_temp(path.parent, data, sync=if_absent)
            if not if_absent:
                _replace(tmp, path)
                return
            self._link_new(tmp, path, key, created)

    def _link_new(self, tmp: str, path: Path, key: str, created: list[Path]) -> None:
        """Give the fsynced temporary file ``tmp`` the name ``path`` if nothing has it yet."""
        try:
            os.link(tmp, path)  # atomic and exclusive: fails if ``path`` exists
        except FileExistsError as e:
            raise AlreadyCommitted(f"{self.url(key)} already exists") from e
        except OSError:  # a filesystem without hard links: exclusive create, then copy
            self._create_exclusive(tmp, path, key)
        finally:
            os.unlink(tmp)
        for folder in {p.parent for p in created} | {path.parent}:
            _fsync_dir(folder)

    def _create_exclusive(self, tmp: str, path: Path, key: str) -> None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _file_mode())
        except FileExistsError as e:
            raise AlreadyCommitted(f"{self.url(key)} already exists") from e
        try:
            with os.fdopen(fd, "wb") as dst, open(tmp, "rb") as src:
                shutil.copyfileobj(src, dst)
                dst.flush()
                os.fsync(dst.fileno())
        except BaseException:
            # A half-copied marker would make its folder look committed: it goes (it is ours: O_EXCL).
            os.unlink(path)
            raise

    def _replace_if_match(self, key: str, path: Path, data: bytes, etag: str) -> None:
        """Compare-and-swap: under an exclusive lock of the folder's lock file (every such write
        to the folder takes it), replace ``path`` only if its content still has ``etag``."""
        folder = path.parent
        try:
            lock = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except FileNotFoundError as e:
            raise PreconditionFailed(f"{self.url(key)} does not exist: nothing to replace") from e
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = path.read_bytes()
            except FileNotFoundError as e:
                raise PreconditionFailed(f"{self.url(key)} does not exist: nothing to replace") from e
            if content_etag(current) != etag:
                raise PreconditionFailed(f"{self.url(key)} changed since it was read (ETag {etag[:12]}…)")
            _replace(self._write_temp(folder, data, sync=True), path)
            _fsync_dir(folder)
        finally:
            os.close(lock)  # releases the lock

    def put_file(self, key: str, path: str | Path, *, if_absent: bool = False) -> None:
        dest = self._path(key)
        with self._space(key):
            created = self._makedirs(dest.parent)
            tmp = self._write_temp(dest.parent, source=path, sync=if_absent)
            if if_absent:
                self._link_new(tmp, dest, key, created)
            else:
                _replace(tmp, dest)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as e:
            raise StoreError(f"{self.url(key)} does not exist") from e

    def get_bytes_with_etag(self, key: str) -> tuple[bytes, str]:
        data = self.get_bytes(key)  # writes are renames: one whole object, whose hash is its ETag
        return data, content_etag(data)

    def open_read(self, key: str):
        try:
            return open(self._path(key), "rb")
        except FileNotFoundError as e:
            raise StoreError(f"{self.url(key)} does not exist") from e

    def get_range(self, key: str, start: int, end: int) -> bytes:
        _check_range(start, end)
        with self.open_read(key) as f:
            if start >= end:
                return b""
            f.seek(start)
            return f.read(end - start)

    def copy(self, src: str, dst: str) -> None:
        source, dest = self._path(src), self._path(dst)
        with self._space(dst):
            self._makedirs(dest.parent)
            tmp = self._link_temp(source, dest.parent, src)
            _replace(tmp, dest)
            if os.path.lexists(tmp):
                # ``dst`` already was a link of ``src`` (copied before): rename(2) then does nothing
                # and leaves the temporary name behind.
                os.unlink(tmp)

    def _link_temp(self, source: Path, folder: Path, src: str) -> str:
        """A new temporary name in ``folder`` for the bytes of ``source``: a hard link to it (no bytes
        move), or a copy where the filesystem links nothing across (another device, no hard links).

        Sharing the inode is safe because no write here ever changes a file in place: every write
        is a new temporary file renamed over the name (a new inode), so overwriting ``src`` later
        leaves ``dst`` with the old bytes, and the other way round."""
        while True:
            tmp = str(folder / f".tmp-{os.urandom(8).hex()}")  # ``.tmp-``: listings skip it, gc knows it
            try:
                os.link(source, tmp)
                return tmp
            except FileExistsError:
                continue  # a name already taken: draw another
            except FileNotFoundError as e:
                if not source.is_file():
                    raise StoreError(f"{self.url(src)} does not exist") from e
                raise
            except OSError:
                break
        try:
            return self._write_temp(folder, source=source)
        except FileNotFoundError as e:
            if not source.is_file():
                raise StoreError(f"{self.url(src)} does not exist") from e
            raise

    def _fetcher(self, key: str) -> Callable[[str], None]:
        src = self._path(key)

        def fetch(tmp: str) -> None:
            try:
                shutil.copyfile(src, tmp)
            except FileNotFoundError as e:
                raise StoreError(f"{self.url(key)} does not exist") from e

        return fetch

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def modified(self, key: str) -> float | None:
        path = self._path(key)
        return path.stat().st_mtime if path.is_file() else None

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix, folder=True)
        if base.is_file() and not prefix.endswith("/"):
            return [prefix]
        if not base.is_dir():
            return []
        root = self.root.resolve()
        files = (p for p in base.rglob("*") if p.is_file() and not p.name.startswith(".tmp-"))
        return sorted(p.relative_to(root).as_posix() for p in files)

    def list_info(self, prefix: str, *, temporary: bool = False) -> list[ObjectInfo]:
        base = self._path(prefix, folder=True)
        if not base.is_dir():
            return []
        root = self.root.resolve()
        found = []
        for path in base.rglob("*"):
            if path.name.startswith(".tmp-") and not temporary:
                continue
            try:
                st = path.stat()
            except FileNotFoundError:
                continue  # renamed into place or removed since the walk saw it
            if not path.is_dir():
                found.append(ObjectInfo(path.relative_to(root).as_posix(), st.st_size, st.st_mtime))
        return sorted(found, key=lambda o: o.key)

    def commit(self, prefix: str, info: dict[str, Any] | None = None) -> None:
        """Make everything under ``prefix`` durable, then create the marker.

        One concurrent pass fsyncs every file and folder below ``prefix`` (whoever wrote
        them), the folders from ``prefix`` up to the root and the marker's content in a
        temporary file; then the marker is hard-linked into place (exclusive: AlreadyCommitted
        if it exists) and its folder fsynced. Two fsync latencies per commit."""
        folder_key = check_key(prefix, folder=True, what="prefix")
        key = f"{folder_key}/{COMMIT_MARKER}" if folder_key else COMMIT_MARKER
        marker = self._path(key)
        if marker.exists():
            raise AlreadyCommitted(f"{self.url(key)} already exists")
        with self._space(key):
            self._commit(marker, key, info)

    def _commit(self, marker: Path, key: str, info: dict[str, Any] | None) -> None:
        folder = marker.parent
        self._makedirs(folder)
        data = json.dumps(info or {}, indent=2, sort_keys=True).encode()
        tmp = self._write_temp(folder, data)
        try:
            root = self.root.resolve()
            below = [p for p in folder.rglob("*") if not p.is_symlink() and not p.name.startswith(".tmp-")]
            chain = [folder, *(p for p in folder.parents if p == root or root in p.parents)]
            _fsync_all([*below, *chain, Path(tmp)])
            try:
                os.link(tmp, marker)
            except FileExistsError as e:
                raise AlreadyCommitted(f"{self.url(key)} already exists") from e
            except OSError:  # a filesystem without hard links
                self._create_exclusive(tmp, marker, key)
        finally:
            os.unlink(tmp)
        _fsync_dir(folder)

    def delete_prefix(self, prefix: str) -> None:
        """Remove the marker first (made durable), then the rest: a half-deleted folder is
        never complete."""
        if not check_key(prefix, folder=True, what="prefix"):
            raise StoreError(f"refusing to delete the whole store {self.root}: name a folder")
        path = self._path(prefix, folder=True)
        if path.is_file():
            path.unlink()
            _fsync_dir(path.parent)
            return
        marker = path / COMMIT_MARKER
        if marker.is_file():
            marker.unlink(missing_ok=True)  # another deleter (a run pruning, `pretrain gc`) may be first
            _fsync_dir(path)
        shutil.rmtree(path, ignore_errors=True)

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
        _conditions(if_absent, if_match)
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

    def get_bytes(self, key: str) -> bytes:
        return self.open_read(key).read()

    def get_bytes_with_etag(self, key: str) -> tuple[bytes, str]:
        resp = self._call(key, self.client.get_object, Bucket=self.bucket, Key=self._key(key))
        return resp["Body"].read(), resp["ETag"]

    def open_read(self, key: str):
        resp = self._call(key, self.client.get_object, Bucket=self.bucket, Key=self._key(key))
        return resp["Body"]

    def get_range(self, key: str, start: int, end: int) -> bytes:
        from botocore.exceptions import ClientError

        _check_range(start, end)
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
        folder = check_key(prefix, folder=True, what="prefix")
        if not folder:
            raise StoreError(f"refusing to delete the whole store {self.uri}: name a folder")
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
