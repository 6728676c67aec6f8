"""Configuration of the data stage. Field docstrings become the Flyte launch form's help."""

from __future__ import annotations

import glob
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from common.contracts import EOD_TOKEN
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


class PiiMode(StrEnum):
    """What ``data.pii`` does with one kind of personal data or secret it finds."""

    REDACT = "redact"
    DROP = "drop"
    OFF = "off"


@documented
@dataclass
class PiiConfig:
    """Personal data and secrets in the text: each kind is redacted (replaced by a fixed
    placeholder, counted as ``pii_<kind>``), or its document dropped (``skipped_pii_<kind>``), or left."""

    email: PiiMode = PiiMode.REDACT
    """E-mail addresses → ``<EMAIL>``: ``redact``, ``drop`` or ``off``."""

    ip: PiiMode = PiiMode.OFF
    """Globally routable IPv4/IPv6 addresses → ``<IP_ADDRESS>`` (private, loopback and documentation
    ranges are left; a dotted version such as 1.2.3.4 is indistinguishable, hence ``off`` by default)."""

    secret: PiiMode = PiiMode.REDACT
    """Cloud keys (AWS access key ids and secret keys), private key blocks, GitHub/Slack/OpenAI-style
    tokens → ``<SECRET>``."""

    def __post_init__(self) -> None:
        for name in ("email", "ip", "secret"):
            setattr(self, name, as_choice(PiiMode, getattr(self, name)))

    def problems(self) -> list[str]:
        out: list[str] = []
        for name in ("email", "ip", "secret"):
            out += choice_problem(f"data.pii.{name}", getattr(self, name), PiiMode)
        return out


@documented
@dataclass
class GopherConfig:
    """Gopher document rules (Rae et al. 2021; datatrove's GopherQualityFilter). Prose-only:
    off by default (code has few stop words and many ``#``)."""

    enabled: bool = False
    """Apply these rules."""
    min_words: int = 50
    """Fewest words (whitespace-separated, not pure punctuation); rule ``gopher_words``."""
    max_words: int = 100_000
    """Most words; rule ``gopher_words``."""
    min_mean_word_length: float = 3.0
    """Shortest mean word length in characters; rule ``gopher_word_length``."""
    max_mean_word_length: float = 10.0
    """Longest mean word length; rule ``gopher_word_length``."""
    max_symbol_word_ratio: float = 0.1
    """Most ``#`` plus ellipses (``...``, ``…``) per word; rule ``gopher_symbols``."""
    max_bullet_lines: float = 0.9
    """Largest share of lines starting with a bullet (``•``, ``-``, ``*``); rule ``gopher_bullets``."""
    max_ellipsis_lines: float = 0.3
    """Largest share of lines ending with an ellipsis; rule ``gopher_ellipsis``."""
    min_alpha_words: float = 0.8
    """Smallest share of words holding an alphabetic character; rule ``gopher_alpha``."""
    min_stop_words: int = 2
    """Fewest English stop words (the, be, to, of, and, that, have, with); rule ``gopher_stop_words`` (0 = off)."""


@documented
@dataclass
class RepetitionConfig:
    """Gopher repetition rules (datatrove's GopherRepetitionFilter): repeated lines, paragraphs
    and n-grams. Fractions are of documents' lines/paragraphs or characters; 0 switches a rule off."""

    enabled: bool = True
    """Apply these rules. On by default, with only the two character-share rules set, looser than
    Gopher's: source code repeats short lines (``return None``, ``else:``), and the python-stdlib
    files reach 0.45 of lines and 0.37 of characters repeated, 0.15 in paragraphs (docs/data.md)."""
    max_dup_lines: float = 0.0
    """Largest share of lines that repeat an earlier line (Gopher: 0.3); rule ``rep_dup_lines``."""
    max_dup_paragraphs: float = 0.0
    """Largest share of paragraphs (blank-line separated) repeating an earlier one (Gopher: 0.3); rule ``rep_dup_paragraphs``."""
    max_dup_line_chars: float = 0.5
    """Largest share of characters in repeated lines (Gopher: 0.2); rule ``rep_dup_line_chars``."""
    max_dup_paragraph_chars: float = 0.3
    """Largest share of characters in repeated paragraphs (Gopher: 0.2); rule ``rep_dup_paragraph_chars``."""
    max_top_ngram_chars: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    """For n = 2, 3, 4: largest share of characters covered by the most frequent n-gram
    (Gopher: 0.2, 0.18, 0.16); rules ``rep_top_<n>gram``."""
    max_dup_ngram_chars: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    """For n = 5 … 10: largest share of characters in repeated n-grams (Gopher: 0.15, 0.14, 0.13,
    0.12, 0.11, 0.10); rules ``rep_dup_<n>gram``."""


@documented
@dataclass
class C4Config:
    """C4 line rules (Raffel et al. 2020; datatrove's C4QualityFilter). They remove lines (the
    text changes, as in C4) and drop a document only for lorem ipsum, a curly brace, or too few
    sentences left. Prose-only: off by default (code lines rarely end in punctuation)."""

    enabled: bool = False
    """Apply these rules."""
    min_sentences: int = 5
    """Fewest sentences left after the line rules; rule ``c4_sentences``."""
    min_words_per_line: int = 3
    """Lines with fewer words are removed."""
    max_word_length: int = 1000
    """Lines with a longer word are removed."""
    terminal_punctuation: bool = True
    """Remove lines that do not end in ``.``, ``?``, ``!`` or a quote (or end in an ellipsis)."""
    javascript: bool = True
    """Remove lines mentioning javascript."""
    policy: bool = True
    """Remove lines about terms of use, privacy or cookie policies."""
    lorem_ipsum: bool = True
    """Drop documents holding "lorem ipsum"; rule ``c4_lorem_ipsum``."""
    curly_bracket: bool = True
    """Drop documents with ``{`` in a kept line; rule ``c4_curly_bracket``."""


@documented
@dataclass
class FineWebConfig:
    """FineWeb rules (datatrove's FineWebQualityFilter). Prose-only: off by default (code has
    many short lines without final punctuation)."""

    enabled: bool = False
    """Apply these rules."""
    min_line_punct_ratio: float = 0.12
    """Smallest share of lines ending in punctuation; rule ``fineweb_line_punct``."""
    max_short_line_ratio: float = 0.67
    """Largest share of lines of at most ``short_line_chars`` characters; rule ``fineweb_short_lines``."""
    short_line_chars: int = 30
    """What counts as a short line."""
    max_dup_line_chars: float = 0.01
    """Largest share of characters in repeated lines; rule ``fineweb_dup_line_chars``."""
    max_newline_word_ratio: float = 0.3
    """Most newlines per word; rule ``fineweb_newlines``."""


@documented
@dataclass
class QualityConfig:
    """Quality filters, by family; each drop is counted as ``skipped_quality_<rule>`` (docs/data.md)."""

    gopher: GopherConfig = field(default_factory=GopherConfig)
    """Gopher document rules (off by default)."""
    repetition: RepetitionConfig = field(default_factory=RepetitionConfig)
    """Gopher repetition rules (on, two of them, with thresholds that code passes)."""
    c4: C4Config = field(default_factory=C4Config)
    """C4 line rules (off by default)."""
    fineweb: FineWebConfig = field(default_factory=FineWebConfig)
    """FineWeb rules (off by default)."""

    def problems(self) -> list[str]:
        out: list[str] = []
        fractions = {
            "gopher": ("max_bullet_lines", "max_ellipsis_lines", "min_alpha_words"),
            "repetition": ("max_dup_lines", "max_dup_paragraphs", "max_dup_line_chars", "max_dup_paragraph_chars"),
            "fineweb": ("min_line_punct_ratio", "max_short_line_ratio", "max_dup_line_chars"),
        }
        for family, names in fractions.items():
            for name in names:
                value = getattr(getattr(self, family), name)
                if not 0 <= value <= 1:
                    out.append(f"data.quality.{family}.{name} is {value}: must be a fraction in [0, 1] (0 switches it off)")
        rep = self.repetition
        for name, count, first in (("max_top_ngram_chars", 3, 2), ("max_dup_ngram_chars", 6, 5)):
            value = getattr(rep, name)
            if len(value) != count or not all(isinstance(v, (int, float)) and 0 <= v <= 1 for v in value):
                out.append(
                    f"data.quality.repetition.{name} is {value}: give {count} fractions in [0, 1], "
                    f"for n = {first} … {first + count - 1} (0 switches one off)"
                )
        g = self.gopher
        if g.min_words > g.max_words:
            out.append(f"data.quality.gopher.min_words is {g.min_words}: must be ≤ data.quality.gopher.max_words ({g.max_words})")
        if g.min_mean_word_length > g.max_mean_word_length:
            out.append(
                f"data.quality.gopher.min_mean_word_length is {g.min_mean_word_length}: must be ≤ "
                f"data.quality.gopher.max_mean_word_length ({g.max_mean_word_length})"
            )
        out += at_least("data.quality.gopher.min_stop_words", g.min_stop_words, 0, " (0 = off)")
        out += at_least("data.quality.c4.min_sentences", self.c4.min_sentences, 0)
        out += at_least("data.quality.c4.min_words_per_line", self.c4.min_words_per_line, 0)
        out += at_least("data.quality.c4.max_word_length", self.c4.max_word_length, 1)
        out += at_least("data.quality.fineweb.short_line_chars", self.fineweb.short_line_chars, 0)
        out += at_least("data.quality.fineweb.max_newline_word_ratio", self.fineweb.max_newline_word_ratio, 0)
        return out


# The DataConfig keys a mixture component may set for itself (reading and filtering); packing stays global.
COMPONENT_OVERRIDES = (
    "text_field",
    "normalization",
    "min_chars",
    "max_chars",
    "quality",
    "languages",
    "language_confidence",
    "pii",
    "near_dedup",
    "shingle_words",
    "minhash_bands",
    "minhash_rows",
    "near_dup_threshold",
    "sniff_unlisted",
    "follow_symlinks",
    "max_documents",
)
COMPONENT_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@documented
@dataclass
class MixtureComponent:
    """One part of a data mixture: its sources, its share of the training tokens, and the data keys
    it reads and filters with when they differ from the ``data`` section's (unset: the section's)."""

    name: str = ""
    """The component's name (letters, digits, ``_``, ``.``, ``-``): it suffixes its metrics."""
    sources: list[str] = field(default_factory=list)
    """Its corpus, as ``data.sources`` (files, folders, globs, ``s3://`` URIs, ``python-stdlib``)."""
    weight: float = 1.0
    """Its share of the training tokens, relative to the other components' (weights are normalised to sum 1)."""
    max_epochs: float = 4.0
    """Most passes over its data the run should make; ``pretrain check`` warns when the weight asks for more."""
    text_field: str | None = None
    """``data.text_field`` for this component (unset: the section's)."""
    normalization: Normalization | None = None
    """``data.normalization`` for this component (unset: the section's)."""
    min_chars: int | None = None
    """``data.min_chars`` for this component (unset: the section's)."""
    max_chars: int | None = None
    """``data.max_chars`` for this component (unset: the section's)."""
    quality: QualityConfig | None = None
    """``data.quality`` for this component, whole: families it does not write take their defaults, not the
    section's (unset: the section's)."""
    languages: list[str] | None = None
    """``data.languages`` for this component (unset: the section's)."""
    language_confidence: float | None = None
    """``data.language_confidence`` for this component (unset: the section's)."""
    pii: PiiConfig | None = None
    """``data.pii`` for this component, whole (unset: the section's)."""
    near_dedup: bool | None = None
    """``data.near_dedup`` for this component (unset: the section's)."""
    shingle_words: int | None = None
    """``data.shingle_words`` for this component (unset: the section's)."""
    minhash_bands: int | None = None
    """``data.minhash_bands`` for this component (unset: the section's)."""
    minhash_rows: int | None = None
    """``data.minhash_rows`` for this component (unset: the section's)."""
    near_dup_threshold: float | None = None
    """``data.near_dup_threshold`` for this component (unset: the section's)."""
    sniff_unlisted: bool | None = None
    """``data.sniff_unlisted`` for this component (unset: the section's)."""
    follow_symlinks: bool | None = None
    """``data.follow_symlinks`` for this component (unset: the section's)."""
    max_documents: int | None = None
    """``data.max_documents`` for this component (unset: the section's)."""

    def __post_init__(self) -> None:
        if self.normalization is not None:
            self.normalization = as_choice(Normalization, self.normalization)

    def overrides(self) -> dict[str, Any]:
        """The data keys this component sets for itself."""
        return {k: getattr(self, k) for k in COMPONENT_OVERRIDES if getattr(self, k) is not None}


def positive_number(value: Any) -> bool:
    """A finite number above 0 (a bool is no number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value)


@documented
@dataclass
class DataConfig:
    """Where the raw text comes from and how it becomes packed training sequences."""

    sources: list[str] = field(default_factory=lambda: [STDLIB_SOURCE])
    """Corpus: local files, folders or globs, ``s3://bucket/prefix`` URIs, or ``python-stdlib``
    (the running interpreter's standard-library source, tests excluded). A ``mixture`` replaces it
    (leave it [] or at its default, python-stdlib)."""

    mixture: list[MixtureComponent] = field(default_factory=list)
    """A data mixture instead of ``sources``: components, each with its sources, its weight (share of
    the training tokens), ``max_epochs`` and the reading/filtering keys it sets for itself, e.g.
    ``[{name: code, sources: [python-stdlib], weight: 3}, {name: docs, sources: [docs/], weight: 1}]``.
    Packing (``seq_len``, ``sequences_per_sample``, ``samples_per_shard``, ``val_fraction``) stays global;
    [] = one corpus, ``sources``."""
    dedup_across: bool = True
    """With a mixture: leave out of the blend each later component's exact and near duplicates of an earlier
    component's documents (``cross_component_duplicate``; the near ones with this section's ``near_dedup``
    settings), found by a stage of its own after the components' prepares."""

    text_field: str = "text"
    """Field (JSONL) or column (Parquet) holding the document text."""

    normalization: Normalization = Normalization.NFC
    """Unicode normal form applied to every document: ``NFC``, ``NFKC``, ``NFD``, ``NFKD`` or ``none``."""

    min_chars: int = 64
    """Documents shorter than this after cleaning are dropped (counted as ``too_short``)."""

    max_chars: int = 2_000_000
    """Documents longer than this are dropped (counted as ``too_long``). It also bounds memory:
    a file or record is streamed and abandoned as soon as it cannot fit."""

    quality: QualityConfig = field(default_factory=QualityConfig)
    """Quality filters (Gopher, repetition, C4, FineWeb rules), each switchable; see docs/data.md."""

    languages: list[str] = field(default_factory=list)
    """Languages to keep, as ISO 639-1 codes (``[en, de]``); ``[]`` keeps every language. Drops
    are counted as ``skipped_language``. Code is kept whatever it is identified as (docs/data.md)."""

    language_confidence: float = 0.5
    """A document whose language is identified with less confidence than this is kept as undetermined."""

    pii: PiiConfig = field(default_factory=PiiConfig)
    """E-mail addresses, IP addresses and secrets: redacted, document dropped, or left, per kind."""

    near_dedup: bool = True
    """Drop near-duplicates (MinHash LSH over word shingles) besides exact duplicates."""

    shingle_words: int = 5
    """Words per shingle for near-duplicate detection."""

    minhash_bands: int = 16
    """LSH bands; with ``minhash_rows`` they set the similarity threshold, about
    ``(1 / bands) ** (1 / rows)`` (16 × 8: documents ~70% alike in word shingles collide)."""

    minhash_rows: int = 8
    """MinHash values per LSH band (signature length = bands × rows)."""

    near_dup_threshold: float = 0.7
    """A document sharing an LSH band with an earlier kept one is dropped only if their Jaccard
    similarity, estimated from 8-bit MinHash sketches (±0.04 at 0.7), is at least this; 0 drops
    every LSH candidate unverified."""

    sniff_unlisted: bool = True
    """Files in a folder or S3 prefix whose suffix says no supported format are sniffed: read
    (their first 8 KB, decompressed for .gz/.zst) as text when that is UTF-8 without NUL bytes;
    false ignores them, counted by suffix. Files named in ``data.sources`` are always read."""

    follow_symlinks: bool = False
    """Symlinks inside a folder source are followed only when they lead to a place inside that
    source (counted as ``skipped_symlink_outside`` otherwise); true follows them anywhere (loops still detected)."""

    max_documents: int = 0
    """Read the corpus only up to the document that makes this many pass the filters (0 = no
    limit); duplicates among them are then dropped, so a few fewer may be kept. For quick runs."""

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

    partitions: int = 0
    """Pieces the corpus listing is cut into, each scanned and encoded by its own task (a pod each
    on a cluster); 0 = one per 256 MB listed. The dataset does not depend on it."""

    def __post_init__(self) -> None:
        self.normalization = as_choice(Normalization, self.normalization)

    def problems(self) -> list[str]:
        """Every setting of this section that cannot work, one line each (see common.settings)."""
        out = self._setting_problems()
        return out + (self.mixture_problems(out) if self.mixture else self._source_problems())

    def _source_problems(self) -> list[str]:
        out = []
        if not self.sources:
            out.append("data.sources is []: name at least one file, folder, glob, s3:// URI or python-stdlib")
        out += [f"data.sources[{i}] is {s!r}: give a path, glob or s3:// URI" for i, s in enumerate(self.sources) if not s]
        return out

    def _setting_problems(self) -> list[str]:
        out = choice_problem("data.normalization", self.normalization, Normalization)
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
        out += at_least("data.partitions", self.partitions, 0, " (0 = one per 256 MB of corpus)")
        out += at_least("data.max_documents", self.max_documents, 0, " (0 = no limit)")
        if not 0 <= self.near_dup_threshold <= 1:
            out.append(
                f"data.near_dup_threshold is {self.near_dup_threshold}: must be in [0, 1] "
                "(estimated Jaccard similarity; typical 0.7, 0 = drop every LSH candidate unverified)"
            )
        out += self.quality.problems() + self.pii.problems()
        out += [
            f"data.languages[{i}] is {code!r}: give an ISO 639-1 code such as en, de, fr (or [] to keep all)"
            for i, code in enumerate(self.languages)
            if not (isinstance(code, str) and len(code) in (2, 3) and code.isalpha() and code.islower())
        ]
        if not 0 <= self.language_confidence <= 1:
            out.append(f"data.language_confidence is {self.language_confidence}: must be in [0, 1] (typical 0.5)")
        return out

    def path_problems(self) -> list[str]:
        """Local sources that name nothing on this machine (s3:// sources are the prepare step's); with a
        mixture, each component's."""
        named = [(f"data.mixture[{c.name}].sources", c.sources) for c in self.mixture] or [("data.sources", self.sources)]
        out = []
        for key, sources in named:
            for i, source in enumerate(sources):
                problem = local_source_problem(source) if isinstance(source, str) and source else ""
                if problem:
                    out.append(f"{key}[{i}] is {source!r}: {problem}")
        return out

    def component_data(self, component: MixtureComponent) -> DataConfig:
        """This section as one component of its mixture reads it: the component's sources and the keys
        it sets, no mixture (so no weights: they shape no dataset)."""
        return replace(self, sources=list(component.sources), mixture=[], **component.overrides())

    def mixture_problems(self, inherited: Iterable[str] = ()) -> list[str]:
        """The mixture's problems, one line each, by component (``data.mixture[NAME]``); a component's
        keys are checked as the section's are, less the ``inherited`` lines (the section's own)."""
        inherited, out = set(inherited), []
        if self.sources and self.sources != [STDLIB_SOURCE]:
            out.append(
                f"data.sources is {self.sources} and data.mixture is given: give one of them (a mixture names "
                "its sources per component: move these into a component's sources, or remove data.mixture)"
            )
        seen: dict[str, int] = {}
        for i, comp in enumerate(self.mixture):
            named = isinstance(comp.name, str) and comp.name != "" and comp.name not in seen
            key = f"data.mixture[{comp.name if named else i}]"  # as the YAML reader names it, but unique
            if not (isinstance(comp.name, str) and COMPONENT_NAME.fullmatch(comp.name)):
                out.append(
                    f"{key}.name is {comp.name!r}: give each component a name of letters, digits, '_', '.' or '-' "
                    "(it suffixes the component's metrics)"
                )
            elif comp.name in seen:
                out.append(f"{key}.name is {comp.name!r}, as data.mixture[{seen[comp.name]}]'s: give each component its own name")
            else:
                seen[comp.name] = i
            if not positive_number(comp.weight):
                out.append(f"{key}.weight is {_shown(comp.weight)}: give a positive number (weights are normalised to shares)")
            if not positive_number(comp.max_epochs):
                out.append(
                    f"{key}.max_epochs is {_shown(comp.max_epochs)}: give a positive number of passes over the "
                    "component's data (default 4)"
                )
            resolved = self.component_data(comp)
            own = resolved._setting_problems() + resolved._source_problems()
            out += [key + line.removeprefix("data") for line in own if line not in inherited]
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
    it needs the token named by ``eod_token``. A registered base model's tokenizer takes precedence."""

    eod_token: str = ""
    """The token that ends every document ('' = ``<|endoftext|>``, which trained tokenizers have): a given
    tokenizer's own, e.g. ``<|end_of_text|>`` (Llama 3) or ``</s>`` (Mistral). A base model sets its own."""

    train_bytes: int = 32_000_000
    """Training sample: the first this many bytes of kept training documents (bounds the
    trainer's time and memory whatever the corpus size)."""

    def problems(self) -> list[str]:
        """Every setting of this section that cannot work, one line each."""
        out = at_least("tokenizer.vocab_size", self.vocab_size, 258, " (256 bytes + 2 special tokens; typical 8192 … 65536)")
        out += at_least("tokenizer.min_frequency", self.min_frequency, 0)
        out += at_least("tokenizer.train_bytes", self.train_bytes, 1, " (typical 32000000)")
        return out

    def end_of_text(self) -> str:
        """The token that ends every document."""
        return self.eod_token or EOD_TOKEN

    def path_problems(self) -> list[str]:
        """A local tokenizer.file that does not exist on this machine."""
        if not self.file or "://" in self.file or Path(os.path.expanduser(self.file)).is_file():
            return []
        return [f"tokenizer.file is {self.file!r}: no such file; give a tokenizer.json path, an s3:// URI or ''"]


@documented
@dataclass
class ValidationConfig:
    """Thresholds of the data validation gate."""

    min_documents: int = 1
    """Fewest documents a dataset may hold."""
    min_doc_tokens: int = 1
    """Fewest tokens a kept document may have."""
    max_doc_tokens: int = 2_000_000
    """Most tokens a kept document may have."""
    max_duplicate_fraction: float = 0.5
    """Largest share of read documents dropped as duplicates."""
    max_skipped_fraction: float = 0.5
    """Largest share of read documents skipped for any reason."""
    max_quality_fraction: float = 0.3
    """Largest share of read documents any one quality rule may drop (each ``skipped_quality_<rule>``
    is bounded on its own: the failure names the rule)."""
    max_language_fraction: float = 0.5
    """Largest share of read documents dropped by the ``data.languages`` allow-list."""
    max_pii_fraction: float = 0.1
    """Largest share of read documents dropped for personal data or secrets (``data.pii`` kinds set to ``drop``)."""
    max_byte_fallback_ratio: float = 0.05
    """Largest share of tokens that are lone non-ASCII bytes (text the tokenizer could not merge)."""
    min_shard_bytes: int = 1024
    """Smallest shard file size in bytes."""
    max_shard_bytes: int = 4 * 1024**3
    """Largest shard file size in bytes."""

    def problems(self) -> list[str]:
        """Every threshold that cannot work, one line each (see common.settings)."""
        out = at_least("validation.min_documents", self.min_documents, 0)
        out += at_least("validation.min_doc_tokens", self.min_doc_tokens, 0)
        out += at_least("validation.min_shard_bytes", self.min_shard_bytes, 0)
        for low, high in (("min_doc_tokens", "max_doc_tokens"), ("min_shard_bytes", "max_shard_bytes")):
            if getattr(self, low) > getattr(self, high):
                out.append(f"validation.{low} is {getattr(self, low)}: must be ≤ validation.{high} ({getattr(self, high)})")
        for name in (
            "max_duplicate_fraction",
            "max_skipped_fraction",
            "max_byte_fallback_ratio",
            "max_quality_fraction",
            "max_language_fraction",
            "max_pii_fraction",
        ):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                out.append(f"validation.{name} is {value}: must be a fraction in [0, 1]")
        return out
