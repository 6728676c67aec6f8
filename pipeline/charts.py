"""Charts of training runs drawn with matplotlib: the loss (raw, smoothed, validation points) of one run or
several, one metric against the step, and the step time stacked by phase.

Used by ``pretrain runs compare`` (PNG/SVG files) and by the Flyte Decks (``tasks.run_decks``: SVG inlined in
HTML), so it knows nothing of Flyte. matplotlib is imported inside the functions: ``pretrain`` starts
without paying for it (about a second), and the slim data image, whose Decks draw no chart, needs no
matplotlib. Only ``matplotlib.figure.Figure`` is used, never pyplot: no GUI backend is ever chosen, no
global figure state is kept (PNG goes through the Agg canvas, SVG through matplotlib's SVG writer).

Every drawn series carries an SVG id (matplotlib's ``gid``) naming what it is, so that a test, or a person
reading the SVG, can find it: ``raw-<i>``, ``smooth-<i>``, ``validation-<i>`` for run ``i``'s loss,
``series`` for a single metric, ``area-<i>`` for phase ``i`` of a stacked chart.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SMOOTHING_FRACTION = 0.05
"""The moving average spans this fraction of a run's steps (at least ``MIN_WINDOW``, odd)."""
MIN_WINDOW = 3
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
RAW_ALPHA = 0.3
"""The raw curve is drawn faint beside its smoothed curve: visible noise, readable trend."""
SIZE = (7.5, 3.6)
"""Inches; 100 dpi in PNG, 72 pt per inch in SVG: about 750×360 on screen."""
DPI = 100
_RC = {
    "svg.fonttype": "none",  # text as <text> elements: searchable, smaller, escaped by the SVG writer
    "font.size": 9,
    "font.sans-serif": ["DejaVu Sans", "Arial", "Helvetica"],  # one short font list on every <text>
    "axes.grid": True,
    "grid.alpha": 0.3,
}


@dataclass
class Curve:
    """One run's loss for a chart: its steps, their losses, and its evaluations' (step, val_loss)."""

    label: str
    steps: list[int]
    loss: list[float]
    validation: list[tuple[int, float]] = field(default_factory=list)


# -- smoothing --------------------------------------------------------------------------------------
def window_for(n: int) -> int:
    """The moving average's width for a run of ``n`` steps: ~5% of them, odd (so it is centered), ≥ 3."""
    width = max(MIN_WINDOW, round(n * SMOOTHING_FRACTION))
    return width if width % 2 else width + 1


def smooth(values: list[float], width: int | None = None) -> list[float]:
    """A centered moving average: each point is the mean of the ``width`` points around it (fewer at the
    ends, where the window is cut to the points that exist). Centered rather than an exponential moving
    average because an EMA lags the curve by about its span, which shifts a run's trend to later steps
    and would make two runs compared side by side look further apart than they are. Non-finite losses
    (a skipped step's NaN) are left out of every window."""
    width = width or window_for(len(values))
    half = width // 2
    out = []
    for i in range(len(values)):
        window = [v for v in values[max(0, i - half) : i + half + 1] if math.isfinite(v)]
        out.append(sum(window) / len(window) if window else math.nan)
    return out


# -- charts -----------------------------------------------------------------------------------------
def loss_figure(curves: list[Curve], title: str = "training loss") -> Any:
    """One or more runs' loss on one axes: each run in its color, raw faint, smoothed solid, its
    validation losses as markers at their steps; a legend names the runs and the three kinds of line."""
    from matplotlib.lines import Line2D

    fig, ax = _axes(title, "step", "loss")
    widths = set()
    for i, curve in enumerate(curves):
        color = COLORS[i % len(COLORS)]
        width = window_for(len(curve.loss))
        widths.add(width)
        ax.plot(curve.steps, curve.loss, color=color, alpha=RAW_ALPHA, linewidth=1.0, gid=f"raw-{i}")
        ax.plot(curve.steps, smooth(curve.loss, width), color=color, linewidth=1.8, gid=f"smooth-{i}", label=_text(curve.label))
        if curve.validation:
            steps, values = zip(*curve.validation, strict=True)
            ax.plot(
                steps,
                values,
                linestyle="none",
                marker="o",
                markersize=6,
                color=color,
                markeredgecolor="black",
                gid=f"validation-{i}",
            )
    window = "/".join(str(w) for w in sorted(widths))
    kinds = [
        Line2D([], [], color="gray", alpha=RAW_ALPHA, label="raw (each step)"),
        Line2D([], [], color="gray", linewidth=1.8, label=f"centered moving average ({window} steps)"),
    ]
    if any(c.validation for c in curves):
        kinds.append(Line2D([], [], color="gray", linestyle="none", marker="o", markeredgecolor="black", label="validation loss"))
    handles = ax.get_legend_handles_labels()[0] + kinds
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    _integer_steps(ax)
    return fig


def series_figure(steps: list[int], values: list[float], title: str, y_label: str) -> Any:
    """One metric against the step."""
    fig, ax = _axes(title, "step", y_label)
    ax.plot(steps, values, color=COLORS[0], linewidth=1.2, gid="series")
    _integer_steps(ax)
    return fig


def stacked_figure(
    steps: list[int], series: list[tuple[str, list[float]]], title: str, y_label: str, x_label: str = "step"
) -> Any:
    """Series stacked as filled areas, the first at the bottom (the top edge is their sum), with a legend.
    A single step is drawn as a band one step wide, so that it is seen."""
    fig, ax = _axes(title, x_label, y_label)
    xs = list(steps) if len(steps) > 1 else [steps[0] - 0.5, steps[0] + 0.5]
    below = [0.0] * len(xs)
    for i, (label, values) in enumerate(series):
        values = list(values) if len(steps) > 1 else list(values) * 2
        above = [b + v for b, v in zip(below, values, strict=True)]
        ax.fill_between(
            xs, below, above, color=COLORS[i % len(COLORS)], alpha=0.85, linewidth=0, label=_text(label), gid=f"area-{i}"
        )
        below = above
    ax.set_xlim(xs[0], xs[-1])
    ax.set_ylim(bottom=0)
    _clip_outliers(ax, steps, below[: len(steps)])
    handles, labels = ax.get_legend_handles_labels()  # listed top of the stack first, as the areas lie
    ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    _integer_steps(ax)
    return fig


OUTLIER_FACTOR = 5.0
"""A stacked chart's y axis stops at 1.5× the 95th percentile of the totals when a few steps (a checkpoint
save, the first step's warm-up) exceed it this many times over: otherwise they flatten every other step."""


def _clip_outliers(ax: Any, steps: list[int], totals: list[float]) -> None:
    if len(totals) < 20:
        return
    usual = sorted(totals)[int(0.95 * (len(totals) - 1))]
    if usual <= 0 or max(totals) <= OUTLIER_FACTOR * usual:
        return
    ax.set_ylim(0, 1.5 * usual)
    over = sorted(((t, s) for s, t in zip(steps, totals, strict=True) if t > 1.5 * usual), reverse=True)
    shown = ", ".join(f"step {s}: {t:.3g}" for t, s in over[:3]) + (f" and {len(over) - 3} more" if len(over) > 3 else "")
    ax.text(0.99, 0.97, f"off the chart: {shown}", transform=ax.transAxes, ha="right", va="top", fontsize=8, gid="clipped")


# -- output -----------------------------------------------------------------------------------------
def svg(fig: Any) -> str:
    """The figure as an ``<svg>`` element to inline in HTML (without the XML prolog and doctype)."""
    text = _render(fig, "svg").decode()
    return text[text.index("<svg") :]


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
        # No creation date or software version in the file: the same data gives the same picture.
        metadata = {"Date": None} if fmt in ("svg", "pdf") else {"Software": None}
        fig.savefig(out, format=fmt, dpi=DPI, bbox_inches="tight", metadata=metadata)
    return out.getvalue()


def _axes(title: str, x_label: str, y_label: str) -> tuple[Any, Any]:
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context(_RC):  # the grid and font settings are read when the axes are made
        fig = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
        ax = fig.add_subplot()
    ax.set_title(_text(title))
    ax.set_xlabel(_text(x_label))
    ax.set_ylabel(_text(y_label))
    return fig, ax


def _integer_steps(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _text(text: str) -> str:
    """Shown as written: a '$' would start matplotlib's math mode (and fail on an unpaired one), and the
    legend hides labels that start with '_'."""
    text = str(text).replace("$", r"\$")
    return f" {text}" if text.startswith("_") else text
