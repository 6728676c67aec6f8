"""What the data-prep worker processes run on a batch of documents, and the settings they
share: set in the parent (``set_worker_state``) before the pool forks, so that every worker
inherits them instead of receiving them with each batch."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import NamedTuple, TypeVar

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
T = TypeVar("T", Document, bytes)

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


class ScanResult(NamedTuple):
    """A scanned batch, per document: the filter's skip reason (or ``""``), and, for those that pass
    (zeros and empties for the others), the content key, near-dup row (LSH band keys and b-bit
    sketch: ``dedup.near_row``), split, filtered text (UTF-8) and the filters' edits."""

    reasons: list[str]
    keys: np.ndarray
    rows: np.ndarray | None
    splits: list[int]
    texts: list[bytes]
    edits: list[dict[str, int]]


def scan_batch(batch: list[tuple[int, Document]]) -> ScanResult:
    """Judge, hash and sketch each document; the text that passes is returned to be kept: it is
    the text the later stages train on and encode, so no stage runs the filters again."""
    data = _data
    assert data is not None
    n, width = len(batch), data.minhash_bands + sketch_words(data.minhash_bands, data.minhash_rows)
    found = ScanResult([], np.zeros(n, dtype=np.uint64), None, [], [], [])
    if data.near_dedup:
        found = found._replace(rows=np.zeros((n, width), dtype=np.uint64))
    for i, (_, doc) in enumerate(batch):
        text, reason, edits = filtered_text(doc.text, data)
        found.reasons.append(reason)
        found.splits.append(DROP)
        found.texts.append(b"")
        found.edits.append(edits)
        if reason:
            continue
        raw = text.encode("utf-8")
        digest = hashlib.sha256(raw).digest()
        found.keys[i] = digest_key(digest)
        found.splits[i] = VAL if split_of(digest.hex(), data.val_fraction) == "val" else TRAIN
        found.texts[i] = raw
        if found.rows is not None:
            # LSH keys and the b-bit sketch that verifies their hits, in one row (dedup.near_row).
            found.rows[i] = near_row(text, data.shingle_words, data.minhash_bands, data.minhash_rows)
    return found


def encode_batch(batch: list[tuple[int, bytes]]) -> list[tuple[str, int, int, np.ndarray, int]]:
    """Per kept document (its filtered text, as the scan kept it): sha256, characters, UTF-8 bytes,
    token ids and byte-fallback tokens."""
    lut, encoder = _fallback_lut, worker_encoder()
    assert lut is not None
    texts = [raw.decode("utf-8") for _, raw in batch]
    return [
        (hashlib.sha256(raw).hexdigest(), len(text), len(raw), ids, int(lut[ids].sum()))
        for (_, raw), text, ids in zip(batch, texts, encoder.encode_batch(texts), strict=True)
    ]


def _text_size(item: tuple[int, Document | bytes]) -> int:
    return len(item[1]) if isinstance(item[1], bytes) else len(item[1].text)


def batches(items: Iterable[tuple[int, T]]) -> Iterator[list[tuple[int, T]]]:
    """(document id, document or its text) pairs in batches of about ``BATCH_BYTES`` of text."""
    batch, size = [], 0
    for item in items:
        batch.append(item)
        size += _text_size(item)
        if size >= BATCH_BYTES or len(batch) >= BATCH_DOCS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch
