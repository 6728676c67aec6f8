"""A training run as HTML, read from its files in the store: its curves (loss with its validation points, and
the other per-step series), where its wall time goes (the goodput ledger's bar) and its step time (the phase table
and every rank, as ``pretrain runs show`` prints them, and charts), its warnings; and runs side by side.

The train task's Decks (``tasks.train``), the last task's Comparison Deck and ``pretrain runs report``
(``pipeline.run_report``) are all made here, so they show the same thing. No Flyte, no torch.
"""

from __future__ import annotations

import math
import statistics
from html import escape

from common.contracts import metrics_key, run_prefix, step_times_key
from pipeline import charts
from pipeline.deck_html import STYLE, chart, fmt, grid, num
from storage import Store
from training.runs import catalog as training_runs
from training.runs.goodput import PARTS as GOODPUT_PARTS
from training.runs.goodput import Goodput, load_goodput
from training.runs.runlog import read_jsonl

# Per-step metrics of training/observe/metrics.py charted besides the loss: (record key, title, y label, scale).
# MFU is recorded as a fraction and shown in percent, as people quote it.
TRAINING_CURVES = (
    ("lr", "learning rate", "learning rate", 1.0),
    ("grad_norm", "gradient norm", "gradient norm (before clipping)", 1.0),
    ("tokens_per_s", "tokens/s", "tokens per second", 1.0),
    ("mfu", "model FLOPs utilisation", "MFU (%)", 100.0),
)

TRAIN_DECKS = ("Training curves", "Step time", "Warnings")
"""The sections of one run, in order: the train task's Decks, the start of ``pretrain runs report``."""


def run_sections(store: Store, run_id: str) -> dict[str, str]:
    """The HTML of each of ``TRAIN_DECKS`` for the run ``run_id`` (its id, not a prefix), from its files: the
    per-step records, every rank's step times, the loss chart's validation points: those the training
    measured (``train.val_every``) and those of its committed evaluations (``catalog.loss_history``), and the
    goodput ledger (its bar heads the step time's section)."""
    run = run_prefix(run_id)
    metrics = read_jsonl(store, metrics_key(run))
    validation = training_runs.loss_history(store, run_id, metrics)["validation"]
    return {
        "Training curves": training_curves(metrics, validation),
        "Step time": goodput_bar(load_goodput(store, run)) + step_time(metrics, read_jsonl(store, step_times_key(run))),
        "Warnings": run_warnings(metrics),
    }


# --- the curves ----------------------------------------------------------------------------------
def training_curves(metrics: list[dict], validation: list[tuple[int, float]] | None = None) -> str:
    """The loss (raw, smoothed, and ``validation`` (step, val_loss) points when given), then one chart per
    other series; a series missing from the records (older runs, MFU on an unknown GPU) is left out, as are
    skipped steps' losses (they may be NaN)."""
    parts = []
    losses = [m for m in metrics if "skipped" not in m and isinstance(m.get("loss"), (int, float))]
    if losses:
        curve = charts.Curve("loss", [int(m["step"]) for m in losses], [float(m["loss"]) for m in losses], list(validation or []))
        parts.append(chart(charts.loss_figure([curve])))
    for key, title, y_label, scale in TRAINING_CURVES:
        points = [m for m in metrics if isinstance(m.get(key), (int, float))]
        if points:
            steps, values = [int(m["step"]) for m in points], [float(m[key]) * scale for m in points]
            parts.append(chart(charts.series_figure(steps, values, title, y_label)))
    last = metrics[-1] if metrics else {}
    source = last.get("peak_flops_source")
    note = f"<p>MFU against {escape(fmt(last.get('peak_flops')))} FLOP/s per device ({escape(source)}).</p>" if source else ""
    return "".join(parts) + note if parts else "<h3>training curves</h3><p>no data</p>"


# --- where the wall time goes -------------------------------------------------------------------
def goodput_bar(goodput: Goodput | None) -> str:
    """The run's wall time as one bar stacked by part (``training.runs.goodput``: productive steps, start-up, data
    waits, checkpoint stalls, evaluation, shutdown, restarts, re-trained steps), its legend in seconds, under the
    productive fraction and the attempts; a run without a ledger says so."""
    if goodput is None:
        return f"{STYLE}<h3>goodput</h3><p>not recorded (a run from before the goodput ledger)</p>"
    parts = [(part, goodput.parts[part]) for part in GOODPUT_PARTS]
    attempts = f"{goodput.attempts} attempt" + ("" if goodput.attempts == 1 else "s")
    return (
        f"{STYLE}<h3>goodput</h3><p>{escape(num(goodput.fraction, '.1%'))} of {escape(num(goodput.wall_s, ',.1f'))} s "
        f"wall time in productive steps, over {escape(attempts)} (first start to last update)</p>"
        + chart(charts.goodput_figure(parts, goodput.wall_s))
    )


# --- where a step's time goes --------------------------------------------------------------------
def _phase_label(phase: str) -> str:
    """'forward_backward' → 'forward+backward'."""
    return phase.replace("forward_backward", "forward+backward").replace("_", " ")


def step_time(metrics: list[dict], step_times: list[dict]) -> str:
    """Rank 0's step time per phase (``training_runs.breakdown``: median seconds, total and share of the
    run, the table ``pretrain runs show`` prints) and its phases step by step; then every rank
    (``training_runs.ranks`` over ``step_times.jsonl``, which the straggler exchange gathers from all
    ranks): a row per rank and each rank's step time step by step."""
    ranks = training_runs.ranks(step_times)
    parts = [STYLE, _phase_table(training_runs.breakdown(metrics)), _phase_chart(metrics)]
    parts += [_rank_table(ranks), _rank_chart(step_times, ranks)]
    return "".join(parts)


def _phase_table(breakdown: dict) -> str:
    if not breakdown["phases"]:
        return "<h3>step time by phase (rank 0)</h3><p>no data</p>"
    rows = [
        [_phase_label(r["phase"]), num(r["median_s"], ".4f"), num(r["total_s"], ".3f"), num(r["share"], ".1%")]
        for r in breakdown["phases"]
    ]
    return (
        f"<h3>step time by phase (rank 0)</h3><p>median step {escape(num(breakdown['median_step_s'], '.4f'))} s; "
        f"{breakdown['steps']} steps, checkpoint saves included, took {escape(num(breakdown['wall_s'], '.2f'))} s</p>"
        + grid(["phase", "median s", "total s", "share"], rows, "phases")
    )


MOST_POINTS = 1000
"""A step-time chart draws at most this many points a line: a longer run's steps are taken in windows, each
drawn at its last step as the window's median (every step of a 100k-step run would make megabytes of SVG)."""
MOST_RANK_LINES = 8
"""Beyond this many ranks the rank chart draws the median of the ranks and the slowest and fastest rank (by
busy time, as the straggler exchange judges) instead of a line each; the table lists every rank."""


def thin(steps: list[int], series: list[tuple[str, list[float]]]) -> tuple[list[int], list[tuple[str, list[float]]]]:
    """At most ``MOST_POINTS`` steps: the median of each window of steps (non-finite values left out)."""
    if len(steps) <= MOST_POINTS:
        return steps, series
    width = math.ceil(len(steps) / MOST_POINTS)
    starts = range(0, len(steps), width)

    def median(values: list[float]) -> float:
        finite = [v for v in values if math.isfinite(v)]
        return statistics.median(finite) if finite else math.nan

    thinned = [(label, [median(values[i : i + width]) for i in starts]) for label, values in series]
    return [steps[min(i + width, len(steps)) - 1] for i in starts], thinned


def _phase_chart(metrics: list[dict]) -> str:
    """One line per phase on a logarithmic axis: forward+backward is ten to a hundred times the data wait or
    the optimizer step, so a stack (or a linear axis) gives it the whole height and flattens the phases one
    looks at to find a slow loader or collective; on a log axis each phase's own trend shows, and a rare slow
    step (the first, a checkpoint save) needs no clipping."""
    timed = [m for m in metrics if "step_time_s" in m]
    phases = training_runs.phases_of(timed)
    if not phases:
        return ""
    steps = [int(m["step"]) for m in timed]
    series = [(_phase_label(p), [float(m.get(f"time_{p}_s") or 0.0) for m in timed]) for p in phases]
    steps, series = thin(steps, series)
    return chart(charts.lines_figure(steps, series, "step time by phase (rank 0)", "seconds (log scale)", log=True))


def _rank_table(ranks: dict) -> str:
    if not ranks["ranks"]:
        return "<h3>ranks</h3><p>no step times exchanged (train.straggler_every: 0, or no exchange step reached)</p>"
    phases = list(ranks["ranks"][0]["median_s"])
    header = ["rank", "steps", "median step s", *(f"median {_phase_label(p)} s" for p in phases), "busy s (all steps)"]
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


def _rank_chart(step_times: list[dict], ranks: dict) -> str:
    """Each rank's step time at the steps the exchanges gathered (``ranks``: ``training_runs.ranks`` of them): a
    straggler is the line above the others. Many ranks: their median, the slowest and the fastest."""
    if not ranks["ranks"]:
        return ""
    steps = sorted({int(line["step"]) for line in step_times})
    seconds = {(int(line["step"]), int(line["rank"])): float(line["step_s"]) for line in step_times}

    def line(rank: int) -> list[float]:
        return [seconds.get((s, rank), math.nan) for s in steps]

    numbers = [r["rank"] for r in ranks["ranks"]]
    if len(numbers) <= MOST_RANK_LINES:
        series = [(f"rank {r}", line(r)) for r in numbers]
    else:
        by_busy = sorted(ranks["ranks"], key=lambda r: r["busy_s"])
        slowest, fastest = by_busy[-1]["rank"], by_busy[0]["rank"]
        everyone = [[seconds[(s, r)] for r in numbers if (s, r) in seconds] for s in steps]
        series = [
            (f"median of the {len(numbers)} ranks", [statistics.median(v) if v else math.nan for v in everyone]),
            (f"slowest: rank {slowest}", line(slowest)),
            (f"fastest: rank {fastest}", line(fastest)),
        ]
    steps, series = thin(steps, series)
    return chart(charts.lines_figure(steps, series, "step time by rank", "seconds per step"))


# --- what went wrong -----------------------------------------------------------------------------
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


# --- several training runs side by side ----------------------------------------------------------
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
