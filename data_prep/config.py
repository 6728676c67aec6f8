"""Configuration of the data stage. Field docstrings become the Flyte launch form's help."""

from __future__ import annotations

from dataclasses import dataclass, field

from common.docfields import documented

STDLIB_SOURCE = "python-stdlib"


@documented
@dataclass
class DataConfig:
    """Where the raw text comes from and how it becomes packed training sequences."""

    sources: list[str] = field(default_factory=lambda: [STDLIB_SOURCE])
    """Corpus: local files, folders or globs, ``s3://bucket/prefix`` URIs, or ``python-stdlib``
    (the running interpreter's standard-library source, tests excluded)."""

    text_field: str = "text"
    """Field (JSONL) or column (Parquet) holding the document text."""

    normalization: str = "NFC"
    """Unicode normal form applied to every document: ``NFC``, ``NFKC``, ``NFD``, ``NFKD`` or ``none``."""

    min_chars: int = 64
    """Documents shorter than this after cleaning are dropped (counted as ``too_short``)."""

    max_chars: int = 2_000_000
    """Documents longer than this are dropped (counted as ``too_long``). It also bounds memory:
    a file or record is streamed and abandoned as soon as it cannot fit."""

    near_dedup: bool = True
    """Drop near-duplicates (MinHash LSH over word shingles) besides exact duplicates."""

    shingle_words: int = 5
    """Words per shingle for near-duplicate detection."""

    minhash_bands: int = 16
    """LSH bands; with ``minhash_rows`` they set the similarity threshold, about
    ``(1 / bands) ** (1 / rows)`` (16 × 8: documents ~70% alike in word shingles collide)."""

    minhash_rows: int = 8
    """MinHash values per LSH band (signature length = bands × rows)."""

    max_documents: int = 0
    """Stop after this many usable documents (0 = no limit); handy for quick runs."""

    val_fraction: float = 0.05
    """Share of documents held out for validation, assigned by a hash of the content."""

    seq_len: int = 128
    """Tokens per training sequence (each stored sequence holds ``seq_len + 1`` tokens)."""

    sequences_per_sample: int = 32
    """Packed sequences per WebDataset sample: per-sample overhead dominates small samples."""

    samples_per_shard: int = 64
    """WebDataset samples per shard file: a shard holds ``samples_per_shard × sequences_per_sample``
    sequences, ``(seq_len + 1) × 2`` bytes each with a vocabulary up to 65,536."""

    workers: int = 0
    """Processes that clean, hash and tokenize (0 = one per CPU core); the output does not depend on it."""


@documented
@dataclass
class TokenizerConfig:
    """The byte-level BPE tokenizer trained on the corpus."""

    vocab_size: int = 8192
    """Vocabulary size, special tokens included."""

    min_frequency: int = 2
    """Minimum pair frequency for a merge."""

    file: str = ""
    """An existing tokenizer.json to use instead of training one (local path or ``s3://`` URI);
    it needs the ``<|endoftext|>`` token. A registered base model's tokenizer takes precedence."""

    train_bytes: int = 32_000_000
    """Training sample: the first this many bytes of kept training documents (bounds the
    trainer's time and memory whatever the corpus size)."""
