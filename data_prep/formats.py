"""File formats by name: what a file holds, and how it is compressed."""

from __future__ import annotations

import gzip
from typing import BinaryIO

import zstandard

TEXT_SUFFIXES = (".txt", ".text", ".py", ".md", ".rst", ".json")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}


def compression_of(name: str) -> str:
    """``gzip``, ``zstd`` or ``""``."""
    lower = name.lower()
    return next((c for suffix, c in COMPRESSIONS.items() if lower.endswith(suffix)), "")


def _without_compression(name: str) -> str:
    lower = name.lower()
    for suffix in COMPRESSIONS:
        if lower.endswith(suffix):
            return lower[: -len(suffix)]
    return lower


def kind_of(name: str, explicit: bool = False) -> str:
    """``text``, ``jsonl`` or ``parquet`` for a supported name, else ``""`` (a file named
    explicitly as a source is read as text whatever its suffix)."""
    plain = _without_compression(name)
    if plain.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if plain.endswith(PARQUET_SUFFIXES):
        # Parquet compresses its pages itself; a compressed Parquet file is not a format we read.
        return "" if compression_of(name) else "parquet"
    if plain.endswith(TEXT_SUFFIXES) or explicit:
        return "text"
    return ""


def decompressed(stream: BinaryIO, compression: str) -> BinaryIO:
    """A streaming reader of the decompressed bytes (closing it closes ``stream``)."""
    if compression == "gzip":
        return _Closing(gzip.GzipFile(fileobj=stream, mode="rb"), stream)
    if compression == "zstd":
        return zstandard.ZstdDecompressor().stream_reader(stream, read_across_frames=True, closefd=True)
    return stream


class _Closing:
    """A reader that also closes the raw stream under it (GzipFile leaves its fileobj open)."""

    def __init__(self, reader: BinaryIO, raw: BinaryIO) -> None:
        self._reader, self._raw = reader, raw

    def read(self, size: int = -1) -> bytes:
        return self._reader.read(size)

    def close(self) -> None:
        try:
            self._reader.close()
        finally:
            self._raw.close()

    def __enter__(self) -> _Closing:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
