"""One document's way through the filters, run once per document, by the scan pass.

The scan judges a document by the text this returns, hashes and de-duplicates that text, and
keeps it (``scan.py``): the tokenizer trains on it and the encode pass encodes it as kept, so
what is hashed is what is in the dataset. Order, and why:

1. clean (``clean_text``) and length (``too_short``/``too_long``/``empty``);
2. PII (``data.pii``): a ``drop`` kind drops the document (``pii_<kind>``), ``redact``
   kinds are replaced first, so that everything after judges, hashes and trains on the text
   that will be in the dataset (two documents that differ only in an e-mail address are then
   exact duplicates);
3. language (``data.languages``): ``language``;
4. quality rules (``data.quality``): ``quality_<rule>``; C4's line rules may remove lines;
5. length again if the text changed (redaction or C4 can shorten it below ``min_chars``).
"""

from __future__ import annotations

from data_prep.clean import clean_text, length_problem
from data_prep.config import DataConfig
from data_prep.language import language_problem
from data_prep.pii import scrub
from data_prep.quality import quality_problem


def filtered_text(raw: str, data: DataConfig) -> tuple[str, str, dict[str, int]]:
    """The text to keep, the skip reason (``""`` if kept) and the edits made to the cleaned text
    (``pii_<kind>`` redactions, ``c4_lines_removed``; only those made: empty = the text is
    ``clean_text``'s)."""
    text = clean_text(raw, data.normalization)
    reason = length_problem(text, data.min_chars, data.max_chars)
    if reason:
        return text, reason, {}
    text, reason, redactions = scrub(text, data.pii)
    if reason:
        return text, reason, {}
    if data.languages and (reason := language_problem(text, data.languages, data.language_confidence)):
        return text, reason, {}
    judged = text
    rule, text = quality_problem(text, data.quality)
    if rule:
        return text, f"quality_{rule}", {}
    edits = redactions
    if text is not judged:  # C4's line rules removed lines
        edits = {**redactions, "c4_lines_removed": judged.count("\n") + 1 - (text.count("\n") + 1 if text else 0)}
    if edits and (reason := length_problem(text, data.min_chars, data.max_chars)):
        return text, reason, {}
    return text, "", edits


__all__ = ["filtered_text"]
