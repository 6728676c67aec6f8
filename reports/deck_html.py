"""The pieces every Deck and report page is built of: one style sheet, tables, inline charts and a whole page.

Self-contained by rule: no CDN asset, no script, no external font; a chart is matplotlib SVG inlined
(``reports.plotting``). Every value that reaches the HTML goes through ``html.escape`` here or in the caller.
No Flyte: the Decks (``tasks.decks``) and ``pretrain runs report`` (``reports.run_report``) share them.
"""

from __future__ import annotations

import re
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


CHART_STYLE = "width:100%;height:auto"
"""A chart takes the width of the page (or Deck) it is in, its height following from its viewBox: matplotlib
writes its size in points, which leaves a chart a third of a wide page. Inline on the <svg>, so a Deck made of
charts alone (no ``STYLE``) is sized too."""


def chart(fig: Any) -> str:
    """A matplotlib figure inlined as SVG (``reports.plotting``), as wide as the page."""
    svg = plotting.svg(fig).replace("<svg ", f'<svg style="{CHART_STYLE}" ', 1)
    return f"<div class='chart'>{svg}</div>"


_H3 = re.compile(r"<h3>(.*?)</h3>", re.DOTALL)
_TAG = re.compile(r"<[^>]*>")


def anchor(text: str, taken: set[str]) -> str:
    """An id for a heading: its words in lower case joined by '-', made unique among ``taken`` (and added to it)."""
    base = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    taken.add(name)
    return name


Entry = tuple[str, str, list[tuple[str, str]]]
"""A section in the contents: its id, its heading (HTML), and (id, heading HTML) of each <h3> in it."""


def page(title: str, sections: list[tuple[str, str]]) -> str:
    """One HTML document of ``sections`` (heading, HTML body), each under an <h2>: what a browser opens offline.
    A page of several sections opens with its contents: a link to each section and to each <h3> in it (ids given
    here), so that a long report is read by its parts."""
    taken: set[str] = {"contents"}
    entries, bodies = [], []
    for heading, html in sections:
        entry, body = _section(heading, html, taken)
        entries.append(entry)
        bodies.append(body)
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{escape(title)}</title>{STYLE}'
        "<style>body{margin:1.5em;max-width:1400px} section{margin-bottom:2.5em} h2{border-bottom:1px solid #ccc}"
        " nav.contents ul{margin:0.2em 0}</style>"
        f"</head><body><h1>{escape(title)}</h1>{contents(entries) if len(sections) > 1 else ''}{''.join(bodies)}</body></html>"
    )


def _section(heading: str, html: str, taken: set[str]) -> tuple[Entry, str]:
    """A section's entry in the contents and its HTML, the section and each of its <h3> given an id."""
    section_id = anchor(heading, taken)
    subsections: list[tuple[str, str]] = []

    def with_id(match: re.Match) -> str:
        # The heading's HTML was escaped by whoever wrote it: its text (tags left out) goes into the contents as is.
        text = _TAG.sub("", match[1])
        sub_id = anchor(f"{section_id} {text}", taken)
        subsections.append((sub_id, text))
        return f"<h3 id='{sub_id}'>{match[1]}</h3>"

    body = _H3.sub(with_id, html)
    return (section_id, escape(heading), subsections), f"<section id='{section_id}'><h2>{escape(heading)}</h2>{body}</section>"


def contents(entries: list[Entry]) -> str:
    """The page's table of contents: (id, heading HTML, [(id, subheading HTML)]) as nested links."""
    items = []
    for section_id, heading, subsections in entries:
        nested = "".join(f"<li><a href='#{sub_id}'>{text}</a></li>" for sub_id, text in subsections)
        items.append(f"<li><a href='#{section_id}'>{heading}</a>" + (f"<ul>{nested}</ul>" if nested else "") + "</li>")
    return f"<nav class='contents' id='contents'><strong>Contents</strong><ol>{''.join(items)}</ol></nav>"
