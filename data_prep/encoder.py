"""A byte-level BPE encoder that yields the same ids as HF ``tokenizers``, several times faster.

HF's ``encode`` builds a full ``Encoding`` (offsets, masks, token strings) per call and
re-runs its pre-tokenizer regex over every piece; here the corpus' repetition does the
work. Text is cut at newlines that follow a non-space character: the GPT-2 pre-tokenizer
regex can never join text across such a cut, so each segment encodes on its own and
repeated segments (code lines, boilerplate) and repeated pieces (words) come from caches.
A miss runs the same regex, rewritten with explicit Unicode classes for Python's ``re``,
and the same merge rule as HF (lowest rank first, leftmost on ties).

Only the configuration our trainer produces is handled (no normalizer, ByteLevel
pre-tokenizer without prefix space, plain BPE); ``make_encoder`` falls back to HF for any
other tokenizer, and ``FastBPE`` hands HF any text holding characters that Python's
Unicode database does not know, where the two regex engines could classify differently.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from itertools import chain

import numpy as np
from tokenizers import Tokenizer

# Unicode White_Space (what Oniguruma's \s matches): Python's \s also matches \x1c-\x1f.
_WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_WHITESPACE_SET = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {
    chr(c) for c in range(0x2000, 0x200B)
}
MAX_PIECES = 500_000
MAX_SEGMENTS = 50_000
SEGMENT_HIT_RATE = 0.3


def _ranges(members: np.ndarray) -> str:
    """A regex character class body for the code points flagged in ``members``."""
    flags = np.concatenate([[False], members, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(flags))
    out = []
    for start, stop in zip(edges[::2], edges[1::2], strict=True):
        a, b = re.escape(chr(start)), re.escape(chr(stop - 1))
        out.append(a if start == stop - 1 else f"{a}-{b}")
    return "".join(out)


@functools.cache
def _classes() -> tuple[str, str]:
    """Letters (\\p{L}) and numbers (\\p{N}), as class bodies."""
    major = np.array([unicodedata.category(chr(c))[0] for c in range(0x110000)])
    return _ranges(major == "L"), _ranges(major == "N")


@functools.cache
def pretokenizer() -> re.Pattern:
    """GPT-2's pattern, as HF's ByteLevel pre-tokenizer runs it (same alternatives, same order)."""
    letters, numbers = _classes()
    ws = _WHITESPACE
    return re.compile(
        rf"'(?:[stmd]|re|ve|ll)| ?[{letters}]+| ?[{numbers}]+| ?[^{ws}{letters}{numbers}]+|[{ws}]+(?![^{ws}])|[{ws}]+"
    )


@functools.cache
def ascii_pretokenizer() -> re.Pattern:
    """The same pattern for ASCII-only text, where its classes are small (and faster)."""
    return re.compile(r"'(?:[stmd]|re|ve|ll)| ?[A-Za-z]+| ?[0-9]+| ?[^\t\n\x0b\x0c\r A-Za-z0-9]+|\s+(?!\S)|\s+", re.ASCII)


def _unknown_to_python(text: str) -> bool:
    """Whether the text holds a code point Python's Unicode database has not assigned."""
    return any(c > "\x7f" and unicodedata.category(c) == "Cn" for c in set(text))


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character table, which ByteLevel pre-tokenization uses."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def unsupported_reason(spec: dict) -> str:
    """Why ``FastBPE`` cannot reproduce this tokenizer exactly, or ``""`` if it can."""
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    checks = {
        "a normalizer": spec.get("normalizer") is None,
        "a post-processor other than ByteLevel": (spec.get("post_processor") or {"type": "ByteLevel"})["type"] == "ByteLevel",
        "a pre-tokenizer other than ByteLevel(add_prefix_space=False)": pre.get("type") == "ByteLevel"
        and not pre.get("add_prefix_space")
        and pre.get("use_regex", True),
        "a model other than plain BPE": model.get("type") == "BPE"
        and model.get("dropout") is None
        and not model.get("continuing_subword_prefix")
        and not model.get("end_of_word_suffix")
        and not model.get("byte_fallback")
        and not model.get("ignore_merges"),
        "added tokens with lstrip/rstrip/single_word": all(
            not (t.get("lstrip") or t.get("rstrip") or t.get("single_word")) for t in spec.get("added_tokens", [])
        ),
    }
    return next((f"the tokenizer has {what}" for what, ok in checks.items() if not ok), "")


class _Memo(dict):
    """A bounded memo: a missing key is computed and kept; cleared when full (only speed
    depends on what it holds, so memory stays bounded on any corpus)."""

    def __init__(self, compute: Callable, limit: int) -> None:
        super().__init__()
        self._compute, self._limit = compute, limit
        self.misses = 0

    def __missing__(self, key):
        self.misses += 1
        if len(self) >= self._limit:
            self.clear()
        value = self[key] = self._compute(key)
        return value


class FastBPE:
    """Encodes like ``Tokenizer.encode(text).ids`` for the supported configuration."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        spec = json.loads(tokenizer.to_str())
        reason = unsupported_reason(spec)
        if reason:
            raise ValueError(f"FastBPE cannot reproduce this tokenizer: {reason}")
        self._hf = tokenizer
        vocab: dict[str, int] = spec["model"]["vocab"]
        table = bytes_to_unicode()
        self._byte_ids = [vocab[table[b]] for b in range(256)]
        self._merges: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, merge in enumerate(spec["model"]["merges"]):
            a, b = merge if isinstance(merge, list) else merge.split(" ", 1)
            self._merges[(vocab[a], vocab[b])] = (rank, vocab[a + b])
        added = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
        self._added = added
        self._added_split = (
            re.compile("(" + "|".join(re.escape(t) for t in sorted(added, key=len, reverse=True)) + ")") if added else None
        )
        self._pattern = pretokenizer()
        self._ascii_pattern = ascii_pretokenizer()
        self._pieces = _Memo(self._bpe, MAX_PIECES)
        self._segments = _Memo(self._segment_ids, MAX_SEGMENTS)
        self._segment_mode, self._segment_hits, self._documents = True, 1.0, 0

    def _bpe(self, piece: str) -> tuple[int, ...]:
        ids = [self._byte_ids[b] for b in piece.encode("utf-8")]
        merges = self._merges
        while len(ids) > 1:
            best_rank, best_at, best_id = -1, -1, -1
            for i in range(len(ids) - 1):
                merge = merges.get((ids[i], ids[i + 1]))
                if merge is not None and (best_at < 0 or merge[0] < best_rank):
                    best_rank, best_at, best_id = merge[0], i, merge[1]
            if best_at < 0:
                break
            ids[best_at : best_at + 2] = [best_id]
        return tuple(ids)

    def _segment_ids(self, segment: str) -> list[int]:
        pattern = self._ascii_pattern if segment.isascii() else self._pattern
        # map/chain over the memo's __getitem__: the per-piece loop stays in C unless a piece is new.
        return list(chain.from_iterable(map(self._pieces.__getitem__, pattern.findall(segment))))

    def _segments_of(self, text: str) -> list[str]:
        lines = text.split("\n")
        out, current, ws = [], lines[0], _WHITESPACE_SET
        for line in lines[1:]:
            # A newline after a non-space character always starts a new pre-token.
            if current and current[-1] not in ws:
                out.append(current)
                current = "\n" + line
            else:
                current = f"{current}\n{line}"
        out.append(current)
        return out

    def _plain_ids(self, text: str) -> Iterable[int]:
        # Segment memo where segments repeat (code, boilerplate); else one regex pass over
        # the whole text, which skips building per-segment lists. Every 32nd document
        # samples the segment hit rate. Either way the ids are the same.
        self._documents += 1
        if self._segment_mode or self._documents % 32 == 0:
            segments = self._segments_of(text)
            misses = self._segments.misses
            ids = list(chain.from_iterable(map(self._segments.__getitem__, segments)))
            self._segment_hits = 0.8 * self._segment_hits + 0.2 * (1 - (self._segments.misses - misses) / len(segments))
            self._segment_mode = self._segment_hits >= SEGMENT_HIT_RATE
            return ids
        pattern = self._ascii_pattern if text.isascii() else self._pattern
        return chain.from_iterable(map(self._pieces.__getitem__, pattern.findall(text)))

    def encode(self, text: str) -> np.ndarray:
        if not text:
            return np.zeros(0, dtype=np.int32)
        if not text.isascii() and _unknown_to_python(text):
            return np.asarray(self._hf.encode(text).ids, dtype=np.int32)
        if self._added_split is not None and any(token in text for token in self._added):
            parts: list[Iterable[int]] = []
            for i, part in enumerate(self._added_split.split(text)):
                if i % 2:
                    parts.append([self._added[part]])
                elif part:
                    parts.append(self._plain_ids(part))
            return np.fromiter(chain.from_iterable(parts), dtype=np.int32)
        return np.fromiter(self._plain_ids(text), dtype=np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]


class HFEncoder:
    """HF ``encode_batch``: the reference, and the fallback for tokenizers FastBPE does not cover."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = Tokenizer.from_str(tokenizer.to_str())
        # Whole documents: a truncating or padding tokenizer would silently change the data.
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int32) for e in self._tokenizer.encode_batch(list(texts))]


def make_encoder(tokenizer: Tokenizer) -> FastBPE | HFEncoder:
    spec = json.loads(tokenizer.to_str())
    return HFEncoder(tokenizer) if unsupported_reason(spec) else FastBPE(tokenizer)
