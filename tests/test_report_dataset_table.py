"""The dataset's figures as a table for people (``reports.dataset_table``, in the Dataset Deck and ``pretrain runs
report``): labels in words, grouped input → filtering → output, thousands separators, sizes in kB/MB/GB (issue 51,
item 7). Built from a manifest's stats written here: no dataset is prepared."""

from __future__ import annotations

import re

from reports.dataset_html import dataset_section
from reports.dataset_table import share_text, size_text
from tests.helpers import html_table

# The keys a prepared dataset's manifest records (data_prep.prepare._stats), in its alphabetical order.
STATS = {
    "byte_fallback_tokens": 12_345,
    "c4_lines_removed": 0,
    "documents_kept": 1_000_000,
    "documents_read": 1_234_567,
    "duplicates_total": 230_000,
    "files_ignored": 3,
    "files_listed": 1_500,
    "files_sniffed": 0,
    "near_duplicates_rejected_by_verification": 12,
    "pii_email": 17,
    "skipped_duplicate": 200_000,
    "skipped_language": 0,
    "skipped_near_duplicate": 30_000,
    "skipped_too_short": 4_567,
    "skipped_total": 234_567,
    "source_bytes": 4_012_345_678,
    "tokenizer_sample_bytes": 32_000_000,
    "train_documents": 990_000,
    "train_tokens": 987_654_321,
    "val_bytes": 40_123_456,
    "val_doc_tokens": 9_866_543,
    "val_documents": 10_000,
    "val_tokens": 9_876_543,
    "a_figure_added_later": 7,
}
SPLITS = {"train": {"shards": [{"bytes": 2_000_000_000}] * 2}, "val": {"shards": [{"bytes": 20_123_456}]}}


def rows_of(html: str) -> list[list[str]]:
    return [[re.sub(r"<[^>]+>", "", cell) for cell in row] for row in html_table(html, "dataset")]


def test_the_dataset_table_reads_input_then_filtering_then_output_in_words():
    rows = rows_of(dataset_section("abc123", "s3://bucket/datasets/abc123", STATS, splits=SPLITS))
    labels = [row[0] for row in rows]
    assert rows[:2] == [["version", "abc123"], ["location", "s3://bucket/datasets/abc123"]]
    groups = [label for label in labels if label in ("input", "filtering", "output", "tokenizer", "other figures")]
    assert groups == ["input", "filtering", "output", "tokenizer", "other figures"]
    figures = {row[0]: row[1] for row in rows if len(row) == 2}
    assert figures["documents read"] == "1,234,567"
    assert figures["documents skipped"] == "234,567 (19.0% of read)"
    assert figures["documents kept"] == "1,000,000 (81.0% of read)"
    assert figures["train tokens"] == "987,654,321" and figures["validation tokens"] == "9,876,543"
    assert figures["text of the kept documents"] == "4.01 GB" and figures["text of the validation documents"] == "40.1 MB"
    assert figures["train shards"] == "2 (4.00 GB)" and figures["validation shards"] == "1 (20.1 MB)"
    assert figures["byte-fallback tokens (bytes the tokenizer could not merge)"] == "12,345 (0.0012% of tokens)"
    assert figures["a figure added later"] == "7"  # a figure not known here is shown all the same
    # The skip reasons follow the documents skipped, the largest first, in words; one that dropped nothing is left out.
    first = labels.index("documents skipped")
    assert labels[first + 1 : first + 4] == [
        "duplicate: exact duplicates of an earlier document",
        "near duplicate: near-duplicates of an earlier document, data.near_dedup",
        "too short: shorter than data.min_chars after cleaning",
    ]
    assert not any("language" in label for label in labels)
    assert labels.index("documents read") < first < labels.index("documents kept") < labels.index("train tokens")
    assert not set(labels) & set(STATS)  # no key shown as it is recorded
    html = dataset_section("abc123", "s3://bucket/datasets/abc123", STATS, splits=SPLITS)
    assert "<th class='part'>too short: shorter than data.min_chars after cleaning</th>" in html  # indented: a part


def test_sizes_and_shares_are_written_as_people_read_them():
    assert [size_text(n) for n in (950, 12_345, 4_000_000, 1_234_567_890_123)] == ["950 bytes", "12.3 kB", "4.00 MB", "1,235 GB"]
    assert share_text(25, 100, "of read") == "25 (25.0% of read)" and share_text(3, 0) == "3"
    assert share_text(0, 10) == "0 (0.0%)"
