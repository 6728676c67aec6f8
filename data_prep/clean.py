"""Normalise a document's text and decide whether it is long enough to keep."""

from __future__ import annotations

import hashlib
import re
import unicodedata

# C0/C1 control characters except tab and newline (carriage returns become newlines
# first), and lone surrogates, which JSON can carry ("\ud800") but UTF-8 cannot encode.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def clean_text(text: str, normalization: str = "NFC") -> str:
    text = _CONTROL.sub("", text)
    if normalization != "none" and not unicodedata.is_normalized(normalization, text):
        text = unicodedata.normalize(normalization, text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.strip()


def length_problem(text: str, min_chars: int, max_chars: int) -> str:
    """The skip reason for a cleaned text's length, or ``""`` if it is kept."""
    if not text:
        return "empty"
    if len(text) < min_chars:
        return "too_short"
    if len(text) > max_chars:
        return "too_long"
    return ""


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
