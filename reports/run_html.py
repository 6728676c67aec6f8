"""A training run as HTML, rendered from its view (``runs.view.RunView``, read once from the store): its curves
(loss with its held-out and evaluation points and the learning rate beside it, and the other per-step series), where its
wall time goes (the goodput ledger's bar) and its step time (the phase table and every rank, as ``pretrain runs
show`` prints them, and charts), its warnings; and runs side by side.

The train task's Decks (``tasks.train``), the last task's Comparison Deck and ``pretrain runs report``
(``reports.run_report``) are all made here, so they show the same thing. No Flyte, no torch.
"""

from __future__ import annotations

from html import escape

from common.settings import value_text
from reports import charts
from reports.deck_html import STYLE, chart, fmt, grid, num
from reports.run_text import figure_rows
from runs.catalog import SHORT_ID, compare
from runs.ledger import Goodput
from runs.view import RunView

TRAIN_DECKS = ("Training curves", "Step time", "Warnings")
"""The sections of one run, in order: the train task's Decks, the start of ``pretrain runs report``."""


def run_sections(view: RunView, figures: charts.RunCharts) -> dict[str, str]:
    """The HTML of each of ``TRAIN_DECKS`` for one run: its curves (the loss chart's held-out points, those the
    training measured every ``train.val_every`` steps, and its committed evaluations' val_loss apart), the goodput ledger's bar
    heading its step time, and its warnings. ``figures``: the run's charts (``charts.run_charts``)."""
    return {
        "Training curves": training_curves(view, figures),
        "Step time": goodput_bar(view.goodput, figures) + step_time(view, figures),
        "Warnings": run_warnings(view),
    }


# --- the curves ----------------------------------------------------------------------------------
def training_curves(view: RunView, figures: charts.RunCharts) -> str:
    """The loss (raw, smoothed, the held-out and the evaluation points) with the learning rate on a second y axis, then one chart
    per other series; a series missing from the records (older runs, MFU on an unknown GPU) is left out (the loss
    chart then has no second axis), as are skipped steps' losses (they may be NaN; their learning rate is drawn)."""
    parts = [chart(fig) for fig in ([figures.loss] if figures.loss is not None else []) + figures.series]
    source = view.peak_flops_source
    note = f"<p>MFU against {escape(fmt(view.peak_flops))} FLOP/s per device ({escape(source)}).</p>" if source else ""
    return "".join(parts) + note if parts else "<h3>training curves</h3><p>no data</p>"


# --- where the wall time goes -------------------------------------------------------------------
def goodput_bar(goodput: Goodput | None, figures: charts.RunCharts) -> str:
    """The run's wall time as one bar stacked by part (``runs.ledger.PARTS``: productive steps, start-up,
    compiling, checkpoint restore and save, data waits, evaluation, wasted progress, infrastructure recovery,
    other), its legend in seconds, under the productive fraction and the attempts, then the clock skew's
    warnings; a run without a ledger says so."""
    if goodput is None:
        return f"{STYLE}<h3>goodput</h3><p>not recorded (a run from before the goodput ledger)</p>"
    attempts = f"{goodput.attempts} attempt" + ("" if goodput.attempts == 1 else "s")
    warnings = "".join(f"<p>WARNING: {escape(line)}</p>" for line in goodput.warnings)
    return (
        f"{STYLE}<h3>goodput</h3><p>{escape(num(goodput.fraction, '.1%'))} of {escape(num(goodput.wall_s, ',.1f'))} s "
        f"wall time in productive steps, over {escape(attempts)} (first start to last update)</p>"
        + chart(figures.goodput)
        + warnings
    )


# --- where a step's time goes --------------------------------------------------------------------
def step_time(view: RunView, figures: charts.RunCharts) -> str:
    """Rank 0's step time per phase (the view's ``breakdown``: median seconds, total and share of the run, the
    table ``pretrain runs show`` prints) and its phases step by step; then every rank (``ranks``, over
    ``step_times.jsonl``, which the straggler exchange gathers from all ranks): a row per rank and each rank's
    step time step by step."""
    parts = [STYLE, _phase_table(view.breakdown), chart(figures.phases) if figures.phases is not None else ""]
    parts += [_rank_table(view.ranks), chart(figures.ranks) if figures.ranks is not None else ""]
    return "".join(parts)


def _phase_table(breakdown: dict) -> str:
    if not breakdown["phases"]:
        return "<h3>step time by phase (rank 0)</h3><p>no data</p>"
    rows = [
        [charts.phase_label(r["phase"]), num(r["median_s"], ".4f"), num(r["total_s"], ".3f"), num(r["share"], ".1%")]
        for r in breakdown["phases"]
    ]
    return (
        f"<h3>step time by phase (rank 0)</h3><p>median step {escape(num(breakdown['median_step_s'], '.4f'))} s; "
        f"{breakdown['steps']} steps, checkpoint saves included, took {escape(num(breakdown['wall_s'], '.2f'))} s</p>"
        + grid(["phase", "median s", "total s", "share"], rows, "phases")
    )


def _rank_table(ranks: dict) -> str:
    if not ranks["ranks"]:
        return "<h3>ranks</h3><p>no step times exchanged (train.straggler_every: 0, or no exchange step reached)</p>"
    phases = list(ranks["ranks"][0]["median_s"])
    header = ["rank", "steps", "median step s", *(f"median {charts.phase_label(p)} s" for p in phases), "busy s (all steps)"]
    rows = [
        [str(r["rank"]), str(r["steps"]), num(r["median_step_s"], ".4f")]
        + [num(r["median_s"].get(p), ".4f") for p in phases]
        + [num(r["busy_s"], ".3f")]
        for r in ranks["ranks"]
    ]
    slowest = (
        f"<p>slowest rank {escape(str(ranks['slowest_rank']))}: busy {escape(num(ranks['slowest_ratio'], '.2f'))}× "
        "the median of the others' (busy = step minus collective waits)</p>"
    )
    return f"<h3>ranks ({ranks['steps']} steps exchanged)</h3>" + grid(header, rows, "ranks") + slowest


# --- what went wrong -----------------------------------------------------------------------------
def _batch_text(batch: object) -> str:
    """Which shards a batch's rows came from, briefly (the run's health.jsonl holds every row)."""
    shards = batch.get("shards", []) if isinstance(batch, dict) else []
    if not shards:
        return "unknown"
    parts = [f"{s.get('shard', '?')} ({len(s.get('rows', []))} rows)" for s in shards[:4]]
    return ", ".join(parts) + (f" and {len(shards) - 4} more shards" if len(shards) > 4 else "")


def run_warnings(view: RunView) -> str:
    """Two tables: the straggler warnings (records with 'straggler_warning') and the loss-health
    events (the run's health.jsonl); each says 'none' when the run had none."""
    stragglers = [m for m in view.metrics if m.get("straggler_warning")]
    events = [e for e in view.health if isinstance(e, dict)]
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


# --- several training runs side by side ----------------------------------------------------------
def run_comparison(views: list[RunView], labels: list[str]) -> str:
    """The comparison ``pretrain runs compare`` prints, as HTML: the config keys that differ (one row each,
    the runs side by side), the figures of each run (final train loss, the latest evaluation's validation
    loss, bits per byte and perplexity, median tokens/s and MFU) and their loss curves on one chart (raw,
    smoothed over one window, held-out and evaluation points). ``labels``: the column name of each run (e.g. 'this
    execution', 'production v3')."""
    if len(views) != len(labels):
        raise ValueError(f"run_comparison: {len(views)} runs but {len(labels)} labels")
    compared = compare(views)
    names = [f"{label} ({view.id[:SHORT_ID]})" for label, view in zip(labels, views, strict=True)]
    header = "<tr><th></th>" + "".join(f"<th>{escape(n)}</th>" for n in names) + "</tr>"
    if compared["differences"]:
        rows = "".join(
            f"<tr><th>{escape(d['key'])}</th>" + "".join(f"<td>{escape(value_text(v))}</td>" for v in d["values"]) + "</tr>"
            for d in compared["differences"]
        )
        config = f"<table class='differences'>{header}{rows}</table>"
    else:
        config = f"<p>no differences in the {compared['keys_compared']} settings compared</p>"
    rows = "".join(
        f"<tr><th>{escape(name)}</th>" + "".join(f"<td>{escape(v)}</td>" for v in values) + "</tr>"
        for name, values in figure_rows(compared["runs"])
    )
    curves = [charts.Curve.of(label, v.loss) for label, v in zip(labels, views, strict=True)]
    links = "".join(f"<li>{escape(n)}: {escape(view.uri)}</li>" for n, view in zip(names, views, strict=True))
    return (
        f"{STYLE}<h3>runs</h3><ul>{links}</ul>"
        f"<h3>config differences</h3>{config}"
        f"<h3>figures</h3><table class='figures'>{header}{rows}</table>"
        f"<h3>loss</h3>{chart(charts.loss_figure(curves, 'training loss by run'))}"
    )
