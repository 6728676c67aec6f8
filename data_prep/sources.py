"""Turn the configured sources into a stream of raw documents.

A source is a local file, folder or glob, an ``s3://`` prefix, or ``python-stdlib``.
Plain text, JSONL (one document per record) and their ``.gz`` forms are read; a file that
cannot be read as text is skipped and counted by reason, never a crash.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import sysconfig
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from data_prep.config import STDLIB_SOURCE
from storage import open_store

TEXT_SUFFIXES = {".txt", ".py", ".md", ".rst", ".text", ".jsonl", ".json"}
_STDLIB_EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "dist-packages"}


class DataError(ValueError):
    """Bad input the user must fix: the message names the source and the remedy."""


@dataclass(frozen=True)
class RawFile:
    """One file to read: a display name and a way to get its bytes."""

    name: str
    read: Callable[[], bytes]


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


def _is_text_file(path: Path) -> bool:
    suffixes = path.suffixes
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return bool(suffixes) and suffixes[-1] in TEXT_SUFFIXES


def _local_files(source: str) -> list[Path]:
    if any(ch in source for ch in "*?["):
        matches = sorted(Path(p) for p in glob.glob(os.path.expanduser(source), recursive=True))
        if not matches:
            raise DataError(f"corpus source {source!r} matches no files")
        return [p for p in matches if p.is_file()]
    path = Path(os.path.expanduser(source))
    if not path.exists():
        raise DataError(f"corpus source {source!r} does not exist: give an existing file, folder, glob or s3:// URI")
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file() and _is_text_file(p))
    return files


def list_files(sources: list[str]) -> list[RawFile]:
    """Every file the sources name, in a deterministic order."""
    if not sources:
        raise DataError("no corpus sources configured: set data.sources")
    files: list[RawFile] = []
    for source in sources:
        if source == STDLIB_SOURCE:
            files += [RawFile(str(p), p.read_bytes) for p in _stdlib_files()]
        elif source.startswith("s3://"):
            store = open_store(source)
            keys = [k for k in store.list("") if _is_text_file(Path(k))]
            if not keys:
                raise DataError(f"corpus source {source!r} holds no text files")
            files += [RawFile(store.url(k), lambda k=k, s=store: s.get_bytes(k)) for k in keys]
        else:
            files += [RawFile(str(p), p.read_bytes) for p in _local_files(source)]
    return files


def _decode(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def iter_documents(sources: list[str], text_field: str, skipped: Counter) -> Iterator[Document]:
    """Documents from every source; unreadable input increments ``skipped[reason]``."""
    for raw in list_files(sources):
        try:
            data = raw.read()
        except OSError:
            skipped["unreadable"] += 1
            continue
        if raw.name.endswith(".gz"):
            try:
                data = gzip.decompress(data)
            except (OSError, EOFError):
                skipped["bad_gzip"] += 1
                continue
        if b"\x00" in data[:8192]:
            skipped["binary"] += 1
            continue
        plain_name = raw.name.removesuffix(".gz")
        if plain_name.endswith(".jsonl"):
            yield from _jsonl_documents(raw.name, data, text_field, skipped)
            continue
        text = _decode(data)
        if text is None:
            skipped["not_utf8"] += 1
            continue
        yield Document(raw.name, text)


def _jsonl_documents(name: str, data: bytes, text_field: str, skipped: Counter) -> Iterator[Document]:
    for lineno, line in enumerate(io.BytesIO(data), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            skipped["bad_jsonl_record"] += 1
            continue
        text = record.get(text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            skipped["jsonl_missing_text_field"] += 1
            continue
        yield Document(f"{name}:{lineno}", text)
