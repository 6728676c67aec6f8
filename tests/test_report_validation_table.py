"""The validation report's table in words (``data_prep.validation_report``, in the Data validation Deck and
``pretrain runs report``): what was checked as a sentence, the value observed rounded, examples only of rows that
failed, and the setting a threshold comes from (issue 51, item 7). Rendered from outcome records as
``result.json`` stores them; one test runs the Great Expectations suites on small tables (no dataset prepared)."""

from __future__ import annotations

import dataclasses
import re

import pandas as pd
import pytest

from data_prep.config import ValidationConfig
from data_prep.validation_report import Outcome, report_section
from tests.helpers import html_table

# Records as data_prep.validation stores them, GE's own text in them (a record from before the setting was kept has none).
RECORDS = [
    {
        "suite": "dataset",
        "expectation": "expect_column_max_to_be_between",
        "column": "skipped_fraction",
        "success": False,
        "observed": "0.6904761904761905",
        "expected": "max_value=0.5",
        "setting": "validation.max_skipped_fraction",
    },
    {
        "suite": "documents",
        "expectation": "expect_column_values_to_be_between",
        "column": "tokens",
        "success": False,
        "observed": "2 unexpected rows, e.g. [0, 3000000]",
        "expected": "min_value=1.0, max_value=2000000.0",
        "setting": "validation.min_doc_tokens, validation.max_doc_tokens",
    },
    {
        "suite": "shards",
        "expectation": "expect_column_values_to_be_between",
        "column": "manifest_sequences",
        "success": True,
        "observed": "0 unexpected rows, e.g. []",
        "expected": "min_value=1.0",
    },
    {
        "suite": "shards",
        "expectation": "expect_column_pair_values_to_be_equal",
        "column": "stored_bytes",
        "success": False,
        "observed": "1 unexpected rows, e.g. [(100, 2000)]",
        "expected": "column_A=stored_bytes, column_B=manifest_bytes",
        "setting": "",
    },
    {
        "suite": "dataset",
        "expectation": "expect_column_max_to_be_between",
        "column": "byte_fallback_ratio",
        "success": True,
        "observed": "0.00012345678901234",
        "expected": "max_value=0.05",
        "setting": "validation.max_byte_fallback_ratio",
    },
]


def table_of(html: str) -> list[list[str]]:
    return html_table(html, "validation")


def test_each_row_says_in_words_what_was_checked_what_was_seen_and_which_setting_to_change():
    html = report_section([Outcome.from_record(r) for r in RECORDS])
    header, *rows = table_of(html)
    assert header == ["", "what was checked", "observed", "examples of failing rows", "threshold set by"]
    assert rows == [
        [
            "✗ fail",
            "share of the documents read skipped, for any reason: at most 50%",
            "69%",
            "",
            "validation.max_skipped_fraction",
        ],
        [
            "✗ fail",
            "each document: tokens between 1 and 2,000,000",
            "2 documents failing",
            "0, 3000000",
            "validation.min_doc_tokens, validation.max_doc_tokens",
        ],
        ["✗ fail", "each shard: size in the store equals size in the manifest", "1 shard failing", "100 ≠ 2000", "-"],
        ["✓ pass", "each shard: sequences in the manifest at least 1", "0 shards failing", "", "-"],
        [
            "✓ pass",
            "share of the tokens that are byte fallbacks (bytes the tokenizer could not merge): at most 5%",
            "0.0123%",
            "",
            "validation.max_byte_fallback_ratio",
        ],
    ]
    assert "expect_column" not in re.sub(r" title='[^']*'", "", html)  # GE's names only in a tooltip
    assert "e.g. []" not in html and "0.6904761904761905" not in html


def test_a_table_without_failing_rows_has_no_examples_column_and_unknown_checks_keep_their_words():
    unknown = {"suite": "x", "expectation": "expect_column_mean_to_be_between", "column": "c", "success": True}
    records = [RECORDS[2], RECORDS[4], {**unknown, "observed": "3.14159265", "expected": "min_value=1.0"}]
    header, *rows = table_of(report_section([Outcome.from_record(r) for r in records]))
    assert header == ["", "what was checked", "observed", "threshold set by"]
    assert rows[-1] == ["✓ pass", "column mean to be between (c): min_value=1.0", "3.142", "-"]


@pytest.mark.slow  # Great Expectations' import and an ephemeral context: several seconds
def test_the_suites_record_the_setting_behind_each_threshold():
    """Every threshold that comes from ``validation.*`` names its setting in the expectation's meta, and the
    outcome carries it: thresholds set to values of their own here, so that each is found by its value."""
    from data_prep.validation import _run_suites, _suites

    config = ValidationConfig(
        min_documents=3,
        min_doc_tokens=4,
        max_doc_tokens=999_999,
        max_duplicate_fraction=0.41,
        max_skipped_fraction=0.42,
        max_quality_fraction=0.43,
        max_language_fraction=0.44,
        max_pii_fraction=0.045,
        max_byte_fallback_ratio=0.046,
        min_shard_bytes=1025,
        max_shard_bytes=1_000_000_007,
    )
    by_value = {float(v): f"validation.{k}" for k, v in dataclasses.asdict(config).items()}
    manifest = {"stats": {"documents_kept": 2, "skipped_quality_gopher_stop_words": 1}}
    suites = _suites(config, manifest)
    for name, expectations in suites.items():
        for expectation in expectations:
            kwargs = expectation.configuration.kwargs
            wanted = [by_value[float(kwargs[k])] for k in ("min_value", "max_value") if float(kwargs.get(k) or -1) in by_value]
            setting = (expectation.configuration.meta or {}).get("setting", "")
            if wanted:
                assert setting.split(", ") == wanted, (name, kwargs)
            else:  # a fixed threshold, or the manifest's count
                assert setting in ("", "the manifest (documents_kept)"), (name, kwargs)
    documents = pd.DataFrame({"tokens": [5, 7], "sha256": ["a", "b"], "split": ["train", "val"], "byte_fallback": [0, 0]})
    shards = pd.DataFrame(
        [
            {
                "shard": f"shards/{split}-0.tar",
                "split": split,
                "named_for_split": True,
                "manifest_sequences": 3,
                "stored_sequences": 3,
                "manifest_bytes": 2000,
                "stored_bytes": 2000,
                "sha256_matches": True,
            }
            for split in ("train", "val")
        ]
    )
    figures = {"duplicate_fraction": 0.0, "skipped_fraction": 0.5, "byte_fallback_ratio": 0.0, "train_val_overlap": 0}
    figures |= {"val_documents": 1, "train_documents": 1, "language_fraction": 0.0, "pii_fraction": 0.0}
    dataset = pd.DataFrame([figures | {"skipped_quality_gopher_stop_words": 0.5}])
    outcomes = _run_suites({"documents": documents, "shards": shards, "dataset": dataset}, suites)
    settings = {(o.suite, o.column): o.setting for o in outcomes}
    assert settings[("documents", "tokens")] == "validation.min_doc_tokens, validation.max_doc_tokens"
    assert settings[("dataset", "skipped_quality_gopher_stop_words")] == "validation.max_quality_fraction"
    assert settings[("shards", "manifest_sequences")] == ""  # a fixed threshold
    header, *rows = table_of(report_section(outcomes))
    failed = [row for row in rows if row[0] == "✗ fail"]
    assert [row[1:] for row in failed] == [
        ["number of documents (rows of doc_stats.csv): at least 3", "2", "validation.min_documents"],
        ["share of the documents read skipped, for any reason: at most 42%", "50%", "validation.max_skipped_fraction"],
        [
            "share of the documents read dropped by the quality rule gopher_stop_words: at most 43%",
            "50%",
            "validation.max_quality_fraction",
        ],
    ]
