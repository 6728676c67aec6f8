"""Decks of a training run: its curves, step-time breakdown and warnings (the train task), and runs
side by side (the last task's Comparison Deck). Charts are matplotlib SVG inlined (``pipeline.charts``,
which imports matplotlib only when a chart is drawn)."""

from __future__ import annotations

from html import escape

from pipeline import charts
from storage import Store
from tasks.decks import STYLE, fmt
from training.runs import catalog as training_runs


def chart(fig: object) -> str:
    """A matplotlib figure inlined as SVG (``pipeline.charts``: labelled axes, legend)."""
    return f"<div class='chart'>{charts.svg(fig)}</div>"


# Per-step metrics of training/observe/metrics.py charted on the train task's Deck besides the loss: (record key, title, y label).
TRAINING_CURVES = (
    ("lr", "learning rate", "learning rate"),
    ("grad_norm", "gradient norm", "gradient norm (before clipping)"),
    ("tokens_per_s", "tokens/s", "tokens per second"),
    ("mfu", "model FLOPs utilisation", "MFU"),
)


def training_curves(metrics: list[dict], validation: list[tuple[int, float]] | None = None) -> str:
    """The loss (raw, smoothed, and ``validation`` (step, val_loss) points when given), then one chart per
    other series; a series missing from the records (older runs, MFU on an unknown GPU) is left out, as are
    skipped steps' losses (they may be NaN)."""
    parts = []
    losses = [m for m in metrics if "skipped" not in m and isinstance(m.get("loss"), (int, float))]
    if losses:
        curve = charts.Curve("loss", [int(m["step"]) for m in losses], [float(m["loss"]) for m in losses], list(validation or []))
        parts.append(chart(charts.loss_figure([curve])))
    for key, title, y_label in TRAINING_CURVES:
        points = [m for m in metrics if isinstance(m.get(key), (int, float))]
        if points:
            parts.append(
                chart(charts.series_figure([int(m["step"]) for m in points], [float(m[key]) for m in points], title, y_label))
            )
    last = metrics[-1] if metrics else {}
    source = last.get("peak_flops_source")
    note = f"<p>MFU against {escape(fmt(last.get('peak_flops')))} FLOP/s per device ({escape(source)}).</p>" if source else ""
    return "".join(parts) + note if parts else "<h3>training curves</h3><p>no data</p>"


# --- where a step's time goes, and what went wrong ---------------------------------------------
def stacked_area_chart(
    steps: list[int], series: list[tuple[str, list[float]]], title: str, y_label: str, x_label: str = "step"
) -> str:
    """A stacked area chart (first series at the bottom, the top edge their sum) with a legend and axis labels."""
    if not steps or not series:
        return f"<h3>{escape(title)}</h3><p>no data</p>"
    return chart(charts.stacked_figure(steps, series, title, y_label, x_label))


def _phase_label(key: str) -> str:
    """'time_forward_backward_s' → 'forward+backward'."""
    return key.removeprefix("time_").removesuffix("_s").replace("forward_backward", "forward+backward").replace("_", " ")


def step_time_breakdown(metrics: list[dict], keys: tuple[str, ...] | list[str]) -> str:
    """The per-step seconds of each phase (``keys``: training.observe.timing.BREAKDOWN_KEYS, passed in so
    that the Decks do not import the training loop), stacked: the top edge is the step time.
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
            f"<td>{escape(fmt(m.get('slowest_ratio', '')))}</td><td>{escape(str(m['straggler_warning']))}</td></tr>"
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
            f"<tr><td>{escape(str(e.get('step', '')))}</td><td>{escape(fmt(e.get('loss', '')))}</td>"
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


# --- several training runs side by side ------------------------------------------------------------
def run_comparison(store: Store, runs: list[str], labels: list[str]) -> str:
    """The comparison ``pretrain runs compare`` prints, as HTML: the config keys that differ (one row each,
    the runs side by side), the figures of each run (final train loss, the latest evaluation's validation
    loss, bits per byte and perplexity, median tokens/s and MFU) and their loss curves on one chart (raw,
    smoothed, validation points). ``runs``: run ids, ``runs/<id>`` prefixes or unique id prefixes in
    ``store``; ``labels``: the column name of each (e.g. 'this execution', 'production v3')."""
    if len(runs) != len(labels):
        raise ValueError(f"run_comparison: {len(runs)} runs but {len(labels)} labels")
    compared = training_runs.compare(store, runs)
    names = [f"{label} ({run['id'][: training_runs.SHORT_ID]})" for label, run in zip(labels, compared["runs"], strict=True)]
    header = "<tr><th></th>" + "".join(f"<th>{escape(n)}</th>" for n in names) + "</tr>"
    if compared["differences"]:
        rows = "".join(
            f"<tr><th>{escape(d['key'])}</th>"
            + "".join(f"<td>{escape(training_runs.value_text(v))}</td>" for v in d["values"])
            + "</tr>"
            for d in compared["differences"]
        )
        config = f"<table class='differences'>{header}{rows}</table>"
    else:
        config = f"<p>no differences in the {compared['keys_compared']} settings compared</p>"
    rows = "".join(
        f"<tr><th>{escape(name)}</th>" + "".join(f"<td>{escape(v)}</td>" for v in values) + "</tr>"
        for name, values in training_runs.figure_rows(compared["runs"])
    )
    curves = []
    for label, run in zip(labels, compared["runs"], strict=True):
        history = training_runs.loss_history(store, run["id"])
        curves.append(charts.Curve(label, history["steps"], history["loss"], history["validation"]))
    links = "".join(f"<li>{escape(n)}: {escape(run['uri'])}</li>" for n, run in zip(names, compared["runs"], strict=True))
    return (
        f"{STYLE}<h3>runs</h3><ul>{links}</ul>"
        f"<h3>config differences</h3>{config}"
        f"<h3>figures</h3><table class='figures'>{header}{rows}</table>"
        f"<h3>loss</h3>{chart(charts.loss_figure(curves, 'training loss by run'))}"
    )
