"""Byte-level BPE with HF ``tokenizers``: training, and encoding on every core."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from common.contracts import SPECIAL_TOKENS
from data_prep.config import TokenizerConfig
from data_prep.encoder import FastokensEncoder, HFEncoder, bytes_to_unicode, make_encoder
from data_prep.parallel import WorkerPool


def train_tokenizer(texts: Iterable[str], config: TokenizerConfig) -> Tokenizer:
    """Train on ``texts``, consumed as a stream (the trainer keeps word counts, not texts)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def byte_fallback_ids(tokenizer: Tokenizer) -> np.ndarray:
    """Ids of the lone non-ASCII byte tokens: text the vocabulary could not merge into
    anything longer (a UTF-8 character split into its bytes). Their share of a corpus
    says how badly the tokenizer fits it."""
    table = bytes_to_unicode()
    high_bytes = {table[b] for b in range(0x80, 0x100)}
    return np.array(sorted(i for token, i in tokenizer.get_vocab().items() if token in high_bytes), dtype=np.int64)


# --- parallel encoding --------------------------------------------------------------
_worker_encoder: FastokensEncoder | HFEncoder | None = None


def set_encoder(tokenizer: Tokenizer) -> None:
    """Build this process' encoder; call it before forking workers, which then inherit it
    (built once, not once per worker)."""
    global _worker_encoder
    _worker_encoder = make_encoder(tokenizer)


def worker_encoder() -> FastokensEncoder | HFEncoder:
    assert _worker_encoder is not None, "set_encoder was not called before the workers were forked"
    return _worker_encoder


def _encode_batch(texts: Sequence[str]) -> list[np.ndarray]:
    return worker_encoder().encode_batch(texts)


def text_batches(texts: Sequence[str], target_bytes: int) -> list[Sequence[str]]:
    """Consecutive runs of texts of about ``target_bytes`` each: even work per task."""
    batches, start, size = [], 0, 0
    for i, text in enumerate(texts):
        size += len(text)
        if size >= target_bytes:
            batches.append(texts[start : i + 1])
            start, size = i + 1, 0
    if start < len(texts):
        batches.append(texts[start:])
    return batches


def encode_parallel(tokenizer: Tokenizer, texts: Sequence[str], workers: int, batch_bytes: int = 256_000) -> list[np.ndarray]:
    """Token ids of each text, in order, using ``workers`` processes (one thread each),
    through the fastest encoder that gives HF's ids (``encoder.make_encoder``)."""
    set_encoder(tokenizer)
    with WorkerPool(workers) as pool:
        return [ids for _, batch in pool.map_ordered(_encode_batch, text_batches(texts, batch_bytes)) for ids in batch]
