"""What the data-prep worker processes run on a batch of documents, and the settings they
share: set in the parent (``set_worker_state``) before the pool forks, so that every worker
inherits them instead of receiving them with each batch."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

import numpy as np
from tokenizers import Tokenizer

from data_prep.config import DataConfig
from data_prep.dedup import digest_key, near_row, sketch_words
from data_prep.filters import filtered_text
from data_prep.sources import Document
from data_prep.tokenizer import byte_fallback_ids, set_encoder, worker_encoder

BATCH_BYTES = 1 << 20
BATCH_DOCS = 4096
DROP, TRAIN, VAL = 0, 1, 2

_data: DataConfig | None = None
_fallback_lut: np.ndarray | None = None


def set_worker_state(data: DataConfig, tokenizer: Tokenizer | None = None) -> None:
    global _data, _fallback_lut
    _data = data
    if tokenizer is not None:
        set_encoder(tokenizer)
        lut = np.zeros(tokenizer.get_vocab_size(), dtype=bool)
        lut[byte_fallback_ids(tokenizer)] = True
        _fallback_lut = lut


def split_of(digest: str, val_fraction: float) -> str:
    """Train or val, decided by the document's content hash (stable across runs)."""
    return "val" if int(digest[:8], 16) / 0xFFFFFFFF < val_fraction else "train"


def scan_batch(batch: list[tuple[int, Document]]) -> tuple[list[str], np.ndarray, np.ndarray | None, list[int], list[int]]:
    """Per document: the filter's skip reason (or ``""``), content key, near-dup row (LSH band keys
    and b-bit sketch: ``dedup.near_row``), split and the UTF-8 bytes of its filtered text."""
    data = _data
    assert data is not None
    n, width = len(batch), data.minhash_bands + sketch_words(data.minhash_bands, data.minhash_rows)
    reasons, splits, sizes = [], [], []
    keys = np.zeros(n, dtype=np.uint64)
    bands = np.zeros((n, width), dtype=np.uint64) if data.near_dedup else None
    for i, (_, doc) in enumerate(batch):
        # The same function as the encode stage: it encodes exactly the text judged and hashed here.
        text, reason, _ = filtered_text(doc.text, data)
        reasons.append(reason)
        splits.append(DROP)
        sizes.append(0)
        if reason:
            continue
        raw = text.encode("utf-8")
        digest = hashlib.sha256(raw).digest()
        keys[i] = digest_key(digest)
        splits[i] = VAL if split_of(digest.hex(), data.val_fraction) == "val" else TRAIN
        sizes[i] = len(raw)
        if bands is not None:
            # LSH keys and the b-bit sketch that verifies their hits, in one row (dedup.near_row).
            bands[i] = near_row(text, data.shingle_words, data.minhash_bands, data.minhash_rows)
    return reasons, keys, bands, splits, sizes


def encode_batch(batch: list[tuple[int, Document]]) -> list[tuple[str, int, int, np.ndarray, int, dict[str, int]]]:
    """Per kept document: sha256, characters, UTF-8 bytes, token ids, byte-fallback tokens, and
    the filters' edits (``pii_<kind>`` redactions…), counted here, where only kept documents pass."""
    data, lut, encoder = _data, _fallback_lut, worker_encoder()
    assert data is not None and lut is not None
    out = []
    for _, doc in batch:
        # The scan's own function: the text encoded is the text it judged and hashed (checked by the digest).
        text, _, edits = filtered_text(doc.text, data)
        raw = text.encode("utf-8")
        ids = encoder.encode_batch([text])[0]
        out.append((hashlib.sha256(raw).hexdigest(), len(text), len(raw), ids, int(lut[ids].sum()), edits))
    return out


def filtered_batch(batch: list[tuple[int, Document]]) -> list[str]:
    """The filtered text of each document: the tokenizer's training sample."""
    data = _data
    assert data is not None
    return [filtered_text(doc.text, data)[0] for _, doc in batch]


def batches(items: Iterable[tuple[int, Document]]) -> Iterator[list[tuple[int, Document]]]:
    """(document id, document) pairs in batches of about ``BATCH_BYTES`` of text."""
    batch, size = [], 0
    for item in items:
        batch.append(item)
        size += len(item[1].text)
        if size >= BATCH_BYTES or len(batch) >= BATCH_DOCS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch
