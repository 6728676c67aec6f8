"""A byte-level BPE encoder that yields the same ids as HF ``tokenizers``, several times faster.

HF's ``encode`` builds a full ``Encoding`` (offsets, masks, token strings) per call and
re-runs its pre-tokenizer regex over every piece; here the corpus' repetition does the
work. Text is cut at newlines that follow a non-space character: the GPT-2 pre-tokenizer
regex can never join text across such a cut, so each segment encodes on its own and
repeated segments (code lines, boilerplate) and repeated pieces (words) come from caches.
A miss runs the same regex, rewritten with explicit Unicode classes for Python's ``re`` (those
of the Basic Multilingual Plane only, 8x faster, unless the text has letters or numbers beyond it),
then HF's own BPE model on that one piece (``BPE.tokenize``: no pre-tokenizer, no
``Encoding``), whose merge is not quadratic in the piece's length as a Python loop was (CJK
runs have no spaces to cut them short). Pieces under ``HF_PIECE_BYTES`` bytes, where the call
costs more than the merge, merge here by the same rule (lowest rank first, leftmost on ties).

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
from itertools import chain, pairwise

import numpy as np
from tokenizers import Tokenizer

# Unicode White_Space (what Oniguruma's \s matches): Python's \s also matches \x1c-\x1f.
_WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_WHITESPACE_SET = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {
    chr(c) for c in range(0x2000, 0x200B)
}
MAX_PIECES = 500_000
# From this length on, HF's BPE call is faster than our merge loop (measured on CJK, Cyrillic and code pieces).
HF_PIECE_BYTES = 4
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
def _categories() -> np.ndarray:
    return np.array([unicodedata.category(chr(c))[0] for c in range(0x110000)])


@functools.cache
def _classes(stop: int = 0x110000) -> tuple[str, str]:
    """Letters (\\p{L}) and numbers (\\p{N}) below ``stop``, as class bodies."""
    major = _categories()[:stop]
    return _ranges(major == "L"), _ranges(major == "N")


def _gpt2_pattern(letters: str, numbers: str) -> re.Pattern:
    ws = _WHITESPACE
    return re.compile(
        rf"'(?:[stmd]|re|ve|ll)| ?[{letters}]+| ?[{numbers}]+| ?[^{ws}{letters}{numbers}]+|[{ws}]+(?![^{ws}])|[{ws}]+"
    )


@functools.cache
def pretokenizer() -> re.Pattern:
    """GPT-2's pattern, as HF's ByteLevel pre-tokenizer runs it (same alternatives, same order)."""
    return _gpt2_pattern(*_classes())


@functools.cache
def bmp_pretokenizer() -> re.Pattern:
    """The same pattern with letters and numbers of the Basic Multilingual Plane only: exact on
    any text without a letter or number beyond U+FFFF, and ~8x faster in Python's ``re``, whose
    class test scans the ranges beyond U+FFFF one by one (hundreds, for letters) on every miss."""
    return _gpt2_pattern(*_classes(0x10000))


def _scan(text: str) -> tuple[bool, bool]:
    """Whether the text holds a code point Python's Unicode database has not assigned, and
    whether it holds a letter or number beyond U+FFFF (``bmp_pretokenizer`` would miss it)."""
    unknown = astral = False
    for c in set(text):
        if c > "\x7f":
            category = unicodedata.category(c)
            unknown |= category == "Cn"
            astral |= c > "\uffff" and category[0] in "LN"
    return unknown, astral


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
        # A pair (a, b) is the int a << shift | b: hashing an int is cheaper than a tuple.
        self._shift = max(vocab.values()).bit_length()
        self._rank_of: dict[int, int] = {}
        self._merged: list[int] = []
        for rank, merge in enumerate(spec["model"]["merges"]):
            a, b = merge if isinstance(merge, list) else merge.split(" ", 1)
            self._rank_of[vocab[a] << self._shift | vocab[b]] = rank
            self._merged.append(vocab[a + b])
        self._no_merge = len(self._merged)
        # A copy of HF's model: its word cache is this encoder's, as fresh as this encoder.
        self._model = Tokenizer.from_str(tokenizer.to_str()).model
        self._byte_chars = {b: table[b] for b in range(256)}
        added = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
        self._added = added
        self._added_split = (
            re.compile("(" + "|".join(re.escape(t) for t in sorted(added, key=len, reverse=True)) + ")") if added else None
        )
        self._pattern = pretokenizer()
        self._bmp_pattern = bmp_pretokenizer()
        # The pattern for the document being encoded (the segment memo's compute takes one argument).
        self._document_pattern = self._bmp_pattern
        self._pieces = _Memo(self._bpe, MAX_PIECES)
        self._segments = _Memo(self._segment_ids, MAX_SEGMENTS)
        self._segment_mode, self._segment_hits, self._documents = True, 1.0, 0

    def _bpe(self, piece: str) -> tuple[int, ...]:
        raw = piece.encode("utf-8")
        if len(raw) >= HF_PIECE_BYTES:
            # ByteLevel's byte → character mapping, done in C (latin-1 is bytes 0-255 as they are).
            return tuple([token.id for token in self._model.tokenize(raw.decode("latin-1").translate(self._byte_chars))])
        return self._merge(raw)

    def _merge(self, raw: bytes) -> tuple[int, ...]:
        """HF's rule, lowest rank first and leftmost on ties; ``ranks[i]`` is the rank of (ids[i], ids[i + 1])."""
        byte_ids, get, shift, none = self._byte_ids, self._rank_of.get, self._shift, self._no_merge
        ids = [byte_ids[b] for b in raw]
        ranks = [get(a << shift | b, none) for a, b in pairwise(ids)]
        while ranks:
            best = min(ranks)
            if best == none:
                break
            i = ranks.index(best)
            new = ids[i] = self._merged[best]
            del ids[i + 1], ranks[i]
            if i:
                ranks[i - 1] = get(ids[i - 1] << shift | new, none)
            if i < len(ranks):
                ranks[i] = get(new << shift | ids[i + 1], none)
        return tuple(ids)

    def _segment_ids(self, segment: str) -> list[int]:
        pattern = self._document_pattern
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
        pattern = self._document_pattern
        return chain.from_iterable(map(self._pieces.__getitem__, pattern.findall(text)))

    def encode(self, text: str) -> np.ndarray:
        if not text:
            return np.zeros(0, dtype=np.int32)
        astral = False
        if not text.isascii():
            unknown, astral = _scan(text)
            if unknown:
                return np.asarray(self._hf.encode(text).ids, dtype=np.int32)
        self._document_pattern = self._pattern if astral else self._bmp_pattern
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
