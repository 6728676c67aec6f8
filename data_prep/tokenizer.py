"""Byte-level BPE with HF ``tokenizers``: training, and encoding on every core."""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Iterable, Sequence

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from data_prep.config import TokenizerConfig

EOD_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = [EOD_TOKEN, PAD_TOKEN]


def train_tokenizer(texts: Iterable[str], config: TokenizerConfig) -> Tokenizer:
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


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character table, which ByteLevel pre-tokenization uses."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def byte_fallback_ids(tokenizer: Tokenizer) -> np.ndarray:
    """Ids of the lone non-ASCII byte tokens: text the vocabulary could not merge into
    anything longer (a UTF-8 character split into its bytes). Their share of a corpus
    says how badly the tokenizer fits it."""
    table = _bytes_to_unicode()
    high_bytes = {table[b] for b in range(0x80, 0x100)}
    return np.array(sorted(i for token, i in tokenizer.get_vocab().items() if token in high_bytes), dtype=np.int64)


# --- parallel encoding --------------------------------------------------------------
_worker_tokenizer: Tokenizer | None = None


def _init_worker(tokenizer_json: str) -> None:
    global _worker_tokenizer
    _worker_tokenizer = Tokenizer.from_str(tokenizer_json)


def _encode_batch(texts: Sequence[str]) -> list[np.ndarray]:
    assert _worker_tokenizer is not None
    return [np.asarray(e.ids, dtype=np.int32) for e in _worker_tokenizer.encode_batch(list(texts))]


def _batches(texts: Sequence[str], target_bytes: int) -> list[Sequence[str]]:
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
    """Token ids of each text, in order, using ``workers`` processes (one thread each)."""
    workers = workers or os.cpu_count() or 1
    batches = _batches(texts, batch_bytes)
    if workers == 1 or len(batches) <= 1:
        _init_worker(tokenizer.to_str())
        return [ids for batch in batches for ids in _encode_batch(batch)]
    # Fork, not spawn: a spawned worker re-imports the parent's __main__ (pyflyte, a test
    # runner), which costs seconds per worker. Each worker is single-threaded: the
    # processes are the parallelism, and saying so up front also keeps tokenizers from
    # warning about a fork after its thread pool was used.
    saved = {k: os.environ.get(k) for k in ("TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS")}
    os.environ.update(TOKENIZERS_PARALLELISM="false", RAYON_NUM_THREADS="1")
    try:
        ctx = mp.get_context("fork")
        with ctx.Pool(workers, initializer=_init_worker, initargs=(tokenizer.to_str(),)) as pool:
            return [ids for batch in pool.imap(_encode_batch, batches) for ids in batch]
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
