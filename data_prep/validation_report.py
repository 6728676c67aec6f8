"""The validation gate's report as HTML: a self-contained page (no CDN asset, no script: it renders in a Flyte
Deck and offline), every value escaped (shard names and observed values come from the data).

Apart from ``data_prep.validation`` (which runs the suites, with pandas and, through the shard reader,
webdataset and torch where installed) so that ``pretrain runs report`` renders a stored ``result.json``
without them.
"""

from __future__ import annotations

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

    @classmethod
    def from_record(cls, record: dict) -> Outcome:
        """An outcome as ``result.json`` records it (``asdict``), read back as text and a bool whatever the
        file holds: the report escapes text, and a stored file is anyone's who can write to the bucket."""
        texts = ("suite", "expectation", "column", "observed", "expected")
        return cls(**{k: str(record.get(k, "")) for k in texts}, success=record.get("success") is True)

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
    """The report without its page: the verdict, a row per expectation (failures first) and the shards
    modified since the commit, with its own style; ``pretrain runs report`` shows it inside its page,
    rendered from the stored ``result.json``."""
    failed = sum(not o.success for o in outcomes)
    verdict = f"FAILED: {failed} of {len(outcomes)} expectations" if failed else f"PASSED: all {len(outcomes)} expectations"
    rows = "\n".join(
        f"<tr class={'ok' if o.success else 'bad'}><td>{'✓' if o.success else '✗'}</td><td>{escape(o.suite)}</td>"
        f"<td>{escape(o.column)}</td><td>{escape(o.expectation)}</td><td>{escape(o.observed)}</td><td>{escape(o.expected)}</td></tr>"
        for o in sorted(outcomes, key=lambda o: o.success)
    )
    return f"""<style>table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}
.bad td{{background:#fde8e8}} .ok td{{background:#eefbea}} h2.bad{{color:#b00}} h2.ok{{color:#070}}</style>
<h2 class="{"bad" if failed else "ok"}">{verdict}</h2>
<table><tr><th></th><th>suite</th><th>column</th><th>expectation</th><th>observed</th><th>expected</th></tr>
{rows}</table>
{_modified_html(modified)}"""


def _modified_html(modified: list[str]) -> str:
    if not modified:
        return ""
    items = "".join(f"<li>{escape(line)}</li>" for line in modified)
    return f'<h3 class="bad">Shards modified after the dataset was committed</h3><ul>{items}</ul>'
