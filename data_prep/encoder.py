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
from collections.abc import Sequence
from itertools import chain

import numpy as np
from tokenizers import Tokenizer

# Unicode White_Space (what Oniguruma's \s matches): Python's \s also matches \x1c-\x1f.
_WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_WHITESPACE_SET = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {
    chr(c) for c in range(0x2000, 0x200B)
}
MAX_PIECES = 1_000_000
MAX_SEGMENTS = 200_000


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
def _classes() -> tuple[str, str, str]:
    """Letters (\\p{L}), numbers (\\p{N}) and unassigned code points, as class bodies."""
    categories = [unicodedata.category(chr(c)) for c in range(0x110000)]
    major = np.array([c[0] for c in categories])
    return _ranges(major == "L"), _ranges(major == "N"), _ranges(np.array([c == "Cn" for c in categories]))


@functools.cache
def pretokenizer() -> re.Pattern:
    """GPT-2's pattern, as HF's ByteLevel pre-tokenizer runs it (same alternatives, same order)."""
    letters, numbers, _ = _classes()
    ws = _WHITESPACE
    return re.compile(
        rf"'(?:[stmd]|re|ve|ll)| ?[{letters}]+| ?[{numbers}]+| ?[^{ws}{letters}{numbers}]+|[{ws}]+(?![^{ws}])|[{ws}]+"
    )


@functools.cache
def _unassigned() -> re.Pattern:
    return re.compile(f"[{_classes()[2]}]")


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
        self._unassigned = _unassigned()
        self._pieces: dict[str, tuple[int, ...]] = {}
        self._segments: dict[str, list[int]] = {}

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
        cached = self._segments.get(segment)
        if cached is not None:
            return cached
        pieces, get = self._pieces, self._pieces.get
        if len(pieces) > MAX_PIECES:
            pieces.clear()  # bounded memory; only speed depends on the cache
        ids: list[int] = []
        for piece in self._pattern.findall(segment):
            piece_ids = get(piece)
            if piece_ids is None:
                piece_ids = pieces[piece] = self._bpe(piece)
            ids.extend(piece_ids)
        if len(self._segments) > MAX_SEGMENTS:
            self._segments.clear()
        self._segments[segment] = ids
        return ids

    def _plain_ids(self, text: str) -> list[list[int]]:
        lines = text.split("\n")
        out, current, ws = [], lines[0], _WHITESPACE_SET
        for line in lines[1:]:
            # A newline after a non-space character always starts a new pre-token.
            if current and current[-1] not in ws:
                out.append(self._segment_ids(current))
                current = "\n" + line
            else:
                current = f"{current}\n{line}"
        out.append(self._segment_ids(current))
        return out

    def encode(self, text: str) -> np.ndarray:
        if not text.isascii() and self._unassigned.search(text):
            return np.asarray(self._hf.encode(text).ids, dtype=np.int32)
        if self._added_split is not None and any(token in text for token in self._added):
            parts: list[list[int]] = []
            for i, part in enumerate(self._added_split.split(text)):
                if i % 2:
                    parts.append([self._added[part]])
                elif part:
                    parts.extend(self._plain_ids(part))
        else:
            parts = self._plain_ids(text) if text else []
        return np.fromiter(chain.from_iterable(parts), dtype=np.int32)

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
