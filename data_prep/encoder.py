"""Token ids of text, exactly as HF ``tokenizers`` gives them, from the fastest exact encoder measured.

``benchmarks/bench_tokenize.py`` times our candidates one core each on code, prose, multilingual,
mixed and pure CJK text, checking every document's ids against HF's: fastokens (Rust, from
Crusoe) was exact on every document, 15-52x HF's ``encode_batch_fast``, with memory that stays
bounded on text that never repeats (gigatoken, also exact, ran code, prose and mixed text faster,
fastokens at 0.82-0.90 of its speed, but grows its cache without bound in its current release;
kitoken differs from HF on contractions after a newline; our own Python encoder ran at a tenth of
fastokens' speed and was deleted). The figures are in ``benchmarks/results/``.

fastokens encodes only the configurations where the tests (``tests/test_encoder.py``) prove its
ids equal to HF ``encode_batch``'s (post-processor included); any other tokenizer is encoded by
HF itself (``unsupported_reason`` says why):

* our trainer's, also SmolLM's: no normalizer, GPT-2's ByteLevel pre-tokenizer without prefix
  space, plain BPE;
* Llama 3's and Qwen2/Qwen3's: a Split on their pattern (``PROVEN_SPLIT_PATTERNS``; Isolated, not
  inverted) then ByteLevel(add_prefix_space=False, use_regex=False); no normalizer or NFC (Qwen);
  BPE with or without ``ignore_merges`` (Llama 3 sets it); a post-processor that is ByteLevel,
  or a template adding one special token before and/or after the text (Llama 3's
  ``<|begin_of_text|>``), alone or after ByteLevel.

Measured (2026-12-06, fastokens 0.3.5, tokenizers 0.23.3) on ``hf_interop.tiny``'s tokenizer of each
family at 640 tokens (trained on the demo corpus) and 8,192 (trained on code, prose and
multilingual text): ids identical on every document of the standard library (729 files, 12.1 MB),
of 3 MB each of bench_tokenize's prose, multilingual and CJK classes, of the same text decomposed
(NFD, which NFC recomposes), of the tests' edge cases and long runs, and of documents of a million
spaces, letters, digits or newlines; with ``ignore_merges`` on a vocabulary missing one merge in
seven, where it changes HF's ids on 520 of 588 documents. fastokens cannot load Mistral's
Metaspace pre-tokenizer (nor an NFKC or NFD normalizer): Mistral's tokenizer, with its byte
fallback, goes to HF. fastokens also matched HF with other Split behaviours and with GPT-2's and
o200k's patterns in a Split, which no family we import uses: not admitted. Per family, the choice
against HF ``encode_batch_fast`` (its fastest call) on one core (``benchmarks/bench_imported_tokenizers.py``,
4.7 MB of the standard library): fastokens 39-55x HF on the Llama 3, Qwen2, Qwen3 and SmolLM tokenizers;
Mistral's is HF's own call, 0.91x (the ids' copy into numpy arrays)
(``benchmarks/results/cpu-bench_imported_tokenizers-2026-12-06.json``).
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


# The split patterns fastokens (PCRE2) is proven to cut as HF (Oniguruma) does, by name: Llama 3's (digits in
# runs of up to three) and Qwen2's (digit by digit), as their tokenizer.json files write them.
PROVEN_SPLIT_PATTERNS = {
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


def _proven_pre_tokenizer(pre: dict) -> bool:
    """GPT-2's ByteLevel(add_prefix_space=False) (its own regex), or Llama 3 / Qwen2's Sequence: a Split on a
    proven pattern (Isolated, not inverted), then ByteLevel(add_prefix_space=False, use_regex=False)."""
    if pre.get("type") == "ByteLevel":
        return not pre.get("add_prefix_space") and pre.get("use_regex", True)
    parts = (pre.get("pretokenizers") or []) if pre.get("type") == "Sequence" else []
    if len(parts) != 2:
        return False
    split, byte_level = parts
    return (
        split.get("type") == "Split"
        and split.get("pattern") in [{"Regex": p} for p in PROVEN_SPLIT_PATTERNS.values()]
        and split.get("behavior") == "Isolated"
        and not split.get("invert")
        and byte_level.get("type") == "ByteLevel"
        and not byte_level.get("add_prefix_space")
        and byte_level.get("use_regex") is False
    )


def _proven_template(processor: dict) -> bool:
    """TemplateProcessing that adds one special token (one id) before a text, after it, or both."""
    single, specials = processor.get("single") or [], processor.get("special_tokens") or {}
    shape = [next(iter(item), None) for item in single]
    if processor.get("type") != "TemplateProcessing" or shape not in (
        ["SpecialToken", "Sequence"],
        ["Sequence", "SpecialToken"],
        ["SpecialToken", "Sequence", "SpecialToken"],
    ):
        return False
    tokens = [item["SpecialToken"]["id"] for item in single if "SpecialToken" in item]
    sequence = next(item["Sequence"] for item in single if "Sequence" in item)
    return sequence.get("id") == "A" and all(len((specials.get(t) or {}).get("ids") or []) == 1 for t in tokens)


def _proven_post_processor(processor: dict | None) -> bool:
    """None, ByteLevel (offsets only), a proven template, or Llama 3's Sequence[ByteLevel, template]."""
    if processor is None or processor.get("type") == "ByteLevel":
        return True
    if processor.get("type") == "Sequence":
        parts = processor.get("processors") or []
        return len(parts) == 2 and parts[0].get("type") == "ByteLevel" and _proven_template(parts[1])
    return _proven_template(processor)


def unsupported_reason(spec: dict) -> str:
    """Why this tokenizer is outside the configurations fastokens is proven exact on, or ``""``."""
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    checks = {
        "a normalizer other than NFC": spec.get("normalizer") in (None, {"type": "NFC"}),
        "a post-processor other than ByteLevel or a template adding a special token before and/or after the text": (
            _proven_post_processor(spec.get("post_processor"))
        ),
        "a pre-tokenizer other than ByteLevel(add_prefix_space=False) or a Split on Llama 3's or Qwen2's pattern "
        "then ByteLevel(use_regex=False)": _proven_pre_tokenizer(pre),
        # ignore_merges (Llama 3's: a word in the vocabulary is one token, merges or not) is proven too.
        "a model other than plain BPE": model.get("type") == "BPE"
        and model.get("dropout") is None
        and not model.get("continuing_subword_prefix")
        and not model.get("end_of_word_suffix")
        and not model.get("byte_fallback"),
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
    """HF ``encode_batch_fast`` (``encode_batch``'s ids, without offsets): the reference, and the encoder of
    tokenizers outside fastokens' proven configuration."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = Tokenizer.from_str(tokenizer.to_str())
        # Whole documents: a truncating or padding tokenizer would silently change the data.
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        # encode_batch's ids without its offsets: HF's fastest call.
        return [np.asarray(e.ids, dtype=np.int32) for e in self._tokenizer.encode_batch_fast(list(texts))]


def make_encoder(tokenizer: Tokenizer) -> FastokensEncoder | HFEncoder:
    """The fastest encoder that gives HF's ids for ``tokenizer``."""
    spec = json.loads(tokenizer.to_str())
    return HFEncoder(tokenizer) if unsupported_reason(spec) else FastokensEncoder(tokenizer)
