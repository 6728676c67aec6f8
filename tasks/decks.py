"""HTML for Flyte Decks: small, dependency-free, self-contained (no CDN assets)."""

from __future__ import annotations

from html import escape

STYLE = (
    "<style>body{font-family:sans-serif} table{border-collapse:collapse}"
    " td,th{border:1px solid #ccc;padding:3px 8px;text-align:left} pre{background:#f6f6f6;padding:8px}</style>"
)


def table(rows: dict[str, object], title: str) -> str:
    body = "".join(f"<tr><th>{escape(str(k))}</th><td>{escape(_fmt(v))}</td></tr>" for k, v in rows.items())
    return f"{STYLE}<h3>{escape(title)}</h3><table>{body}</table>"


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def line_chart(values: list[float], title: str, width: int = 640, height: int = 220) -> str:
    """An SVG line chart of one series against its index (step)."""
    if not values:
        return f"<h3>{escape(title)}</h3><p>no data</p>"
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    pad = 30
    n = max(len(values) - 1, 1)
    points = " ".join(
        f"{pad + i * (width - 2 * pad) / n:.1f},{height - pad - (v - lo) * (height - 2 * pad) / span:.1f}"
        for i, v in enumerate(values)
    )
    return (
        f"<h3>{escape(title)}</h3><svg width='{width}' height='{height}' style='border:1px solid #ddd'>"
        f"<polyline fill='none' stroke='#1f77b4' stroke-width='1.5' points='{points}'/>"
        f"<text x='4' y='{pad - 8}' font-size='11'>{hi:.4g}</text>"
        f"<text x='4' y='{height - 8}' font-size='11'>{lo:.4g}</text>"
        f"<text x='{width - pad - 60}' y='{height - 8}' font-size='11'>step {len(values)}</text></svg>"
    )


# Per-step metrics of training/metrics.py charted on the train task's Deck: (record key, title).
TRAINING_CURVES = (
    ("loss", "training loss"),
    ("lr", "learning rate"),
    ("grad_norm", "gradient norm"),
    ("tokens_per_s", "tokens/s"),
    ("mfu", "model FLOPs utilisation"),
)


def training_curves(metrics: list[dict]) -> str:
    """One chart per series; a series missing from the records (older runs, MFU on an unknown GPU) is left out."""
    charts = []
    for key, title in TRAINING_CURVES:
        values = [m[key] for m in metrics if m.get(key) is not None]
        if values:
            charts.append(line_chart(values, title))
    last = metrics[-1] if metrics else {}
    source = last.get("peak_flops_source")
    note = f"<p>MFU against {escape(_fmt(last.get('peak_flops')))} FLOP/s per device ({escape(source)}).</p>" if source else ""
    return "".join(charts) + note


# --- where a step's time goes, and what went wrong ---------------------------------------------
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def stacked_area_chart(
    steps: list[int], series: list[tuple[str, list[float]]], title: str, y_label: str, x_label: str = "step"
) -> str:
    """An SVG stacked area chart: one filled polygon per series, stacked in the given order (first at the
    bottom), a legend naming each, the axes labelled with the range they span."""
    if not steps or not series:
        return f"<h3>{escape(title)}</h3><p>no data</p>"
    width, height, left, right, top, bottom = 720, 260, 56, 170, 12, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    tops = [sum(values[i] for _, values in series) for i in range(len(steps))]
    hi = max(tops) or 1.0
    lo_step, hi_step = steps[0], steps[-1]
    x_span = (hi_step - lo_step) or 1

    def x(i: int) -> float:
        return left + (steps[i] - lo_step) * plot_w / x_span

    def y(v: float) -> float:
        return top + plot_h - v * plot_h / hi

    shapes, legend = [], []
    below = [0.0] * len(steps)
    for n, (label, values) in enumerate(series):
        above = [b + v for b, v in zip(below, values, strict=True)]
        # Along the top edge left to right, back along the bottom edge: one closed area. A single
        # step is drawn as a bar one plot-width wide.
        xs = [x(i) for i in range(len(steps))] if len(steps) > 1 else [left, left + plot_w]
        upper, lower = (above, below) if len(steps) > 1 else (above * 2, below * 2)
        ring = [(xv, y(v)) for xv, v in zip(xs, upper, strict=True)] + [
            (xv, y(v)) for xv, v in zip(reversed(xs), reversed(lower), strict=True)
        ]
        points = " ".join(f"{px:.1f},{py:.1f}" for px, py in ring)
        color = PALETTE[n % len(PALETTE)]
        shapes.append(
            f"<polygon class='area' fill='{color}' fill-opacity='0.85' stroke='none' points='{points}'>"
            f"<title>{escape(label)}</title></polygon>"
        )
        ly = top + 14 + 18 * n
        legend.append(
            f"<rect x='{width - right + 12}' y='{ly - 10}' width='12' height='12' fill='{color}'/>"
            f"<text class='legend' x='{width - right + 30}' y='{ly}' font-size='12'>{escape(label)}</text>"
        )
        below = above
    axes = (
        f"<line x1='{left}' y1='{top + plot_h}' x2='{left + plot_w}' y2='{top + plot_h}' stroke='#333'/>"
        f"<line x1='{left}' y1='{top}' x2='{left}' y2='{top + plot_h}' stroke='#333'/>"
        f"<text x='{left - 4}' y='{top + 10}' font-size='11' text-anchor='end'>{hi:.3g}</text>"
        f"<text x='{left - 4}' y='{top + plot_h}' font-size='11' text-anchor='end'>0</text>"
        f"<text x='{left}' y='{top + plot_h + 14}' font-size='11'>{lo_step}</text>"
        f"<text x='{left + plot_w}' y='{top + plot_h + 14}' font-size='11' text-anchor='end'>{hi_step}</text>"
        f"<text class='x-label' x='{left + plot_w / 2}' y='{height - 6}' font-size='12' text-anchor='middle'>"
        f"{escape(x_label)}</text>"
        f"<text class='y-label' x='14' y='{top + plot_h / 2}' font-size='12' text-anchor='middle' "
        f"transform='rotate(-90 14 {top + plot_h / 2})'>{escape(y_label)}</text>"
    )
    return (
        f"<h3>{escape(title)}</h3><svg width='{width}' height='{height}' style='border:1px solid #ddd'>"
        f"{''.join(shapes)}{axes}{''.join(legend)}</svg>"
    )


def _phase_label(key: str) -> str:
    """'time_forward_backward_s' → 'forward+backward'."""
    return key.removeprefix("time_").removesuffix("_s").replace("forward_backward", "forward+backward").replace("_", " ")


def step_time_breakdown(metrics: list[dict], keys: tuple[str, ...] | list[str]) -> str:
    """The per-step seconds of each phase (``keys``: training.timing.BREAKDOWN_KEYS, passed in so
    that the Decks do not import the training library), stacked: the top edge is the step time.
    Steps without a breakdown (records of older runs) are left out; a missing phase counts 0."""
    timed = [m for m in metrics if any(k in m for k in keys)]
    steps = [int(m["step"]) for m in timed]
    series = [(_phase_label(k), [float(m.get(k) or 0.0) for m in timed]) for k in keys]
    return stacked_area_chart(steps, series, "step time by phase (rank 0)", "seconds per step")


def _batch_text(batch: object) -> str:
    """Which shards a batch's rows came from, briefly (the run's health.jsonl holds every row)."""
    shards = batch.get("shards", []) if isinstance(batch, dict) else []
    if not shards:
        return "unknown"
    parts = [f"{s.get('shard', '?')} ({len(s.get('rows', []))} rows)" for s in shards[:4]]
    return ", ".join(parts) + (f" and {len(shards) - 4} more shards" if len(shards) > 4 else "")


def run_warnings(metrics: list[dict]) -> str:
    """Two tables: the straggler warnings (records with 'straggler_warning') and the loss-health
    events (records with 'health'); each says 'none' when the run had none."""
    stragglers = [m for m in metrics if m.get("straggler_warning")]
    events = [m["health"] for m in metrics if isinstance(m.get("health"), dict)]
    parts = [f"{STYLE}<h3>straggler warnings</h3>"]
    if stragglers:
        rows = "".join(
            f"<tr><td>{escape(str(m.get('step', '')))}</td><td>{escape(str(m.get('slowest_rank', '')))}</td>"
            f"<td>{escape(_fmt(m.get('slowest_ratio', '')))}</td><td>{escape(str(m['straggler_warning']))}</td></tr>"
            for m in stragglers
        )
        parts.append(
            "<table class='stragglers'><tr><th>step</th><th>slowest rank</th><th>× median</th><th>warning</th></tr>"
            f"{rows}</table>"
        )
    else:
        parts.append("<p>none</p>")
    parts.append("<h3>loss health events</h3>")
    if events:
        rows = "".join(
            f"<tr><td>{escape(str(e.get('step', '')))}</td><td>{escape(_fmt(e.get('loss', '')))}</td>"
            f"<td>{escape(str(e.get('action', '')))}</td><td>{escape(str(e.get('problem', '')))}</td>"
            f"<td>{escape(_batch_text(e.get('batch')))}</td></tr>"
            for e in events
        )
        parts.append(
            "<table class='health'><tr><th>step</th><th>loss</th><th>action</th><th>problem</th><th>batch from</th></tr>"
            f"{rows}</table>"
        )
    else:
        parts.append("<p>none</p>")
    return "".join(parts)
