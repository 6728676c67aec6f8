"""The pieces every Deck and report page is built of: one style sheet, tables, inline charts and a whole page.

Self-contained by rule: no CDN asset, no script, no external font; a chart is matplotlib SVG inlined
(``reports.plotting``). Every value that reaches the HTML goes through ``html.escape`` here or in the caller.
No Flyte: the Decks (``tasks.decks``) and ``pretrain runs report`` (``reports.run_report``) share them.
"""

from __future__ import annotations

from html import escape
from typing import Any

from reports import plotting

STYLE = (
    "<style>body{font-family:sans-serif} table{border-collapse:collapse}"
    " td,th{border:1px solid #ccc;padding:3px 8px;text-align:left} td.num{text-align:right}"
    " pre{background:#f6f6f6;padding:8px}</style>"
)


def fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def num(value: object, spec: str) -> str:
    """A figure in ``spec``'s format, '-' for a missing one."""
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def table(rows: dict[str, object], title: str) -> str:
    """A key/value table under a heading."""
    body = "".join(f"<tr><th>{escape(str(k))}</th><td>{escape(fmt(v))}</td></tr>" for k, v in rows.items())
    return f"{STYLE}<h3>{escape(title)}</h3><table>{body}</table>"


def grid(header: list[str], rows: list[list[str]], css_class: str = "") -> str:
    """A table with a header row; every cell is text (escaped here), cells after the first right-aligned
    (they are figures)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_cell(c, figure=i > 0) for i, c in enumerate(row)) + "</tr>" for row in rows)
    cls = f" class='{escape(css_class)}'" if css_class else ""
    return f"<table{cls}><tr>{head}</tr>{body}</table>"


def _cell(text: str, figure: bool) -> str:
    return f"<td class='num'>{escape(text)}</td>" if figure else f"<td>{escape(text)}</td>"


def chart(fig: Any) -> str:
    """A matplotlib figure inlined as SVG (``reports.plotting``)."""
    return f"<div class='chart'>{plotting.svg(fig)}</div>"


def page(title: str, sections: list[tuple[str, str]]) -> str:
    """One HTML document of ``sections`` (heading, HTML body), each under an <h2>: what a browser opens offline."""
    body = "".join(f"<section><h2>{escape(heading)}</h2>{html}</section>" for heading, html in sections)
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{escape(title)}</title>{STYLE}'
        "<style>body{margin:1.5em;max-width:1100px} section{margin-bottom:2.5em} h2{border-bottom:1px solid #ccc}</style>"
        f"</head><body><h1>{escape(title)}</h1>{body}</body></html>"
    )
