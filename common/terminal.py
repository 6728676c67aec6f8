"""What reaches a terminal: text from the store (run ids, metric names, keys, messages) may hold any
character, and a terminal obeys the control ones it is sent (an OSC 52 sequence writes the clipboard,
CSI sequences move the cursor and recolour, bidi overrides reorder what is read)."""

from __future__ import annotations

import contextlib
import io
import sys
import unicodedata
from collections.abc import Iterator
from typing import TextIO

LAYOUT = "\n\t"
"""Kept as they are: our own lines and tables are made of them."""


def escaped(text: str) -> str:
    """``text`` with every control character but newline and tab, and every format character (bidi overrides,
    zero-width ones: category Cf, not printable), written as its Python escape (``\\x1b``, ``\\u202e``): the one
    function every store string goes through to a terminal."""
    return "".join(_escape(c) for c in text)


def _escape(c: str) -> str:
    if c in LAYOUT or c.isprintable() or unicodedata.category(c) == "Zs":
        return c  # a space of another width (Zs) prints as a space
    return repr(c)[1:-1]  # not printable, so repr escapes it: \x1b, \x85, \u202e, \u2028


class EscapingStream(io.TextIOBase):
    """A text stream that writes through ``escaped`` to the one it wraps."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(escaped(text))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")


@contextlib.contextmanager
def escaped_output() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` written through ``escaped`` while inside."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapingStream(sys.stdout), EscapingStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
