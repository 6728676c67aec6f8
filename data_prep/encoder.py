"""Token ids of text, exactly as HF ``tokenizers`` gives them, from the fastest exact encoder measured.

``benchmarks/bench_tokenize.py`` times our candidates one core each on code, prose, multilingual,
mixed and pure CJK text, checking every document's ids against HF's: fastokens (Rust, from
Crusoe) was exact on every document and the fastest or tied on every class, 17-45x HF's
``encode_batch_fast``, with memory that stays bounded on text that never repeats (gigatoken,
as fast, grows its cache without bound in its current release; kitoken differs from HF on
contractions after a newline; our own Python encoder ran at a tenth of fastokens' speed and
was deleted). The figures are in ``benchmarks/results/``.

fastokens encodes only the configuration our trainer produces (no normalizer, ByteLevel
pre-tokenizer without prefix space, plain BPE), where the tests and the benchmark prove its
ids equal to HF's; any other tokenizer (a base model's, given as ``tokenizer.file``) is
encoded by HF itself.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np
from tokenizers import Tokenizer

THREADS_VARIABLE = "FASTOKENS_BPE_THREADS"
"""fastokens' own thread count (it ignores ``RAYON_NUM_THREADS``); read when an encoder is built."""


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
    """Why this tokenizer is outside the configuration fastokens is proven exact on, or ``""``."""
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


class FastokensEncoder:
    """fastokens' batch call on one thread (data preparation runs one encoder per worker process)."""

    def __init__(self, tokenizer: Tokenizer, threads: int = 1) -> None:
        import fastokens

        reason = unsupported_reason(json.loads(tokenizer.to_str()))
        if reason:
            raise ValueError(f"fastokens is not proven exact on this tokenizer: {reason}")
        os.environ.setdefault(THREADS_VARIABLE, str(threads))  # a user's setting stands
        self._encoder = fastokens.Tokenizer.from_json_str(tokenizer.to_str())

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        # Special tokens in the text become their ids, as HF's encode_batch reads them.
        flat, offsets = self._encoder.encode_batch_flat(list(texts), add_special_tokens=True)
        ids, ends = np.frombuffer(flat, dtype=np.uint32), np.frombuffer(offsets, dtype=np.uint64).tolist()
        return [ids[a:b] for a, b in zip(ends, ends[1:], strict=False)]


class HFEncoder:
    """HF ``encode_batch``: the reference, and the encoder of tokenizers outside fastokens' proven configuration."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = Tokenizer.from_str(tokenizer.to_str())
        # Whole documents: a truncating or padding tokenizer would silently change the data.
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int32) for e in self._tokenizer.encode_batch(list(texts))]


def make_encoder(tokenizer: Tokenizer) -> FastokensEncoder | HFEncoder:
    """The fastest encoder that gives HF's ids for ``tokenizer``."""
    spec = json.loads(tokenizer.to_str())
    return HFEncoder(tokenizer) if unsupported_reason(spec) else FastokensEncoder(tokenizer)
