"""The validation gate's report as HTML: a self-contained page (no CDN asset, no script: it renders in a Flyte
Deck and offline), every value escaped (shard names and observed values come from the data).

Apart from ``data_prep.validation`` (which runs the suites, with pandas and, through the shard reader,
webdataset and torch where installed) so that ``pretrain runs report`` renders a stored ``result.json``
without them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html import escape

from common.contracts import DatasetRef


@dataclass
class Outcome:
    """One expectation's verdict, in words a user can act on."""

    suite: str
    expectation: str
    column: str
    success: bool
    observed: str
    expected: str
    setting: str = ""
    """Where the threshold comes from: the config setting(s) ('validation.max_skipped_fraction'), as the suite's
    builder recorded it in the expectation's meta ('' : a fixed threshold, or a result from before it was recorded)."""

    @classmethod
    def from_record(cls, record: dict) -> Outcome:
        """An outcome as ``result.json`` records it (``asdict``), read back as text and a bool whatever the
        file holds: the report escapes text, and a stored file is anyone's who can write to the bucket."""
        texts = ("suite", "expectation", "column", "observed", "expected", "setting")
        return cls(**{k: str(record.get(k) or "") for k in texts}, success=record.get("success") is True)

    def line(self) -> str:
        where = f"{self.suite}.{self.column}" if self.column else self.suite
        return f"{where}: {self.expectation} failed (observed {self.observed}; expected {self.expected})"


def report_html(ref: DatasetRef, outcomes: list[Outcome], modified: list[str] = ()) -> str:
    """A self-contained page (no CDN assets: it must render in a Flyte Deck and offline); every
    value in it is escaped (shard names, observed values: they come from the data)."""
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Validation of dataset {escape(ref.version)}</title>
<style>body{{font-family:sans-serif;margin:1.5em}}</style></head><body>
<h1>Dataset {escape(ref.version)}</h1>{report_section(outcomes, modified)}</body></html>"""


def report_section(outcomes: list[Outcome], modified: list[str] = ()) -> str:
    """The report without its page: the verdict, a row per expectation (failures first) in words (what was
    checked, the value observed, examples of the rows that failed, the setting the threshold comes from) and the
    shards modified since the commit, with its own style; ``pretrain runs report`` shows it inside its page,
    rendered from the stored ``result.json``."""
    failed = sum(not o.success for o in outcomes)
    verdict = f"FAILED: {failed} of {len(outcomes)} expectations" if failed else f"PASSED: all {len(outcomes)} expectations"
    ordered = sorted(outcomes, key=lambda o: o.success)
    shown = [(o, checked(o), observed_text(o), examples_text(o)) for o in ordered]
    with_examples = any(examples for *_, examples in shown)
    header = ["", "what was checked", "observed", *(["examples of failing rows"] if with_examples else []), "threshold set by"]
    rows = "\n".join(
        f"<tr class={'ok' if o.success else 'bad'}><td>{'✓ pass' if o.success else '✗ fail'}</td>"
        f"<td title='{escape(o.expectation)}'>{escape(check)}</td><td class='num'>{escape(value)}</td>"
        + (f"<td>{escape(examples)}</td>" if with_examples else "")
        + f"<td>{escape(o.setting or '-')}</td></tr>"
        for o, check, value, examples in shown
    )
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    return f"""<style>table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}} td.num{{text-align:right}}
.bad td{{background:#fde8e8}} .ok td{{background:#eefbea}} h2.bad{{color:#b00}} h2.ok{{color:#070}}</style>
<h2 class="{"bad" if failed else "ok"}">{verdict}</h2>
<table class='validation'><tr>{head}</tr>
{rows}</table>
{_modified_html(modified)}"""


# --- an outcome in words ---------------------------------------------------------------------------
ROWS = {"documents": ("document", "documents"), "shards": ("shard", "shards")}
"""Each suite's table as (one row, the rows) in words; the dataset suite's is one row of figures."""
COUNTED = {"documents": "documents (rows of doc_stats.csv)"}
"""What a suite's row count counts, where its rows need saying."""
COLUMNS = {
    "tokens": "tokens",
    "sha256": "text (sha256)",
    "split": "split",
    "stored_bytes": "size in the store",
    "manifest_bytes": "size in the manifest",
    "stored_sequences": "sequences in the store",
    "manifest_sequences": "sequences in the manifest",
    "sha256_matches": "sha256 matches the manifest's",
    "named_for_split": "file name starts with its split",
    "duplicate_fraction": "share of the documents read dropped as duplicates",
    "skipped_fraction": "share of the documents read skipped, for any reason",
    "byte_fallback_ratio": "share of the tokens that are byte fallbacks (bytes the tokenizer could not merge)",
    "train_val_overlap": "documents in both train and validation",
    "val_documents": "validation documents",
    "train_documents": "train documents",
    "language_fraction": "share of the documents read dropped by data.languages",
    "pii_fraction": "share of the documents read dropped for personal data (data.pii)",
}
QUALITY = "skipped_quality_"
SIZES = {"stored_bytes", "manifest_bytes"}
_KWARG = re.compile(r", (?=\w+=)")
_PAIR = re.compile(r"\(([^(),]*), ([^(),]*)\)")
_UNEXPECTED = re.compile(r"^(\d+) unexpected rows?, e\.g\. \[(.*)\]$", re.DOTALL)


def column_words(column: str) -> str:
    if column.startswith(QUALITY):
        return f"share of the documents read dropped by the quality rule {column.removeprefix(QUALITY)}"
    return COLUMNS.get(column, column.replace("_", " "))


def is_share(column: str) -> bool:
    """A fraction of a whole, shown in percent."""
    return column.endswith(("_fraction", "_ratio")) or column.startswith(QUALITY)


def figure(column: str, text: str) -> str:
    """A recorded number as people read it: a share in percent (3 figures), a size in kB/MB/GB, a count with
    thousands separators, another number to 4 figures; text that is not a number as it is."""
    try:
        value = float(text)
    except ValueError:
        return text
    if is_share(column):
        return f"{value * 100:.3g}%"
    if column in SIZES:
        for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
            if value >= scale:
                return f"{value / scale:.3g} {unit}"
        return f"{value:,.0f} bytes"
    return f"{value:,.0f}" if value.is_integer() else f"{value:.4g}"


def expected_kwargs(outcome: Outcome) -> dict[str, str]:
    """The expectation's arguments as ``result.json`` records them ('min_value=1.0, max_value=5.0')."""
    if "=" not in outcome.expected:
        return {}
    return dict(part.partition("=")[::2] for part in _KWARG.split(outcome.expected))


def _range(column: str, kwargs: dict[str, str]) -> str:
    low, high = kwargs.get("min_value"), kwargs.get("max_value")
    if low is not None and high is not None:
        return f"between {figure(column, low)} and {figure(column, high)}"
    if low is not None:
        return f"at least {figure(column, low)}"
    return f"at most {figure(column, high)}" if high is not None else ""


def checked(outcome: Outcome) -> str:
    """What the expectation checked, as a sentence ('each document: tokens between 1 and 2,000,000'); an
    expectation this report does not know is named by its words and arguments."""
    kind, column, kwargs = outcome.expectation.removeprefix("expect_"), outcome.column, expected_kwargs(outcome)
    row, rows = ROWS.get(outcome.suite, ("row", "rows"))
    what = column_words(column)
    if kind in ("table_row_count_to_be_between", "table_row_count_to_equal"):
        count = _range(column, kwargs) if "value" not in kwargs else f"exactly {figure('', kwargs['value'])}"
        return f"number of {COUNTED.get(outcome.suite, rows)}: {count}"
    if kind == "column_values_to_be_between":
        return f"each {row}: {what} {_range(column, kwargs)}"
    if kind == "column_values_to_be_unique":
        return f"no two {rows} with the same {what}"
    if kind == "column_values_to_be_in_set":
        allowed = kwargs.get("value_set", "").strip("[]")
        return f"each {row}: {what}" if allowed == "True" else f"each {row}: {what} is one of {allowed}"
    if kind == "column_pair_values_to_be_equal":
        return f"each {row}: {what} equals {column_words(kwargs.get('column_B', ''))}"
    if kind in ("column_max_to_be_between", "column_min_to_be_between"):
        return f"{what}: {_range(column, kwargs)}"
    where = f" ({column})" if column else ""
    arguments = f": {outcome.expected}" if kwargs else ""
    return f"{kind.replace('_', ' ')}{where}{arguments}"


def observed_text(outcome: Outcome) -> str:
    """The value observed, rounded ('69%'), or how many rows failed ('0 shards failing')."""
    unexpected = _UNEXPECTED.match(outcome.observed)
    if unexpected:
        n = int(unexpected[1])
        row, rows = ROWS.get(outcome.suite, ("row", "rows"))
        return f"{n:,} {row if n == 1 else rows} failing"
    if outcome.expectation.startswith("expect_table_row_count"):
        return figure("", outcome.observed)
    return figure(outcome.column, outcome.observed)


def examples_text(outcome: Outcome) -> str:
    """Some values of the rows that failed ('0, 3000000'; a pair of columns as '100 ≠ 2000'); '' when none
    failed, or when the value says nothing the check does not (a flag that should be true was false)."""
    unexpected = _UNEXPECTED.match(outcome.observed)
    if not unexpected or int(unexpected[1]) == 0 or expected_kwargs(outcome).get("value_set") == "[True]":
        return ""
    if outcome.expectation == "expect_column_pair_values_to_be_equal":
        return _PAIR.sub(r"\1 ≠ \2", unexpected[2])
    return unexpected[2]


def _modified_html(modified: list[str]) -> str:
    if not modified:
        return ""
    items = "".join(f"<li>{escape(line)}</li>" for line in modified)
    return f'<h3 class="bad">Shards modified after the dataset was committed</h3><ul>{items}</ul>'
