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
