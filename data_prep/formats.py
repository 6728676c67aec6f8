"""File formats by name: what a file holds, and how it is compressed."""

from __future__ import annotations

import codecs
import gzip
import zlib
from typing import BinaryIO

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


def stream_errors(compression: str) -> tuple[type[BaseException], ...]:
    """What reading a broken stream of this compression raises."""
    if compression == "gzip":
        return (OSError, EOFError, zlib.error)
    if compression == "zstd":
        import zstandard  # only for .zst files

        return (zstandard.ZstdError, OSError, EOFError)
    return (OSError,)


SNIFF_BYTES = 8192
"""How much of an unlisted file (decompressed) is read to tell text from binary."""


def looks_like_text(head: bytes) -> bool:
    """Whether the first bytes of a file are UTF-8 text: no NUL byte, and valid UTF-8 (a character
    cut off at the end of ``head`` is fine). Empty is not text: nothing to read."""
    if not head or b"\x00" in head:
        return False
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    return True


def sniff_text(stream: BinaryIO, compression: str) -> bool:
    """Whether ``stream`` (closed here) holds text by its first ``SNIFF_BYTES``, decompressed when
    ``compression`` says so; a stream that cannot be read or decompressed is not text."""
    reader = decompressed(stream, compression)
    try:
        head = b""
        while len(head) < SNIFF_BYTES and (chunk := reader.read(SNIFF_BYTES - len(head))):
            head += chunk
    except stream_errors(compression):
        return False
    finally:
        reader.close()
    return looks_like_text(head)


def decompressed(stream: BinaryIO, compression: str) -> BinaryIO:
    """A streaming reader of the decompressed bytes (closing it closes ``stream``)."""
    if compression == "gzip":
        return _Closing(gzip.GzipFile(fileobj=stream, mode="rb"), stream)
    if compression == "zstd":
        import zstandard  # only for .zst files

        return zstandard.ZstdDecompressor().stream_reader(ZstdFrames(stream), read_across_frames=True, closefd=True)
    return stream


class BrokenZstd(OSError):
    """A zstd stream that is cut short or is not zstd."""


_ZSTD_MAGIC = 0xFD2FB528
_COLLECT = {"magic": 4, "descriptor": 1, "skippable_size": 4, "block_header": 3}


class ZstdFrames:
    """Passes a zstd stream through unchanged while walking its frame and block headers, so
    that a stream cut short raises ``BrokenZstd``: zstandard's reader takes a truncated frame
    for a clean end and would drop the rest of the file silently."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._state, self._need, self._field = "magic", 4, b""
        self._checksum = self._last = False

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        if data:
            self._walk(data)
        elif size != 0 and (self._state != "magic" or self._field):
            raise BrokenZstd("the zstd stream ends inside a frame (truncated file)")
        return data

    def close(self) -> None:
        self._raw.close()

    def _walk(self, data: bytes) -> None:
        pos = 0
        while pos < len(data):
            take = min(self._need - len(self._field) if self._state in _COLLECT else self._need, len(data) - pos)
            if self._state in _COLLECT:
                self._field += data[pos : pos + take]
                done = len(self._field) == self._need
            else:
                self._need -= take
                done = self._need == 0
            pos += take
            if done:
                field, self._field = self._field, b""
                self._advance(field)

    def _goto(self, state: str, need: int) -> None:
        self._state, self._need = state, need
        if need == 0 and state not in _COLLECT:
            self._advance(b"")

    def _advance(self, field: bytes) -> None:
        state, value = self._state, int.from_bytes(field, "little")
        if state == "magic":
            if value == _ZSTD_MAGIC:
                self._goto("descriptor", 1)
            elif value & 0xFFFFFFF0 == 0x184D2A50:
                self._goto("skippable_size", 4)
            else:
                raise BrokenZstd("not a zstd frame")
        elif state == "descriptor":
            single = bool(value & 0x20)
            self._checksum = bool(value & 0x04)
            header = (0 if single else 1) + (0, 1, 2, 4)[value & 3] + ((1 if single else 0), 2, 4, 8)[value >> 6]
            self._goto("header", header)
        elif state == "skippable_size":
            self._goto("skippable", value)
        elif state == "block_header":
            kind, size = (value >> 1) & 3, value >> 3
            if kind == 3:
                raise BrokenZstd("reserved zstd block type")
            self._last = bool(value & 1)
            self._goto("block", 1 if kind == 1 else size)
        elif state == "block" and not self._last:
            self._goto("block_header", 3)
        elif state == "block" and self._checksum:
            self._goto("checksum", 4)
        elif state == "header":
            self._goto("block_header", 3)
        else:  # end of a frame (its last block or checksum) or of a skippable frame
            self._goto("magic", 4)


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
