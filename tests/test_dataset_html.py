"""The prepare task's Dataset Deck (``reports.dataset_html``): the figures, documents read against kept, the
documents skipped by reason as horizontal bars and the kept documents' lengths, from the dataset's own files
(matplotlib SVG read back as XML)."""

from __future__ import annotations

import csv
import io
import statistics

from common.contracts import DOC_STATS
from reports.dataset_html import dataset_html, dataset_section, skipped_by_reason
from storage import open_store
from tests.helpers import html_charts, svg_group, svg_ids, svg_lines, svg_texts

STATS = {
    "documents_read": 100,
    "documents_kept": 60,
    "skipped_total": 40,
    "skipped_duplicate": 25,
    "skipped_too_short": 10,
    "skipped_near_duplicate": 5,
    "skipped_language": 0,  # a reason that dropped nothing is not drawn
    "duplicates_total": 30,
    "train_tokens": 9000,
}


def widths(root, n: int) -> list[float]:
    """The drawn width of bars 0..n-1 (each a rectangle path: its x extent)."""
    out = []
    for i in range(n):
        (outline,) = svg_lines(svg_group(root, f"bar-{i}"))
        xs = [x for x, _ in outline]
        out.append(max(xs) - min(xs))
    return out


def test_skipped_documents_by_reason_and_kept_against_read_are_bars():
    assert skipped_by_reason(STATS) == [("duplicate", 25), ("too_short", 10), ("near_duplicate", 5)]
    html = dataset_section("abc123", "s3://bucket/datasets/abc123", STATS)
    # The figures' table stays, in words: a reason under the documents skipped, with its share of those read.
    assert (
        "<th class='part'>duplicate: exact duplicates of an earlier document</th><td class='num'>25 (25.0% of read)</td>" in html
    )
    documents, reasons = html_charts(html)

    assert svg_ids(documents, "bar-") == ["bar-0", "bar-1", "bar-2"]
    assert {"read", "kept", "skipped", "100", "60", "40"} <= set(svg_texts(documents))
    read, kept, skipped = widths(documents, 3)
    assert abs(kept / read - 0.6) < 1e-3 and abs(skipped / read - 0.4) < 1e-3

    assert svg_ids(reasons, "bar-") == ["bar-0", "bar-1", "bar-2"]
    texts = svg_texts(reasons)
    assert {"documents skipped, by reason", "documents", "duplicate", "too_short", "near_duplicate"} <= set(texts)
    assert "language" not in texts
    assert texts.index("duplicate") < texts.index("too_short") < texts.index("near_duplicate")  # the largest on top
    duplicate, too_short, near = widths(reasons, 3)
    assert abs(too_short / duplicate - 10 / 25) < 1e-3 and abs(near / duplicate - 5 / 25) < 1e-3


def test_a_dataset_that_skipped_nothing_says_so_and_hostile_names_are_escaped():
    html = dataset_section("<b>v</b>", "/tmp/x", {"documents_read": 3, "documents_kept": 3, "skipped_total": 0})
    assert "none skipped" in html and "<b>v</b>" not in html and "&lt;b&gt;v&lt;/b&gt;" in html
    hostile = dataset_section("v", "/tmp/x", {"skipped_<script>x</script>": 2})
    assert "<script>" not in hostile and "<script>x</script>" in svg_texts(html_charts(hostile)[-1])


def test_the_deck_of_a_prepared_dataset_charts_its_document_lengths(tiny_dataset):
    store = open_store(tiny_dataset.store)
    html = dataset_html(store, tiny_dataset.version)
    *_, lengths = html_charts(html)
    assert svg_group(lengths, "hist") is not None
    rows = list(csv.DictReader(io.StringIO(store.get_bytes(f"{tiny_dataset.prefix}/{DOC_STATS}").decode())))
    assert len(rows) == tiny_dataset.stats["documents_kept"]
    median = statistics.median(int(row["tokens"]) for row in rows)
    texts = svg_texts(lengths)
    assert {"length of the kept documents", "tokens per document", f"median {median:,.0f}"} <= set(texts)
    assert f"<th>version</th><td>{tiny_dataset.version}</td>" in html
