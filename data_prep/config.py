"""Configuration of the data stage. Field docstrings become the Flyte launch form's help."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from common.docfields import documented
from common.settings import as_choice, at_least, choice_problem

STDLIB_SOURCE = "python-stdlib"


class Normalization(StrEnum):
    """Unicode normal form of ``data.normalization`` (``none`` keeps the text as it is)."""

    NFC = "NFC"
    NFKC = "NFKC"
    NFD = "NFD"
    NFKD = "NFKD"
    NONE = "none"


def local_source_problem(source: str) -> str:
    """Why a local corpus source names nothing ('' when it names something, and for
    ``python-stdlib`` and ``s3://`` sources, which the prepare step lists)."""
    if source == STDLIB_SOURCE or source.startswith("s3://"):
        return ""
    if any(ch in source for ch in "*?["):
        found = next(glob.iglob(os.path.expanduser(source), recursive=True), None)
        return "" if found is not None else "matches no files; check the pattern"
    path = Path(os.path.expanduser(source))
    if path.exists() or path.is_symlink():
        return ""
    return "does not exist; give an existing file, folder, glob or s3:// URI"


@documented
@dataclass
class DataConfig:
    """Where the raw text comes from and how it becomes packed training sequences."""

    sources: list[str] = field(default_factory=lambda: [STDLIB_SOURCE])
    """Corpus: local files, folders or globs, ``s3://bucket/prefix`` URIs, or ``python-stdlib``
    (the running interpreter's standard-library source, tests excluded)."""

    text_field: str = "text"
    """Field (JSONL) or column (Parquet) holding the document text."""

    normalization: Normalization = Normalization.NFC
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

    def __post_init__(self) -> None:
        self.normalization = as_choice(Normalization, self.normalization)

    def problems(self) -> list[str]:
        """Every setting of this section that cannot work, one line each (see common.settings)."""
        out = choice_problem("data.normalization", self.normalization, Normalization)
        if not self.sources:
            out.append("data.sources is []: name at least one file, folder, glob, s3:// URI or python-stdlib")
        out += [f"data.sources[{i}] is {s!r}: give a path, glob or s3:// URI" for i, s in enumerate(self.sources) if not s]
        if not self.text_field:
            out.append("data.text_field is '': name the JSONL field or Parquet column holding the text (e.g. text)")
        for name in ("seq_len", "sequences_per_sample", "samples_per_shard", "shingle_words", "minhash_bands", "minhash_rows"):
            out += at_least(f"data.{name}", getattr(self, name), 1)
        out += at_least("data.max_chars", self.max_chars, 1)
        if self.min_chars > self.max_chars:
            out.append(f"data.min_chars is {self.min_chars}: must be ≤ data.max_chars ({self.max_chars})")
        if not 0 <= self.val_fraction < 1:
            out.append(f"data.val_fraction is {self.val_fraction}: must be in [0, 1) (typical 0.005 … 0.1)")
        out += at_least("data.workers", self.workers, 0, " (0 = one per CPU core)")
        out += at_least("data.max_documents", self.max_documents, 0, " (0 = no limit)")
        return out

    def path_problems(self) -> list[str]:
        """Local sources that name nothing on this machine (s3:// sources are the prepare step's)."""
        out = []
        for i, source in enumerate(self.sources):
            problem = local_source_problem(source) if source else ""
            if problem:
                out.append(f"data.sources[{i}] is {source!r}: {problem}")
        return out


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

    def problems(self) -> list[str]:
        """Every setting of this section that cannot work, one line each."""
        out = at_least("tokenizer.vocab_size", self.vocab_size, 258, " (256 bytes + 2 special tokens; typical 8192 … 65536)")
        out += at_least("tokenizer.min_frequency", self.min_frequency, 0)
        out += at_least("tokenizer.train_bytes", self.train_bytes, 1, " (typical 32000000)")
        return out

    def path_problems(self) -> list[str]:
        """A local tokenizer.file that does not exist on this machine."""
        if not self.file or "://" in self.file or Path(os.path.expanduser(self.file)).is_file():
            return []
        return [f"tokenizer.file is {self.file!r}: no such file; give a tokenizer.json path, an s3:// URI or ''"]
