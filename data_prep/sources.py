"""Which files the configured sources name, in a deterministic order.

A source is a local file, folder or glob, an ``s3://`` prefix, or ``python-stdlib``.
Folders are walked recursively and keep the files whose names say a supported format
(``formats.kind_of``). Other files are sniffed when ``data.sniff_unlisted`` is on (their first
8 KB, decompressed for a ``.gz``/``.zst`` suffix: UTF-8 without NUL bytes is text, read as such)
and counted as ignored otherwise, by suffix.

A listing stays inside its source: a symlink in a walked folder (or a glob match) that leads out
of the source's root is refused (``symlink_outside``) unless ``data.follow_symlinks`` is on, since
a link to a home folder would read credentials into the dataset; links inside it are followed,
loops detected. Names starting with ``.`` in a folder or below an S3 prefix (``.git/``, ``.netrc``)
are left out, counted as ``(hidden)``; a source may still name one. What is named in
``data.sources`` is read as named, symlink or not.

Anything that cannot be listed properly (a symlink loop or one out of its source, a broken link,
a FIFO, an unreadable folder) becomes an entry with a ``problem``: the reader counts it as a skip,
so nothing disappears silently. Reading the files is ``data_prep.readers``' job.
"""

from __future__ import annotations

import errno
import functools
import glob
import hashlib
import os
import stat
import sysconfig
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

from data_prep.config import STDLIB_SOURCE, DataConfig, local_source_problem
from data_prep.errors import DataError
from data_prep.formats import SNIFF_BYTES, compression_of, kind_of, sniff_text
from storage import open_store

_STDLIB_EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "dist-packages"}
HIDDEN = "(hidden)"
"""The label an ``Ignored`` counts hidden files and folders under (names starting with ``.``), beside the suffixes."""


class Ignored(Counter):
    """Files left out for their suffix: a count per suffix, and the first few names of each; hidden
    files and folders are counted under ``HIDDEN`` the same way. With sniffing on (``sniffed_unlisted``),
    those are the unlisted files that are not text, and ``sniffed`` counts the unlisted files read as
    text, by suffix, with a few names too."""

    EXAMPLES = 3

    def __init__(self, counts: dict[str, int] | None = None, sniff: bool = False) -> None:
        super().__init__(counts or {})
        self.examples: dict[str, list[str]] = {}
        self.sniffed_unlisted = sniff
        self.sniffed: Counter = Counter()
        self.sniffed_examples: dict[str, list[str]] = {}

    def marks(self) -> tuple[dict[str, int], dict[str, int]]:
        """How many example names each suffix has now, ignored and sniffed (for ``relative_to``)."""
        return {k: len(v) for k, v in self.examples.items()}, {k: len(v) for k, v in self.sniffed_examples.items()}

    def relative_to(self, root: str, since: tuple[dict[str, int], dict[str, int]]) -> None:
        """Names found since the ``marks`` ``since``, made relative to the source ``root``."""
        for examples, before in zip((self.examples, self.sniffed_examples), since, strict=True):
            for suffix, names in examples.items():
                start = before.get(suffix, 0)
                names[start:] = [_inside(n, root) for n in names[start:]]


def _suffix(name: str) -> str:
    return Path(name).suffix.lower() or "(no suffix)"


def _example(examples: dict[str, list[str]], suffix: str, name: str) -> None:
    names = examples.setdefault(suffix, [])
    if len(names) < Ignored.EXAMPLES:
        names.append(name)


def _count_ignored(ignored: Counter, label: str, name: str) -> None:
    ignored[label] += 1
    if isinstance(ignored, Ignored):
        _example(ignored.examples, label, name)


def _ignore(ignored: Counter, name: str) -> None:
    """Count a file left out for its suffix (and keep its name, for an ``Ignored``)."""
    _count_ignored(ignored, _suffix(name), name)


def _hide(ignored: Counter, name: str) -> None:
    """Count a hidden file or folder left out (a folder once, not walked)."""
    _count_ignored(ignored, HIDDEN, name)


def _hidden_part(key: str) -> str:
    """The key up to its first part starting with ``.`` (``a/.git`` of ``a/.git/HEAD``), or ``""``."""
    parts = key.split("/")
    for i, part in enumerate(parts):
        if part.startswith("."):
            return "/".join(parts[: i + 1])
    return ""


def _sniffed(ignored: Counter, name: str) -> None:
    """Count an unlisted file that sniffing let in (for an ``Ignored``)."""
    if isinstance(ignored, Ignored):
        suffix = _suffix(name)
        ignored.sniffed[suffix] += 1
        _example(ignored.sniffed_examples, suffix, name)


def sniffable(name: str) -> bool:
    """Whether an unlisted name could be read as text if it holds text: compressed Parquet
    (which has a listed suffix but no reader) is not."""
    return not kind_of(name) and kind_of(name, explicit=True) == "text"


# A compressed object's first 64 KB decompress to more than SNIFF_BYTES unless the whole object is smaller.
_S3_SNIFF_RANGE = {"": SNIFF_BYTES, "gzip": 1 << 16, "zstd": 1 << 16}


@dataclass(frozen=True)
class RawFile:
    """One file to read: a display name, its size, and a way to stream its bytes."""

    name: str
    size: int
    open: Callable[[], BinaryIO]
    local_path: str = ""
    """Set for local files: Parquet needs random access."""
    problem: str = ""
    """A skip reason found while listing (``symlink_loop``, ``unreadable``...): not readable."""
    relative: str = ""
    """The name inside its source (``sub/a.txt`` of the folder ``/data/corpus``): what a dataset
    records, so that the same corpus in another place makes the same dataset."""

    def read(self) -> bytes:
        """All bytes at once: for small files only (fingerprints stream through ``open``)."""
        with self.open() as f:
            return f.read()


@dataclass(frozen=True)
class Document:
    source: str
    text: str


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files() -> list[Path]:
    root = stdlib_root()
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_EXCLUDED_DIRS and not d.startswith("test"))
        files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py") and not f.startswith("test_"))
    return files


def _local(path: Path, listed: os.stat_result) -> RawFile:
    opener = functools.partial(open_listed, path, (listed.st_dev, listed.st_ino))
    return RawFile(str(path), listed.st_size, opener, local_path=str(path))


class ChangedSinceListing(OSError):
    """A local file that is not, when opened, the file its source's listing saw."""


def open_listed(path: Path, identity: tuple[int, int]) -> BinaryIO:
    """``path`` opened, refused unless the descriptor is the file the listing saw (device, inode): the listing's
    link checks are by path, so a file replaced by a link to ``~/.aws/credentials`` between the listing and the
    read would otherwise put the credentials into the corpus."""
    f = open(path, "rb")  # noqa: SIM115 - handed to the caller, who closes it
    opened = os.fstat(f.fileno())
    if (opened.st_dev, opened.st_ino) != identity or not stat.S_ISREG(opened.st_mode):
        f.close()
        raise ChangedSinceListing(f"{path} is not the file the listing saw (replaced since, by a link or another file)")
    return f


def _problem(path: Path | str, reason: str) -> RawFile:
    def refuse() -> BinaryIO:
        raise OSError(f"{path} was not listed as readable ({reason})")

    return RawFile(str(path), 0, refuse, problem=reason)


def _stat_problem(err: OSError, path: Path) -> str:
    if err.errno == errno.ELOOP:
        return "symlink_loop"
    if err.errno == errno.ENOENT and path.is_symlink():
        return "broken_link"
    return "unreadable"


def _sniff_local(path: Path) -> bool:
    try:
        return sniff_text(open(path, "rb"), compression_of(path.name))
    except OSError:
        return False  # unreadable now: ignored like any other file that is not text


@dataclass
class _Lister:
    """One local source being listed: where its files go, whether unlisted files are sniffed, and
    the real path of its root, which symlinks may not lead out of (``""`` when they may)."""

    out: list[RawFile]
    ignored: Counter
    sniff: bool
    root: str = ""

    def leads_out(self, path: Path) -> bool:
        """Whether ``path`` resolves to a place outside the source's root (through a symlink)."""
        # is_relative_to compares whole parts: /data/corpus2 is not inside /data/corpus.
        return bool(self.root) and not Path(os.path.realpath(path)).is_relative_to(self.root)


def _walk(folder: Path, ancestors: frozenset[tuple[int, int]], lister: _Lister) -> None:
    """Files under ``folder`` in name order, hidden names left out; symlinks are followed unless they
    lead out of the source or back to one of their own ancestors (a loop)."""
    out, ignored, sniff = lister.out, lister.ignored, lister.sniff
    try:
        names = sorted(os.listdir(folder))
    except OSError as e:
        out.append(_problem(folder, _stat_problem(e, folder)))
        return
    for name in names:
        path = folder / name
        if name.startswith("."):
            _hide(ignored, str(path))  # .git/, .ssh/, .netrc: not corpus, and often secret
            continue
        if path.is_symlink() and lister.leads_out(path):
            out.append(_problem(path, "symlink_outside"))
            continue
        try:
            st = path.stat()  # follows symlinks: a loop raises ELOOP here
        except OSError as e:
            out.append(_problem(path, _stat_problem(e, path)))
            continue
        if stat.S_ISDIR(st.st_mode):
            key = (st.st_dev, st.st_ino)
            if key in ancestors:
                out.append(_problem(path, "symlink_loop"))
            else:
                _walk(path, ancestors | {key}, lister)
        elif not stat.S_ISREG(st.st_mode):
            out.append(_problem(path, "not_a_regular_file"))
        elif kind_of(name):
            out.append(_local(path, st))
        elif sniff and sniffable(name) and _sniff_local(path):
            out.append(_local(path, st))
            _sniffed(ignored, str(path))
        else:
            _ignore(ignored, str(path))


def _local_path_files(path: Path, lister: _Lister) -> None:
    out = lister.out
    try:
        st = path.stat()
    except OSError as e:
        out.append(_problem(path, _stat_problem(e, path)))
        return
    if stat.S_ISDIR(st.st_mode):
        # A folder is walked whatever its name: "notes.txt/" is a folder of documents.
        _walk(path, frozenset({(st.st_dev, st.st_ino)}), lister)
    elif stat.S_ISREG(st.st_mode):
        out.append(_local(path, st))  # named explicitly: read even with an unusual suffix
    else:
        out.append(_problem(path, "not_a_regular_file"))


def _local_files(source: str, out: list[RawFile], ignored: Counter, sniff: bool, follow_symlinks: bool) -> None:
    problem = local_source_problem(source)  # the rule `pretrain check` applies to data.sources
    if problem:
        raise DataError(f"corpus source {source!r} {problem}")
    # The root may itself be a symlink: it was named, so its real path is where the source lives.
    root = "" if follow_symlinks else os.path.realpath(_root_of(source) or os.curdir)
    lister = _Lister(out, ignored, sniff, root)
    if any(ch in source for ch in "*?["):
        for match in sorted(glob.glob(os.path.expanduser(source), recursive=True)):
            if lister.leads_out(Path(match)):  # a match through a symlink out of the glob's fixed folder
                out.append(_problem(match, "symlink_outside"))
            else:
                _local_path_files(Path(match), lister)
        return
    _local_path_files(Path(os.path.expanduser(source)), lister)


def _sniff_s3(store, full_key: str) -> bool:
    """A ranged GET of the object's first bytes, sniffed."""
    compression = compression_of(full_key)
    try:
        body = store.client.get_object(Bucket=store.bucket, Key=full_key, Range=f"bytes=0-{_S3_SNIFF_RANGE[compression] - 1}")
    except Exception:  # botocore's ClientError and connection errors: not readable now, so not admitted
        return False
    return sniff_text(body["Body"], compression)


def _s3_files(source: str, out: list[RawFile], ignored: Counter, sniff: bool) -> None:
    store = open_store(source)
    found = 0
    paginator = store.client.get_paginator("list_objects_v2")
    prefix = f"{store.prefix}/" if store.prefix else ""
    hidden_seen: set[str] = set()
    for page in paginator.paginate(Bucket=store.bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            key = obj["Key"][len(prefix) :]
            found += 1
            if hidden := _hidden_part(key):
                if hidden not in hidden_seen:  # a hidden "folder" counts once, as it does locally
                    hidden_seen.add(hidden)
                    _hide(ignored, store.url(hidden))
            elif kind_of(key) or (sniff and sniffable(key) and _sniff_s3(store, obj["Key"])):
                out.append(RawFile(store.url(key), int(obj["Size"]), lambda k=key, s=store: s.open_read(k)))
                if not kind_of(key):
                    _sniffed(ignored, store.url(key))
            else:
                _ignore(ignored, store.url(key))
    if not found:
        raise DataError(f"corpus source {source!r} holds no objects: check the bucket and prefix")


def list_corpus(data: DataConfig) -> list[RawFile]:
    """Every file the data section's sources name, listed with its own settings (``list_files``): what the pipeline's
    first task reads and what ``pretrain check`` refuses an empty corpus by."""
    return list_files(data.sources, sniff=data.sniff_unlisted, follow_symlinks=data.follow_symlinks)


def list_files(
    sources: list[str], ignored: Counter | None = None, sniff: bool = False, follow_symlinks: bool = False
) -> list[RawFile]:
    """Every file the sources name, in a deterministic order. Files in a folder or prefix whose
    suffix names no supported format are sniffed with ``sniff`` (``data.sniff_unlisted``) and kept
    when they hold text; the rest are counted in ``ignored`` by suffix, and hidden names under
    ``HIDDEN`` (an ``Ignored`` also keeps a few names, inside their source, and counts the sniffed
    ones). Symlinks out of a local source are problem entries unless ``follow_symlinks``
    (``data.follow_symlinks``)."""
    if not sources:
        raise DataError("no corpus sources configured: set data.sources")
    ignored = Counter() if ignored is None else ignored
    files: list[RawFile] = []
    for source in sources:
        start = len(files)
        since = ignored.marks() if isinstance(ignored, Ignored) else ({}, {})
        if source == STDLIB_SOURCE:
            files += [_local(p, p.stat()) for p in _stdlib_files()]
        elif source.startswith("s3://"):
            _s3_files(source, files, ignored, sniff)
        else:
            _local_files(source, files, ignored, sniff, follow_symlinks)
        root = _root_of(source)
        files[start:] = [replace(f, relative=_inside(f.name, root)) for f in files[start:]]
        if isinstance(ignored, Ignored):
            ignored.relative_to(root, since)
    if not any(not f.problem for f in files):
        raise DataError(_nothing_to_read(sources, files, ignored, sniff))
    return files


def _nothing_to_read(sources: list[str], files: list[RawFile], ignored: Counter, sniff: bool) -> str:
    """Why a listing holds no file to read, and what to do: said at listing, before anything is written. Sniffing
    other suffixes (``data.sniff_unlisted``) is advised only when it is off: on, those files were sniffed already."""
    found = [f"{n} ignored as {label}" for label, n in sorted(ignored.items(), key=lambda kv: (-kv[1], kv[0]))]
    found += [f"{n} {reason}" for reason, n in Counter(f.problem for f in files).most_common()]
    what = ", ".join(found) if found else "no files at all"
    readable = "put text (.txt .md .py …), JSONL or Parquet files there"
    if not sniff:
        remedy = f"{readable}, set data.sniff_unlisted: true to read text with other suffixes, or name the files in data.sources"
    elif any(label != HIDDEN for label in ignored):
        remedy = (
            f"{readable}, or name the files in data.sources; files with other suffixes are read when their first "
            "8 KB are UTF-8 text (data.sniff_unlisted), and these are not (binary, or another encoding: convert to UTF-8)"
        )
    else:
        remedy = f"{readable}, or name the files in data.sources"
    return f"the corpus sources {sources} hold no file to read ({what}): {remedy}"


def _root_of(source: str) -> str:
    """The part of a source's file names that says where the corpus lives, not what it holds:
    a folder, a file's folder, a glob's fixed folder, an S3 prefix, the standard library's folder."""
    if source == STDLIB_SOURCE:
        return str(stdlib_root())
    if source.startswith("s3://"):
        return source
    path = Path(os.path.expanduser(source))
    if any(ch in source for ch in "*?["):
        fixed = []
        for part in path.parts:
            if any(ch in part for ch in "*?["):
                break
            fixed.append(part)
        return str(Path(*fixed)) if fixed else ""
    return str(path if path.is_dir() else path.parent)


def _inside(name: str, root: str) -> str:
    prefix = root.rstrip("/") + "/"
    return name[len(prefix) :] if root and name.startswith(prefix) else name


def relative_names(files: list[RawFile]) -> Callable[[str], str]:
    """Maps a listed file's name, or a document's (``name:line``, ``name:row``), to the same
    name inside its source (``RawFile.relative``): the names a dataset records."""
    inside = {f.name: f.relative for f in files}

    def relative(name: str) -> str:
        if name in inside:
            return inside[name]
        base, sep, where = name.rpartition(":")
        return inside[base] + sep + where if base in inside else name

    return relative


def listing_hash(files: list[RawFile]) -> str:
    """Hash of the listing: names inside their sources, sizes and listing problems (not
    contents, not where the corpus lives)."""
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.relative}\t{f.size}\t{f.problem}\n".encode())
    return digest.hexdigest()


def content_fingerprint(sources: list[str], sniff: bool, follow_symlinks: bool = False) -> str:
    """Hash of the content of every listed file (``sniff`` and ``follow_symlinks`` as ``list_files``),
    streamed (a corpus bigger than memory is fine); problem entries count by name and reason.
    Independent of where the corpus lives."""
    digest = hashlib.sha256()
    for raw in list_files(sources, sniff=sniff, follow_symlinks=follow_symlinks):
        if raw.problem:
            digest.update(f"problem\t{raw.problem}\n".encode())
            continue
        file_digest, size = hashlib.sha256(), 0
        try:
            with raw.open() as f:
                while chunk := f.read(1 << 20):
                    file_digest.update(chunk)
                    size += len(chunk)
        except OSError:
            digest.update(b"unreadable\n")
            continue
        digest.update(size.to_bytes(8, "little"))
        digest.update(file_digest.digest())
    return digest.hexdigest()
