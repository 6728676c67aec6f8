"""A prepared dataset as HTML: its figures, the documents read, kept and skipped by reason, and how long the
kept documents are. The prepare task's *Dataset* Deck and the dataset section of ``pretrain runs report``.

Read from what the dataset already holds (the manifest's stats, ``doc_stats.csv``): nothing is added to the
dataset for it, so its version does not change. Imports nothing of training: the data tasks' cache keys stay
clear of it.
"""

from __future__ import annotations

import csv
import io

from common.contracts import DatasetRef, dataset_prefix
from data_prep.manifest import load_manifest, read_recorded
from reports import data_charts
from reports.dataset_table import SKIPPED, SKIPPED_TOTAL, dataset_table
from reports.deck_html import STYLE, chart
from storage import Store


def skipped_by_reason(stats: dict) -> list[tuple[str, int]]:
    """(reason, documents) of every ``skipped_<reason>`` count above zero, the largest first."""
    reasons = [(k.removeprefix(SKIPPED), int(n)) for k, n in stats.items() if k.startswith(SKIPPED) and k != SKIPPED_TOTAL]
    return sorted(((r, n) for r, n in reasons if n > 0), key=lambda rn: (-rn[1], rn[0]))


def dataset_section(version: str, uri: str, stats: dict, lengths: list[int] | None = None, splits: dict | None = None) -> str:
    """The figures of the dataset as a table for people (``reports.dataset_table``; ``splits``: the manifest's, for
    the shards), then charts: read against kept (and skipped), the skipped documents by reason, and, given
    ``lengths`` (tokens of each kept document), their distribution."""
    parts = [STYLE, dataset_table(version, uri, stats, splits)]
    if "documents_read" in stats and "documents_kept" in stats:
        read, kept = int(stats["documents_read"]), int(stats["documents_kept"])
        skipped = int(stats.get(SKIPPED_TOTAL, read - kept))
        figure = data_charts.bars_figure(
            ["read", "kept", "skipped"], [read, kept, skipped], "documents read, kept and skipped", "documents"
        )
        parts.append(chart(figure))
    reasons = skipped_by_reason(stats)
    if reasons:
        labels, counts = zip(*reasons, strict=True)
        parts.append(chart(data_charts.bars_figure(list(labels), list(counts), "documents skipped, by reason", "documents")))
    else:
        parts.append("<h3>documents skipped, by reason</h3><p>none skipped</p>")
    if lengths:
        figure = data_charts.histogram_figure(lengths, "length of the kept documents", "tokens per document", "documents")
        parts.append(chart(figure))
    return "".join(parts)


def doc_tokens(store: Store, ref: DatasetRef, manifest: dict) -> list[int]:
    """Tokens of each kept document, from the dataset's ``doc_stats.csv`` (checked against the manifest; [] if it
    records none). The whole file is read, as the validation gate reads it: one short row per document."""
    if "doc_stats" not in manifest:
        return []
    rows = csv.DictReader(io.StringIO(read_recorded(store, ref, "doc_stats", manifest).decode(), newline=""))
    return [int(row["tokens"]) for row in rows if (row.get("tokens") or "").isdigit()]


def dataset_html(store: Store, version: str) -> str:
    """``dataset_section`` of the committed dataset ``version`` in ``store`` (its manifest checked to be that version)."""
    ref = DatasetRef(store=store.uri, version=version, prefix=dataset_prefix(version))
    manifest = load_manifest(store, ref)
    stats, lengths = manifest["stats"], doc_tokens(store, ref, manifest)
    return dataset_section(version, store.url(ref.prefix), stats, lengths, manifest.get("splits"))
