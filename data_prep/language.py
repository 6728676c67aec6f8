"""Language identification for the ``data.languages`` allow-list (py3langid's model, shipped
inside the PyPI package: nothing is downloaded).

Code is not a natural language. Python source is mostly identified as English (its names,
comments and docstrings are): of the 728 python-stdlib documents, 724 come out ``en`` (39 of them
below 0.5 confidence), 2 ``zxx`` and 2 others below 0.5, so ``languages: [en]`` drops none of
them. An allow-list without English would drop such code, so two exemptions keep code and
data whatever the list says:

- a document that **looks like code**: at least ``CODE_SYMBOLS`` (8%) of the non-space
  characters of its sample are code punctuation (``{}[]()=;<>_#/*\\``). English prose sits near
  1–3%; 301 of the 728 stdlib files pass this bar (the rest, docstring-heavy, do not), and 31
  of 347 Markdown/reST documents (code blocks);
- a document labelled ``zxx`` (no linguistic content).

Other documents are identified on their first ``SAMPLE_CHARS`` characters (the model walks its
input byte by byte in Python: the sample bounds the time per document) and dropped if the
language is not allowed, unless the model's confidence is below ``data.language_confidence``
(too little text to tell: kept as undetermined). Nothing runs when ``data.languages`` is empty.
"""

from __future__ import annotations

import re

SAMPLE_CHARS = 2000
NO_LANGUAGE = "zxx"
"""The model's label for text without linguistic content (tables, data, some code): kept, as code."""
CODE_SYMBOLS = 0.08
_CODE = re.compile(r"[{}\[\]()=;<>_#/*\\]")
_SPACE = re.compile(r"\s")

# Loaded on first use in each process (a forked worker inherits the parent's if it has one).
_identifier = None


def _model():
    global _identifier
    if _identifier is None:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        _identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    return _identifier


def code_share(text: str) -> float:
    """Share of the non-space characters (of the sample) that are code punctuation."""
    sample = text[:SAMPLE_CHARS]
    visible = len(sample) - len(_SPACE.findall(sample))
    return len(_CODE.findall(sample)) / visible if visible else 0.0


def looks_like_code(text: str) -> bool:
    return code_share(text) >= CODE_SYMBOLS


def identify(text: str) -> tuple[str, float]:
    """The ISO 639-1 code of ``text``'s language (its first ``SAMPLE_CHARS`` characters) and the model's confidence."""
    lang, confidence = _model().classify(text[:SAMPLE_CHARS])
    return lang, confidence


def language_problem(text: str, allowed: list[str], min_confidence: float) -> str:
    """``"language"`` if ``text`` is prose in a language not in ``allowed``; ``""`` to keep it
    (no allow-list, code, an allowed language, or too little confidence to tell)."""
    if not allowed or looks_like_code(text):
        return ""
    lang, confidence = identify(text)
    if lang in allowed or lang == NO_LANGUAGE or confidence < min_confidence:
        return ""
    return "language"


def known_languages() -> list[str]:
    """The codes the model can identify."""
    return list(_model().labels)


__all__ = [
    "CODE_SYMBOLS",
    "NO_LANGUAGE",
    "SAMPLE_CHARS",
    "code_share",
    "identify",
    "known_languages",
    "language_problem",
    "looks_like_code",
]
