"""Quality filters: Gopher document and repetition rules, C4 line rules, FineWeb rules.

The rule definitions and Gopher/C4/FineWeb thresholds follow datatrove's GopherQualityFilter,
GopherRepetitionFilter, C4QualityFilter and FineWebQualityFilter, with two differences
(docs/data.md): words are whitespace-separated (no language-specific word tokenizer; stop words
are matched with their surrounding punctuation stripped), and C4 sentences are counted as runs of
``.``, ``!`` or ``?`` ending a word. Each rule that drops a document names itself; the prepare
step counts it as ``skipped_quality_<rule>``.

Every function here runs per document on every core: the regexes are compiled once, words and
lines are split once per document and shared by the families.
"""

from __future__ import annotations

import re

import numpy as np

from data_prep.config import C4Config, FineWebConfig, GopherConfig, QualityConfig, RepetitionConfig

STOP_WORDS = frozenset(["the", "be", "to", "of", "and", "that", "have", "with"])
_PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~…•–—“”‘’«»")
_STRIP = "".join(sorted(_PUNCTUATION))
_CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]")
_SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)")
# A whitespace-separated word without a letter: only digits, underscores, punctuation, symbols
# (one regex pass over the text instead of a Python loop over every character of every word).
_NO_LETTER_WORD = re.compile(r"(?<!\S)(?:[\d_]|[^\w\s])+(?!\S)")
_BULLETS = ("•", "-", "*")
_ELLIPSES = ("...", "…")
_END_PUNCTUATION = (".", "?", "!", '"', "'")
_POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")


def quality_problem(text: str, config: QualityConfig) -> tuple[str, str]:
    """The rule that drops ``text`` (``""`` if none) and the text to keep: C4's line rules
    remove lines, so the kept text may be shorter than the one given (it is ``text`` itself,
    the same object, when no line was removed)."""
    words: list[str] | None = None
    rep, gopher, c4, fineweb = config.repetition, config.gopher, config.c4, config.fineweb
    if rep.enabled:
        # Words only for the n-gram rules (off by default): splitting costs as much as the rest.
        words = text.split() if any(rep.max_top_ngram_chars) or any(rep.max_dup_ngram_chars) else None
        if rule := repetition_problem(text, words or [], rep):
            return rule, text
    if gopher.enabled:
        words = words if words is not None else text.split()
        if rule := gopher_problem(text, words, gopher):
            return rule, text
    if c4.enabled:
        rule, edited = c4_lines(text, c4)
        if rule:
            return rule, text
        if edited != text:  # the caller tells an edit by identity: only a changed text is a new object
            text, words = edited, None
    if fineweb.enabled:
        words = words if words is not None else text.split()
        if rule := fineweb_problem(text, words, fineweb):
            return rule, text
    return "", text


# --- Gopher document rules -----------------------------------------------------------
def gopher_problem(text: str, words: list[str], config: GopherConfig) -> str:
    """The Gopher document rule ``text`` breaks, or ``""``."""
    if not words:
        return "gopher_words"
    non_symbol = [w for w in words if not _PUNCTUATION.issuperset(w)]
    if not config.min_words <= len(non_symbol) <= config.max_words:
        return "gopher_words"
    mean = sum(map(len, non_symbol)) / len(non_symbol) if non_symbol else 0.0
    if not config.min_mean_word_length <= mean <= config.max_mean_word_length:
        return "gopher_word_length"
    symbols = text.count("#") + text.count("...") + text.count("…")
    if symbols / len(words) > config.max_symbol_word_ratio:
        return "gopher_symbols"
    lines = text.splitlines() or [""]
    if sum(line.lstrip().startswith(_BULLETS) for line in lines) / len(lines) > config.max_bullet_lines:
        return "gopher_bullets"
    if sum(line.rstrip().endswith(_ELLIPSES) for line in lines) / len(lines) > config.max_ellipsis_lines:
        return "gopher_ellipsis"
    if 1 - len(_NO_LETTER_WORD.findall(text)) / len(words) < config.min_alpha_words:
        return "gopher_alpha"
    if config.min_stop_words and _stop_words(words, config.min_stop_words) < config.min_stop_words:
        return "gopher_stop_words"
    return ""


def _stop_words(words: list[str], enough: int) -> int:
    """Distinct stop words (Gopher, and datatrove: "the cat the dog" has one), counted up to ``enough``."""
    found: set[str] = set()
    for w in words:
        w = w.strip(_STRIP).lower()
        if w in STOP_WORDS:
            found.add(w)
            if len(found) >= enough:  # most prose reaches it within a few words
                break
    return len(found)


# --- Gopher repetition rules ---------------------------------------------------------
def repetition_problem(text: str, words: list[str], config: RepetitionConfig) -> str:
    """The repetition rule ``text`` breaks, or ``""``. A threshold of 0 switches its rule off."""
    size = len(text)
    if config.max_dup_paragraphs or config.max_dup_paragraph_chars:
        paragraphs = _paragraphs(text)
        count, chars = _duplicates(paragraphs)
        if config.max_dup_paragraphs and count / len(paragraphs) > config.max_dup_paragraphs:
            return "rep_dup_paragraphs"
        if config.max_dup_paragraph_chars and chars / size > config.max_dup_paragraph_chars:
            return "rep_dup_paragraph_chars"
    if config.max_dup_lines or config.max_dup_line_chars:
        # Blank lines add nothing to the characters: the filtering is only needed to count lines.
        lines = _lines(text) if config.max_dup_lines else text.split("\n")
        count, chars = _duplicates(lines)
        if config.max_dup_lines and count / len(lines) > config.max_dup_lines:
            return "rep_dup_lines"
        if config.max_dup_line_chars and chars / size > config.max_dup_line_chars:
            return "rep_dup_line_chars"
    tops, dups = config.max_top_ngram_chars, config.max_dup_ngram_chars
    if not (any(tops) or any(dups)) or len(words) < 2:
        return ""
    ids, ends = _word_ids(words)
    keys = ids.copy()
    for n in range(2, 11):
        # The n-gram starting at each word, as one 64-bit polynomial hash of its word ids
        # (deterministic: ids are first-seen order, not Python's salted str hash).
        keys = keys[:-1] * _MIX + ids[n - 1 :]
        if not len(keys):
            break
        limit = tops[n - 2] if n <= 4 else dups[n - 5]
        if limit and (_top_ngram_chars if n <= 4 else _dup_ngram_chars)(keys, n, ends) / size > limit:
            return f"rep_top_{n}gram" if n <= 4 else f"rep_dup_{n}gram"
    return ""


def _paragraphs(text: str) -> list[str]:
    """``text`` split at runs of 2+ newlines (``re.split(r"\\n{2,}")``, 3× faster in plain str methods)."""
    return [p for p in (piece.strip("\n") for piece in text.split("\n\n")) if p] or [""]


def _lines(text: str) -> list[str]:
    """``text`` split at runs of newlines, as ``re.split(r"\\n+")`` on a stripped text."""
    return [line for line in text.split("\n") if line] or [""]


_MIX = np.uint64(0x9E3779B97F4A7C15)


def _word_ids(words: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each word's id (order of first appearance) and the running character count
    (``ends[j] - ends[i]``: the characters of ``words[i:j]`` without separators)."""
    table: dict[str, int] = {}
    ids = np.fromiter((table.setdefault(w, len(table)) for w in words), dtype=np.uint64, count=len(words))
    ends = np.zeros(len(words) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, words), dtype=np.int64, count=len(words)), out=ends[1:])
    return ids, ends


def _duplicates(items: list[str]) -> tuple[int, int]:
    """How many items repeat an earlier one, and their characters (set arithmetic in C rather
    than a loop: the same numbers as datatrove's find_duplicates)."""
    unique = set(items)
    return len(items) - len(unique), sum(map(len, items)) - sum(map(len, unique))


def _top_ngram_chars(keys: np.ndarray, n: int, ends: np.ndarray) -> int:
    """Characters of the most frequent n-gram (joined by spaces) times its count; among equally
    frequent ones, the first to appear (as ``Counter.most_common``)."""
    _, first, counts = np.unique(keys, return_index=True, return_counts=True)
    best = counts.max()
    at = int(first[counts == best].min())
    return (int(ends[at + n] - ends[at]) + n - 1) * int(best)


def _dup_ngram_chars(keys: np.ndarray, n: int, ends: np.ndarray) -> int:
    """Characters (without separators) of the n-grams that repeat an earlier one, a repeat
    skipping its n words so that overlaps count once (datatrove's find_all_duplicate; there, an
    n-gram that starts inside a skipped repeat is not remembered, here it is)."""
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    repeats = np.flatnonzero(first[inverse] != np.arange(len(keys)))
    chars, free = 0, 0
    for at in repeats.tolist():
        if at >= free:
            chars += int(ends[at + n] - ends[at])
            free = at + n
    return chars


# --- C4 line rules -------------------------------------------------------------------
def c4_lines(text: str, config: C4Config) -> tuple[str, str]:
    """The C4 rule that drops ``text`` (``""`` if none) and the text of the lines kept.

    As C4 (and datatrove), the line rules remove lines: lines with a word longer than
    ``max_word_length``, without terminal punctuation, with too few words, mentioning
    javascript or a policy. Lorem ipsum or a curly brace in a kept line drops the document,
    as do fewer than ``min_sentences`` sentences in the lines kept."""
    kept: list[str] = []
    sentences = 0
    for raw in text.splitlines():
        line = raw.strip()
        words = line.split()
        if any(len(w) > config.max_word_length for w in words):
            continue
        line = _CITATION.sub("", line)
        if config.terminal_punctuation and (not line.endswith(_END_PUNCTUATION) or line.endswith("...")):
            continue
        if len(words) < config.min_words_per_line:
            continue
        lower = line.lower()
        if config.lorem_ipsum and "lorem ipsum" in lower:
            return "c4_lorem_ipsum", text
        if config.javascript and "javascript" in lower:
            continue
        if config.curly_bracket and "{" in line:
            return "c4_curly_bracket", text
        if config.policy and any(p in lower for p in _POLICY):
            continue
        sentences += max(1, len(_SENTENCE_END.findall(line)))
        kept.append(line)
    if sentences < config.min_sentences:
        return "c4_sentences", text
    return "", "\n".join(kept).strip()


# --- FineWeb rules -------------------------------------------------------------------
def fineweb_problem(text: str, words: list[str], config: FineWebConfig) -> str:
    """The FineWeb rule ``text`` breaks, or ``""``."""
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines or not words:
        return "fineweb_line_punct"
    if sum(line.endswith(_END_PUNCTUATION) for line in lines) / len(lines) < config.min_line_punct_ratio:
        return "fineweb_line_punct"
    if sum(len(line) <= config.short_line_chars for line in lines) / len(lines) >= config.max_short_line_ratio:
        return "fineweb_short_lines"
    if _duplicates(lines)[1] / max(len(text) - text.count("\n"), 1) >= config.max_dup_line_chars:
        return "fineweb_dup_line_chars"
    if text.count("\n") / len(words) > config.max_newline_word_ratio:
        return "fineweb_newlines"
    return ""


__all__ = ["STOP_WORDS", "c4_lines", "fineweb_problem", "gopher_problem", "quality_problem", "repetition_problem"]
