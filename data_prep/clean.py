"""Normalise text and drop exact duplicates."""

from __future__ import annotations

import hashlib
import re
import unicodedata

# C0/C1 control characters except tab and newline; carriage returns become newlines.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def clean_text(text: str) -> str:
    text = unicodedata.normalize("NFC", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("", text).strip()


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class ExactDeduplicator:
    """Remembers content hashes; ``seen`` is True for a text met before."""

    def __init__(self) -> None:
        self._hashes: set[bytes] = set()

    def seen(self, digest: str) -> bool:
        key = bytes.fromhex(digest)[:16]
        if key in self._hashes:
            return True
        self._hashes.add(key)
        return False
