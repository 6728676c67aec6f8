"""What every chart shares: the matplotlib settings, a figure with its labelled axes, and the output (inline
SVG, PNG, a file). The charts themselves are ``reports.charts`` (training runs) and ``reports.data_charts``
(datasets): the data tasks draw theirs without reaching the run charts' code (their cache keys stay clear of it).

matplotlib is imported inside the functions: ``pretrain`` starts without paying for it (about a second). Only
``matplotlib.figure.Figure`` is used, never pyplot: no GUI backend is ever chosen, no global figure state is
kept (PNG goes through the Agg canvas, SVG through matplotlib's SVG writer).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
SIZE = (11.0, 4.2)
"""Inches; 100 dpi in PNG, 72 pt per inch in SVG: about 1,050×400 on screen, the width of a report page
(``reports.deck_html.chart`` scales an inline chart to the page's width: at about its own size, its text
stays the size it was drawn at)."""
DPI = 100
_RC = {
    "svg.fonttype": "none",  # text as <text> elements: searchable, smaller, escaped by the SVG writer
    "font.size": 9,
    "font.sans-serif": ["DejaVu Sans", "Arial", "Helvetica"],  # one short font list on every <text>
    "axes.grid": True,
    "grid.alpha": 0.3,
}


def axes(title: str, x_label: str, y_label: str, size: tuple[float, float] = SIZE) -> tuple[Any, Any]:
    """A figure of one axes with its title and axis labels."""
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context(_RC):  # the grid and font settings are read when the axes are made
        fig = Figure(figsize=size, dpi=DPI, layout="constrained")
        ax = fig.add_subplot()
    ax.set_title(text(title))
    ax.set_xlabel(text(x_label))
    ax.set_ylabel(text(y_label))
    return fig, ax


def twin(ax: Any) -> Any:
    """A second y axis on the right of ``ax``, sharing its x (the step), in the same font, without a grid of its
    own (it would not line up with ``ax``'s)."""
    import matplotlib

    with matplotlib.rc_context(_RC):  # tick label sizes are read when the axes are made
        other = ax.twinx()
    other.grid(False)
    return other


def integer_steps(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def text(value: str) -> str:
    """Shown as written: a '$' would start matplotlib's math mode (and fail on an unpaired one), and the
    legend hides labels that start with '_'."""
    value = str(value).replace("$", r"\$")
    return f" {value}" if value.startswith("_") else value


# -- output -----------------------------------------------------------------------------------------
def svg(fig: Any) -> str:
    """The figure as an ``<svg>`` element to inline in HTML (without the XML prolog and doctype)."""
    out = _render(fig, "svg").decode()
    return out[out.index("<svg") :]


def png(fig: Any) -> bytes:
    return _render(fig, "png")


def save(fig: Any, path: Path) -> Path:
    """Write the figure to ``path``; the suffix picks the format (.png, .svg, .pdf)."""
    fmt = path.suffix.lstrip(".").lower() or "png"
    data = _render(fig, fmt)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _render(fig: Any, fmt: str) -> bytes:
    import matplotlib

    out = io.BytesIO()
    with matplotlib.rc_context(_RC):
        # No creation date or software version in the file: the same data gives the same picture. SVG: no RDF
        # block either (its creator names matplotlib's web address: a page inlining the chart references no URL).
        metadata = {"svg": dict.fromkeys(("Date", "Creator", "Format", "Type")), "pdf": {"Date": None}}
        fig.savefig(out, format=fmt, dpi=DPI, bbox_inches="tight", metadata=metadata.get(fmt, {"Software": None}))
    return out.getvalue()
