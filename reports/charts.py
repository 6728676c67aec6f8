"""Charts of training runs drawn with matplotlib: the loss (raw, smoothed, held-out and evaluation points) of one run or
several (one run's with its learning rate on a second y axis), one metric against the step, and several series
as lines (a log axis for the step time's phases).

Used by ``pretrain runs compare`` (PNG/SVG files) and by the Decks and ``pretrain runs report``
(``reports.run_html``: SVG inlined in HTML), so it knows nothing of Flyte. The settings and the output (``svg``,
``png``, ``save``) are ``reports.plotting``'s, the dataset's charts are ``reports.data_charts``.

Every drawn series carries an SVG id (matplotlib's ``gid``) naming what it is, so that a test, or a person
reading the SVG, can find it: ``raw-<i>``, ``smooth-<i>`` for run ``i``'s loss, ``heldout-<i>`` for the held-out
points its training measured, ``evaluation-<i>`` for its evaluations' val_loss, ``lr``
for the learning rate beside it, ``series`` for a single metric, ``line-<i>`` for series ``i`` of a line chart,
``goodput-<part>`` for a part of the goodput bar.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from reports.plotting import COLORS, SIZE, axes, integer_steps, text, twin
from runs.ledger import PARTS as GOODPUT_PARTS
from runs.view import LossHistory, RunView

SMOOTHING_FRACTION = 0.05
"""The moving average spans this fraction of a run's steps (at least ``MIN_WINDOW``, odd)."""
MIN_WINDOW = 3
RAW_ALPHA = 0.3
"""The raw curve is drawn faint beside its smoothed curve: visible noise, readable trend."""
LR_COLOR = "#555555"
"""The learning rate's line, its axis label and ticks: dashed dark gray, apart from every run's color."""


@dataclass
class Curve:
    """One run's loss for a chart: its steps, their losses, the held-out points its training measured and its
    evaluations' (step, val_loss), with how many batches (or tokens) each kind of point read, for the legend."""

    label: str
    steps: list[int]
    loss: list[float]
    heldout: list[tuple[int, float]] = field(default_factory=list)
    evaluation: list[tuple[int, float]] = field(default_factory=list)
    heldout_batches: int | None = None
    evaluation_batches: int | None = None
    evaluation_tokens: int | None = None

    @classmethod
    def of(cls, label: str, history: LossHistory) -> Curve:
        """The curve of a run's ``LossHistory`` (``RunView.loss``)."""
        return cls(
            label,
            history.steps,
            history.loss,
            heldout=list(history.heldout),
            evaluation=list(history.evaluation),
            heldout_batches=history.heldout_batches,
            evaluation_batches=history.evaluation_batches,
            evaluation_tokens=history.evaluation_tokens,
        )


# -- smoothing --------------------------------------------------------------------------------------
def window_for(n: int) -> int:
    """The moving average's width for a run of ``n`` steps: ~5% of them, odd (so it is centered), ≥ 3."""
    width = max(MIN_WINDOW, round(n * SMOOTHING_FRACTION))
    return width if width % 2 else width + 1


def shared_window(curves: list[Curve]) -> int:
    """One moving average's width for every curve of a chart, from the longest run: runs smoothed over different
    spans would differ in noise for no reason of their own, and a chart can name only one window."""
    return window_for(max((len(c.loss) for c in curves), default=0))


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
HELDOUT_MARKER = {"marker": "o", "markersize": 5}
EVALUATION_MARKER = {"marker": "D", "markersize": 6}
"""The two kinds of validation point in two shapes: a held-out point (few batches, during training) is not an
evaluation (a checkpoint on many batches), and the legend tells them apart by shape."""


def heldout_label(curves: list[Curve]) -> str:
    """'held-out loss during training (2 batches)': the batches when every curve that has points says the same."""
    return _sized("held-out loss during training", {c.heldout_batches for c in curves if c.heldout}, ("batch", "batches"))


def evaluation_label(curves: list[Curve]) -> str:
    """'evaluation val_loss (40 batches)', or its tokens when the evaluations do not record their batches."""
    shown = [c for c in curves if c.evaluation]
    batches = {c.evaluation_batches for c in shown}
    if None not in batches:
        return _sized("evaluation val_loss", batches, ("batch", "batches"))
    return _sized("evaluation val_loss", {c.evaluation_tokens for c in shown}, ("token", "tokens"))


def _sized(name: str, sizes: set[int | None], units: tuple[str, str]) -> str:
    """``name`` with the one size every curve read ('(2 batches)'); none when they differ or one is not recorded."""
    if len(sizes) != 1 or None in sizes:
        return name
    (n,) = sizes
    return f"{name} ({n:,} {units[n != 1]})"


def loss_figure(curves: list[Curve], title: str = "training loss", lr: list[tuple[int, float]] | None = None) -> Any:
    """One or more runs' loss on one axes: each run in its color, raw faint, smoothed solid (one moving-average
    window for every run, from the longest, named in the legend), its held-out points as circles and its
    evaluations as diamonds at their steps. The legend's swatches are the lines drawn: with one run, each kind
    in the run's color; with several, a line per run in its color, then the kinds in black under a heading
    that says they take each run's color.
    ``lr``: one run's learning rate at each step, (step, lr), drawn on a second y axis (right, from 0) so that its
    schedule is seen against the loss it gave; none (a run that did not record it, or several runs): no second axis."""
    fig, ax = axes(title, "step", "loss")
    width = shared_window(curves)
    for i, curve in enumerate(curves):
        color = COLORS[i % len(COLORS)]
        ax.plot(curve.steps, curve.loss, color=color, alpha=RAW_ALPHA, linewidth=1.0, gid=f"raw-{i}")
        ax.plot(curve.steps, smooth(curve.loss, width), color=color, linewidth=1.8, gid=f"smooth-{i}")
        for points, marker, gid in (
            (curve.heldout, HELDOUT_MARKER, f"heldout-{i}"),
            (curve.evaluation, EVALUATION_MARKER, f"evaluation-{i}"),
        ):
            if points:
                steps, values = zip(*points, strict=True)
                ax.plot(steps, values, linestyle="none", color=color, markeredgecolor="black", gid=gid, **marker)
    handles = _legend_handles(curves, width)
    if lr:
        handles.append(_lr_axis(ax, lr))
        # Right of the second axis' ticks and label: constrained layout makes room for a legend "outside".
        fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
    else:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    integer_steps(ax)
    return fig


KINDS_HEADING = "in each run's colour:"


def _legend_handles(curves: list[Curve], width: int) -> list[Any]:
    """The legend of ``loss_figure``: swatches drawn as the lines are (one run: in its color; several: a line per run
    in its color, then the kinds of line in black under ``KINDS_HEADING``)."""
    from matplotlib.lines import Line2D

    one = len(curves) == 1
    kind_color = COLORS[0] if one else "black"
    kinds = [
        Line2D([], [], color=kind_color, alpha=RAW_ALPHA, label="loss at each step"),
        Line2D([], [], color=kind_color, linewidth=1.8, label=f"centered moving average over {width} steps"),
    ]
    for label, has_points, marker in (
        (heldout_label(curves), any(c.heldout for c in curves), HELDOUT_MARKER),
        (evaluation_label(curves), any(c.evaluation for c in curves), EVALUATION_MARKER),
    ):
        if has_points:
            kinds.append(Line2D([], [], color=kind_color, linestyle="none", markeredgecolor="black", label=label, **marker))
    if one:
        return kinds
    runs = [Line2D([], [], color=COLORS[i % len(COLORS)], linewidth=1.8, label=text(c.label)) for i, c in enumerate(curves)]
    heading = Line2D([], [], color="none", linestyle="none", label=KINDS_HEADING)  # a line of text, no swatch
    return [*runs, heading, *kinds]


def _lr_axis(ax: Any, lr: list[tuple[int, float]]) -> Any:
    """The learning rate on a twin of ``ax`` (same steps, its own y axis on the right, from 0); its line."""
    from matplotlib.ticker import FuncFormatter

    steps, values = zip(*lr, strict=True)
    right = twin(ax)
    (line,) = right.plot(steps, values, color=LR_COLOR, linestyle="--", linewidth=1.2, gid="lr", label="learning rate")
    right.set_ylabel("learning rate", color=LR_COLOR)
    right.tick_params(axis="y", colors=LR_COLOR)
    right.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 0.0005, not 0.00050 or an offset
    right.set_ylim(bottom=min(0.0, *values))
    ax.set_zorder(right.get_zorder() + 1)  # the loss drawn over the rate, not under it...
    ax.patch.set_visible(False)  # ...through a see-through background
    return line


def series_figure(steps: list[int], values: list[float], title: str, y_label: str) -> Any:
    """One metric against the step."""
    fig, ax = axes(title, "step", y_label)
    ax.plot(steps, values, color=COLORS[0], linewidth=1.2, gid="series")
    integer_steps(ax)
    return fig


def lines_figure(
    x: list[float], series: list[tuple[str, list[float]]], title: str, y_label: str, x_label: str = "step", log: bool = False
) -> Any:
    """One line per series, in its color, with a legend naming them. With ``log`` the y axis is logarithmic:
    series an order of magnitude apart are each readable (a linear axis, or a stack, gives the largest the
    whole height), and a value that is not positive (a phase that took no time that step: checkpoint saves
    between saves) is left out of its line. A series with such gaps, or a single step, is drawn with markers
    too, so that a value with no neighbour to join is still seen."""
    fig, ax = axes(title, x_label, y_label)
    shown = []
    for i, (label, values) in enumerate(series):
        ys = [v if isinstance(v, (int, float)) and math.isfinite(v) and (v > 0 or not log) else math.nan for v in values]
        shown += [v for v in ys if not math.isnan(v)]
        gaps = len(x) < 2 or any(math.isnan(v) for v in ys)
        ax.plot(
            x,
            ys,
            color=COLORS[i % len(COLORS)],
            linewidth=1.2,
            marker="o" if gaps else None,
            markersize=3,
            label=text(label),
            gid=f"line-{i}",
        )
    if log and shown:
        from matplotlib.ticker import FuncFormatter, NullFormatter

        ax.set_yscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")  # 0.01, not 10^-2 in math text
        ax.yaxis.set_major_formatter(plain)
        # Within one decade there may be no power of ten to label: then the minor ticks (0.02, 0.03, ...) are.
        ax.yaxis.set_minor_formatter(plain if max(shown) < 10 * min(shown) else NullFormatter())
    if len(x) == 1:
        ax.set_xlim(x[0] - 1, x[0] + 1)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    integer_steps(ax)
    return fig


def goodput_figure(parts: list[tuple[str, float]], wall_s: float, title: str = "where the wall time went") -> Any:
    """One horizontal bar of the run's wall time, stacked by part in ``parts``' order ((name, seconds); parts of
    no time are left out), each part's segment in its color; the legend gives each part's seconds and share."""
    fig, ax = axes(title, "seconds", "", size=(SIZE[0], 1.9))
    left = 0.0
    for i, (name, seconds) in enumerate(parts):
        if not seconds > 0:
            continue
        share = f" ({seconds / wall_s:.1%})" if wall_s > 0 else ""
        label = text(f"{name.replace('_', ' ')}: {seconds:,.1f} s{share}")
        ax.barh([0], [seconds], left=[left], height=0.6, color=COLORS[i % len(COLORS)], gid=f"goodput-{name}", label=label)
        left += seconds
    ax.set_yticks([])
    ax.set_xlim(0, max(left, wall_s, 1e-9))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return fig


# -- the charts of one run ----------------------------------------------------------------------------
# Per-step metrics of training/observe/metrics.py charted besides the loss: (record key, title, y label, scale).
# MFU is recorded as a fraction and shown in percent, as people quote it. The learning rate is drawn on the loss
# chart itself (a second y axis: ``loss_figure``), not here.
TRAINING_CURVES = (
    ("grad_norm", "gradient norm", "gradient norm (before clipping)", 1.0),
    ("tokens_per_s", "tokens/s", "tokens per second", 1.0),
    ("mfu", "model FLOPs utilisation", "MFU (%)", 100.0),
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


@dataclass
class RunCharts:
    """Every chart of one run, drawn once from its view: the HTML report and Decks inline them, the MLflow
    mirror stores the loss chart as PNG."""

    loss: Any | None
    """The loss (raw, smoothed) with its held-out points and, on a second axis, the learning rate when the
    records hold it; None: no step recorded."""
    series: list[Any]
    """One chart per ``TRAINING_CURVES`` series the records hold."""
    goodput: Any | None
    """The goodput ledger's bar; None: no ledger."""
    phases: Any | None
    """Rank 0's step time per phase, step by step; None: no breakdown recorded."""
    ranks: Any | None
    """Each rank's step time at the exchanged steps; None: no exchange."""


def run_charts(view: RunView) -> RunCharts:
    """The charts of the run ``view`` shows."""
    loss = None
    if view.loss.steps:
        loss = loss_figure([Curve.of("loss", view.loss)], lr=lr_history(view))
    series = []
    for key, title, y_label, scale in TRAINING_CURVES:
        points = [m for m in view.metrics if isinstance(m.get(key), (int, float))]
        if points:
            steps, values = [int(m["step"]) for m in points], [float(m[key]) * scale for m in points]
            series.append(series_figure(steps, values, title, y_label))
    goodput = None
    if view.goodput is not None:
        goodput = goodput_figure([(part, view.goodput.parts[part]) for part in GOODPUT_PARTS], view.goodput.wall_s)
    phases = [row["phase"] for row in view.breakdown["phases"]]
    return RunCharts(loss, series, goodput, _phase_chart(view.metrics, phases), _rank_chart(view.step_times, view.ranks))


def lr_history(view: RunView) -> list[tuple[int, float]]:
    """The learning rate at each recorded step, (step, lr): a skipped step's too (its loss is left out of the loss
    line, but the schedule gave it a rate all the same); none for records without one (runs from before it)."""

    def number(value: object) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    return [(int(m["step"]), float(m["lr"])) for m in view.metrics if number(m.get("step")) and number(m.get("lr"))]


def phase_label(phase: str) -> str:
    """'forward_backward' → 'forward+backward'."""
    return phase.replace("forward_backward", "forward+backward").replace("_", " ")


def _phase_chart(metrics: list[dict], phases: list[str]) -> Any | None:
    """One line per phase on a logarithmic axis: forward+backward is ten to a hundred times the data wait or
    the optimizer step, so a stack (or a linear axis) gives it the whole height and flattens the phases one
    looks at to find a slow loader or collective; on a log axis each phase's own trend shows, and a rare slow
    step (the first, a checkpoint save) needs no clipping."""
    timed = [m for m in metrics if "step_time_s" in m]
    if not phases:
        return None
    steps = [int(m["step"]) for m in timed]
    series = [(phase_label(p), [float(m.get(f"time_{p}_s") or 0.0) for m in timed]) for p in phases]
    steps, series = thin(steps, series)
    return lines_figure(steps, series, "step time by phase (rank 0)", "seconds (log scale)", log=True)


def _rank_chart(step_times: list[dict], ranks: dict) -> Any | None:
    """Each rank's step time at the steps the exchanges gathered (``ranks``: the view's summary of them): a
    straggler is the line above the others. Many ranks: their median, the slowest and the fastest."""
    if not ranks["ranks"]:
        return None
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
    return lines_figure(steps, series, "step time by rank", "seconds per step")
