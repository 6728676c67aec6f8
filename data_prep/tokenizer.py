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


# --- parallel encoding --------------------------------------------------------------
_worker_tokenizer: Tokenizer | None = None


def _init_worker(tokenizer_json: str) -> None:
    global _worker_tokenizer
    _worker_tokenizer = Tokenizer.from_str(tokenizer_json)


def _encode_batch(texts: Sequence[str]) -> list[np.ndarray]:
    assert _worker_tokenizer is not None
    return [np.asarray(e.ids, dtype=np.int32) for e in _worker_tokenizer.encode_batch(list(texts))]


def encode_parallel(tokenizer: Tokenizer, texts: Sequence[str], workers: int, batch_size: int = 64) -> list[np.ndarray]:
    """Token ids of each text, in order, using ``workers`` processes (one thread each)."""
    workers = workers or os.cpu_count() or 1
    batches = [texts[i : i + batch_size] for i in range(0, len(texts), batch_size)]
    if workers == 1 or len(batches) <= 1:
        _init_worker(tokenizer.to_str())
        return [ids for batch in batches for ids in _encode_batch(batch)]
    # One rayon thread per process: the processes are the parallelism.
    os.environ["RAYON_NUM_THREADS"] = "1"
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(tokenizer.to_str(),)) as pool:
        return [ids for batch in pool.imap(_encode_batch, batches, chunksize=4) for ids in batch]
