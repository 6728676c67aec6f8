"""Charts of a dataset: horizontal bars (documents read, kept and skipped by reason) and a histogram (the kept
documents' lengths), for the prepare task's Dataset Deck and ``pretrain runs report`` (``reports.dataset_html``).

Every drawn series carries an SVG id (matplotlib's ``gid``) so that a test, or a person reading the SVG, can
find it: ``bar-<i>`` for bar ``i``, ``hist`` and ``median`` for a histogram.
"""

from __future__ import annotations

import math
from typing import Any

from reports.plotting import COLORS, SIZE, axes, text


def bars_figure(labels: list[str], values: list[float], title: str, x_label: str) -> Any:
    """Horizontal bars, the first label at the top, each bar's value written at its end; bar ``i`` is drawn
    with the SVG id ``bar-<i>``. The figure grows with the number of bars."""
    fig, ax = axes(title, x_label, "", size=(SIZE[0], max(1.6, 0.9 + 0.3 * len(labels))))
    rows = list(range(len(labels)))
    bars = ax.barh(rows, values, color=COLORS[0], height=0.6)
    for i, bar in enumerate(bars):
        bar.set_gid(f"bar-{i}")
    ax.bar_label(bars, labels=[f"{v:,.0f}" if float(v).is_integer() else f"{v:,.3g}" for v in values], padding=3, fontsize=8)
    ax.set_yticks(rows, [text(label) for label in labels])
    ax.invert_yaxis()  # the first label on top, as a table reads
    ax.set_xlim(0, max([*values, 1]) * 1.15)  # room for the value written after the longest bar
    ax.grid(axis="y", visible=False)
    return fig


def histogram_figure(values: list[float], title: str, x_label: str, y_label: str = "count", bins: int = 40) -> Any:
    """How ``values`` are distributed: counts over bins (SVG id ``hist``) and a dashed line at the median
    (``median``). Values spanning more than two orders of magnitude (document lengths) get logarithmic bins
    and x axis, so that the many short ones and the few long ones both show."""
    import numpy as np

    fig, ax = axes(title, x_label, y_label)
    data = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    if data.size:
        low, high = float(data.min()), float(data.max())
        log = low > 0 and high / low > 100
        edges = np.geomspace(low, high, bins + 1) if log else np.linspace(low, high if high > low else low + 1, bins + 1)
        counts, edges = np.histogram(data, edges)
        ax.stairs(counts, edges, fill=True, color=COLORS[0], alpha=0.85, gid="hist")
        median = float(np.median(data))
        ax.axvline(median, color="black", linestyle="--", linewidth=1, label=f"median {median:,.0f}", gid="median")
        ax.legend(loc="upper right", fontsize=8, frameon=False)
        if log:
            from matplotlib.ticker import FuncFormatter

            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    return fig
