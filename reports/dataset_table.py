"""A prepared dataset's figures as a table for people (``reports.dataset_html``): labels in words, in the order
the data went through the preparation (input, then filtering with each reason documents were skipped for, then
the tokens and shards written), counts with thousands separators, sizes in kB/MB/GB, shares of the documents read.

The manifest's stats are read as they are: a figure this module does not know (a newer preparation's) is still
shown, under "other figures", with its key in words; nothing recorded is hidden.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from data_prep.console import REASONS

SKIPPED = "skipped_"
SKIPPED_TOTAL = "skipped_total"
PII_EDITS = "pii_"
PII_KINDS = {"email": "e-mail addresses", "ip": "IP addresses", "secret": "secrets (keys, tokens)"}

PART = " class='part'"
TABLE_STYLE = (
    "<style>table.dataset tr.group th{background:#f0f0f0;padding-top:8px}"
    " table.dataset th.part{padding-left:2em;font-weight:normal}</style>"
)
Row = tuple[str, str, bool]
"""(label, value, whether the label is a part of the row above it: drawn indented)."""


def size_text(n: float) -> str:
    """A size in bytes as people read it: '950 bytes', '12.3 kB', '4.00 MB', '1,200 GB' (powers of 1,000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{_three_figures(n / scale)} {unit}"
    return f"{int(n):,} bytes"


def _three_figures(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:,.0f}"


def count_text(n: float) -> str:
    return f"{int(n):,}" if float(n).is_integer() else f"{n:,.4g}"


def share_text(n: float, whole: float, of: str = "") -> str:
    """'25 (25.0% of read)': a count with its share of ``whole`` (a small share to two figures: 0.0012%; none
    when ``whole`` is 0)."""
    if not whole:
        return count_text(n)
    share = n / whole
    percent = f"{share:.1%}" if share == 0 or share >= 0.001 else f"{share * 100:.2g}%"
    return f"{count_text(n)} ({percent}{f' {of}' if of else ''})"


def reason_words(reason: str) -> str:
    """A skip reason in words: 'too_short' → 'too short: shorter than data.min_chars after cleaning'."""
    words = reason.replace("_", " ")
    if reason.startswith("quality_"):
        return f"quality rule {reason.removeprefix('quality_')} (data.quality)"
    if reason.startswith("pii_"):
        return f"personal data: {reason.removeprefix('pii_').replace('_', ' ')} (data.pii)"
    if reason == "language":
        return "language not in data.languages"
    return f"{words}: {REASONS[reason]}" if reason in REASONS else words


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def dataset_rows(stats: dict, splits: dict | None = None) -> list[tuple[str, list[Row]]]:
    """The dataset's figures in groups, (group title, rows): the input read, the filtering, the output written
    (``splits``: the manifest's, for its shards), the tokenizer's sample, then any figure not placed above."""
    shown: set[str] = set()

    def take(key: str) -> float | None:
        value = stats.get(key)
        if not _number(value):
            return None
        shown.add(key)
        return value

    def rows(*specs: tuple[str, str, Callable[[float], str]]) -> list[Row]:
        """(key, label, how to write it) for each figure the stats hold, in that order."""
        out = []
        for key, label, write in specs:
            value = take(key)
            if value is not None:
                out.append((label, write(value), False))
        return out

    read = stats.get("documents_read") if _number(stats.get("documents_read")) else 0
    tokens = sum(v for k in ("train_tokens", "val_tokens") if _number(v := stats.get(k)))

    def of_read(n: float) -> str:
        return share_text(n, read, "of read")

    groups = [
        (
            "input",
            rows(
                ("files_listed", "files listed", count_text),
                ("files_ignored", "files ignored (suffix not read, or hidden)", count_text),
                ("files_sniffed", "files read as text whatever their suffix", count_text),
                ("documents_read", "documents read", count_text),
            ),
        ),
        ("filtering", _filtering(stats, take, of_read)),
        (
            "output",
            rows(
                ("documents_kept", "documents kept", of_read),
                ("train_documents", "train documents", count_text),
                ("val_documents", "validation documents", count_text),
                ("train_tokens", "train tokens", count_text),
                ("val_tokens", "validation tokens", count_text),
                ("val_doc_tokens", "validation tokens without end-of-text markers (for bits per byte)", count_text),
                (
                    "byte_fallback_tokens",
                    "byte-fallback tokens (bytes the tokenizer could not merge)",
                    lambda n: share_text(n, tokens, "of tokens"),
                ),
                ("source_bytes", "text of the kept documents", size_text),
                ("val_bytes", "text of the validation documents", size_text),
            )
            + _shards(splits or {}),
        ),
        ("tokenizer", rows(("tokenizer_sample_bytes", "text sampled to train the tokenizer", size_text))),
    ]
    other = [(key.replace("_", " "), _any_text(value), False) for key, value in stats.items() if key not in shown]
    return [(title, group) for title, group in [*groups, ("other figures", other)] if group]


def _filtering(stats: dict, take: Callable[[str], float | None], of_read: Callable[[float], str]) -> list[Row]:
    """Documents skipped, then each reason (the largest first), the duplicates among them, and the kept documents'
    edits (personal data redacted, lines removed)."""
    out: list[Row] = []
    total = take(SKIPPED_TOTAL)
    if total is not None:
        out.append(("documents skipped", of_read(total), False))
    reasons = [(k, stats[k]) for k in stats if k.startswith(SKIPPED) and k != SKIPPED_TOTAL and _number(stats[k])]
    for key, n in sorted(reasons, key=lambda kn: (-kn[1], kn[0])):
        take(key)
        if n > 0:  # a filter that dropped nothing is no reason
            out.append((reason_words(key.removeprefix(SKIPPED)), of_read(n), True))
    for key, label in (
        ("duplicates_total", "duplicates among them (exact and near)"),
        ("near_duplicates_rejected_by_verification", "near-duplicate candidates kept after verification"),
    ):
        if (n := take(key)) is not None:
            out.append((label, count_text(n), False))
    for key in sorted(k for k in stats if k.startswith(PII_EDITS) and _number(stats[k])):
        kind = key.removeprefix(PII_EDITS)
        out.append((f"{PII_KINDS.get(kind, kind)} redacted in kept documents (data.pii)", count_text(take(key)), False))
    if (n := take("c4_lines_removed")) is not None:
        out.append(("lines removed from kept documents (data.quality.c4)", count_text(n), False))
    return out


def _shards(splits: dict) -> list[Row]:
    """'train shards: 3 (2.10 MB)' for each split of the manifest."""
    out = []
    for split, info in splits.items():
        shards = info.get("shards", []) if isinstance(info, dict) else []
        size = sum(s.get("bytes", 0) for s in shards if _number(s.get("bytes")))
        name = "validation" if split == "val" else split
        out.append((f"{name} shards", f"{len(shards):,} ({size_text(size)})", False))
    return out


def _any_text(value: object) -> str:
    return count_text(value) if _number(value) else str(value)


def dataset_table(version: str, uri: str, stats: dict, splits: dict | None = None) -> str:
    """The table: the version and where it is, then each group under a heading row, parts of a figure indented."""
    head = [("version", version), ("location", uri)]
    body = "".join(f"<tr><th>{escape(label)}</th><td>{escape(value)}</td></tr>" for label, value in head)
    for title, rows in dataset_rows(stats, splits):
        body += f"<tr class='group'><th colspan='2'>{escape(title)}</th></tr>"
        body += "".join(
            f"<tr><th{PART if part else ''}>{escape(label)}</th><td class='num'>{escape(value)}</td></tr>"
            for label, value, part in rows
        )
    return f"{TABLE_STYLE}<h3>figures</h3><table class='dataset'>{body}</table>"
