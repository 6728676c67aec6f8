"""The train task's Decks (``reports.run_html``, which ``pretrain runs report`` shares): the training curves, the
step time (the phase table, a row per rank, phases on a log axis, each rank's step time), the straggler and
loss-health tables. Charts are matplotlib SVG, read back as XML."""

from __future__ import annotations

import math
import re

import pytest

from reports import charts, run_html
from reports.deck_html import chart
from runs.view import RunView
from tests.helpers import html_charts, html_table, svg_group, svg_ids, svg_lines, svg_marks, svg_texts, view_of
from training.observe.timing import BREAKDOWN_KEYS

LABELS = ["data", "forward+backward", "collective", "optimizer", "checkpoint", "other"]
SECONDS = [0.01, 0.2, 0.05, 0.03, 0.0, 0.01]  # per phase, in BREAKDOWN_KEYS' order


def breakdown_records(n: int) -> list[dict]:
    """Steps 1..n with a per-phase breakdown; step 4 checkpoints, step 3 is the slowest overall."""
    records = []
    for step in range(1, n + 1):
        seconds = dict(zip(BREAKDOWN_KEYS, SECONDS, strict=True))
        if step == 3:
            seconds["time_forward_backward_s"] = 0.9
        if step == 4:
            seconds["time_checkpoint_s"] = 0.4
        records.append({"step": step, "loss": 5.0 - step / 10, "step_time_s": sum(seconds.values()), **seconds})
    return records


def rank_lines(n: int, ranks: int = 2) -> list[dict]:
    """step_times.jsonl of ``ranks`` ranks over steps 1..n: rank r's step lasts 0.3 + 0.1·r s."""
    phases = {k: v for k, v in zip(BREAKDOWN_KEYS, SECONDS, strict=True) if k != "time_checkpoint_s"}
    return [{"step": s, "rank": r, "step_s": 0.3 + 0.1 * r, **phases} for s in range(1, n + 1) for r in range(ranks)]


def line_y(root, gid: str) -> float:
    """The SVG y of a constant line (every vertex of its path at one height; y grows downwards)."""
    path = svg_lines(svg_group(root, gid))[0]
    assert len({round(y, 3) for _, y in path}) == 1, path
    return path[0][1]


def test_step_time_shows_the_phase_table_every_rank_and_small_phases():
    records = [{"step": 0, "loss": 9.0}] + breakdown_records(5)  # a record without a breakdown is left out
    html = step_time_html(view_of(records, rank_lines(5)))
    header, *phases = html_table(html, "phases")  # as `pretrain runs show` prints it
    assert header == ["phase", "median s", "total s", "share"]
    assert [row[0] for row in phases] == LABELS
    by_phase = {row[0]: row for row in phases}
    assert by_phase["optimizer"][1:3] == ["0.0300", "0.150"] and by_phase["forward+backward"][1] == "0.2000"
    wall = sum(r["step_time_s"] for r in records[1:])
    assert by_phase["checkpoint"][3] == f"{0.4 / wall:.1%}"
    header, *ranks = html_table(html, "ranks")  # a row per rank, from step_times.jsonl
    assert header[:3] == ["rank", "steps", "median step s"] and header[-1] == "busy s (all steps)"
    assert [row[:3] for row in ranks] == [["0", "5", "0.3000"], ["1", "5", "0.4000"]]
    assert "slowest rank 1: busy" in html

    phases_chart, ranks_chart = html_charts(html)
    assert svg_ids(phases_chart, "line-") == [f"line-{i}" for i in range(6)]
    assert {"step", "seconds (log scale)", "step time by phase (rank 0)", *LABELS} <= set(svg_texts(phases_chart))
    # A log axis: the 0.01 s data wait sits as far below the 0.03 s optimizer step, relative to the 0.2 s
    # forward+backward, as log(3)/log(20) (a linear axis, or a stack, squeezes it to 0.02/0.19 of that).
    data, optimizer = line_y(phases_chart, "line-0"), line_y(phases_chart, "line-3")
    forward = svg_lines(svg_group(phases_chart, "line-1"))[0][0][1]  # step 1, before step 3's 0.9 s
    assert (data - optimizer) / (data - forward) == pytest.approx(math.log(3) / math.log(20), rel=1e-3)
    # The checkpoint phase took time at step 4 only: a marker there, no line through the steps without a save.
    assert len(svg_marks(svg_group(phases_chart, "line-4"))) == 1
    assert svg_ids(ranks_chart, "line-") == ["line-0", "line-1"]
    assert {"rank 0", "rank 1", "step time by rank"} <= set(svg_texts(ranks_chart))
    assert line_y(ranks_chart, "line-1") < line_y(ranks_chart, "line-0")  # rank 1's longer step, higher up


def test_a_rare_slow_step_does_not_flatten_the_others():
    records = breakdown_records(40)
    records[19]["time_checkpoint_s"] = 9.0  # step 20: a save thirty times an ordinary step
    (root, _) = html_charts(step_time_html(view_of(records, rank_lines(2))))
    data, optimizer = line_y(root, "line-0"), line_y(root, "line-3")
    forward = svg_lines(svg_group(root, "line-1"))[0][0][1]
    assert (data - optimizer) / (data - forward) == pytest.approx(math.log(3) / math.log(20), rel=1e-3)
    assert data - optimizer > 20  # points apart on the page, not squeezed against the axis


def test_a_long_run_of_many_ranks_keeps_every_rank_in_the_table_and_the_charts_small():
    html = step_time_html(view_of(breakdown_records(3000), rank_lines(30, ranks=16)))
    assert [row[0] for row in html_table(html, "ranks")[1:]] == [str(r) for r in range(16)]  # every rank listed
    _, ranks = html_charts(html)
    assert svg_ids(ranks, "line-") == ["line-0", "line-1", "line-2"]  # 16 lines would be a tangle
    assert {"median of the 16 ranks", "slowest: rank 15", "fastest: rank 0"} <= set(svg_texts(ranks))
    assert line_y(ranks, "line-1") < line_y(ranks, "line-0") < line_y(ranks, "line-2")  # the slowest on top


def test_a_long_run_is_drawn_in_windows_of_steps():
    steps = list(range(1, 3001))
    thinned_steps, ((label, values),) = charts.thin(steps, [("data", [float(s % 3) for s in steps])])
    assert len(thinned_steps) == charts.MOST_POINTS == 1000 and thinned_steps[:2] == [3, 6] and thinned_steps[-1] == 3000
    assert label == "data" and values == [1.0] * 1000  # each window's median: of 1, 2 and 0
    assert charts.thin(steps[:1000], [("x", [1.0] * 1000)]) == (steps[:1000], [("x", [1.0] * 1000)])


def test_a_run_without_a_breakdown_or_exchanges_says_so():
    html = step_time_html(view_of([{"step": 1, "loss": 3.0}]))
    assert "no data" in html and "no step times exchanged" in html and not html_charts(html)
    (single, _) = html_charts(step_time_html(view_of(breakdown_records(1), rank_lines(1))))
    assert svg_ids(single, "line-") == [f"line-{i}" for i in range(6)]  # one step still draws every phase...
    assert all(len(svg_marks(svg_group(single, f"line-{i}"))) == 1 for i in (0, 1, 2, 3, 5))  # ...as a marker
    assert not svg_marks(svg_group(single, "line-4"))  # the checkpoint phase took no time: nothing to draw


def test_training_curves_draw_the_loss_raw_smoothed_with_heldout_and_evaluation_points_and_the_other_series():
    records = [
        {"step": s, "loss": 6.0 - s / 10 + (0.3 if s % 2 else 0.0), "lr": 1e-3 * s, "grad_norm": 1.0, "tokens_per_s": 900.0 + s}
        for s in range(1, 21)
    ]
    records[9] |= {"loss": math.nan, "skipped": True}  # a refused step: its NaN is not drawn
    records[4] |= {"heldout_loss": 5.7, "heldout_batches": 2}  # the training's held-out points, steps 5 and 15
    records[14] |= {"heldout_loss": 4.6, "heldout_batches": 2}
    html = curves_html(view_of(records, evaluations=[{"step": 10, "val_loss": 5.5}, {"step": 20, "val_loss": 4.2}]))
    loss, *others = html_charts(html)
    assert len(others) == 2  # grad norm, tokens/s (the lr is on the loss chart); no MFU in these records
    texts = svg_texts(loss)
    assert {"step", "loss", "held-out loss during training (2 batches)", "evaluation val_loss"} <= set(texts)
    assert svg_ids(loss, "lr") == ["lr"] and svg_texts(loss).count("learning rate") == 2  # axis label, legend
    assert len(svg_lines(svg_group(loss, "lr"))[0]) == 20  # every step's rate, the skipped step's too
    (raw,) = svg_lines(svg_group(loss, "raw-0"))
    (smoothed,) = svg_lines(svg_group(loss, "smooth-0"))
    assert len(raw) == len(smoothed) == 19  # every applied step; the skipped one left out
    # Smoothed: a centered moving average over 3 points (fewer at the ends); the axes map y linearly, so the
    # mean of the raw points' SVG y is the smoothed point's.
    ys = [y for _, y in raw]
    means = [sum(ys[max(0, i - 1) : i + 2]) / len(ys[max(0, i - 1) : i + 2]) for i in range(len(ys))]
    assert [y for _, y in smoothed] == pytest.approx(means, abs=1e-3)
    assert [x for x, _ in smoothed] == [x for x, _ in raw]
    # Each kind of point at its steps, apart: x interpolated from the raw line's ends (steps 1 and 20).
    (x1, _), (x20, _) = raw[0], raw[-1]

    def xs(gid: str) -> list[float]:
        return [round(x, 2) for x, _ in svg_marks(svg_group(loss, gid))]

    assert xs("evaluation-0") == [round(x1 + (s - 1) * (x20 - x1) / 19, 2) for s in (10, 20)]
    assert xs("heldout-0") == [round(x1 + (s - 1) * (x20 - x1) / 19, 2) for s in (5, 15)]
    marks = svg_marks(svg_group(loss, "evaluation-0"))
    assert marks[0][1] < marks[1][1]  # 5.5 above 4.2
    assert [svg_texts(c)[-1] for c in others] == ["gradient norm", "tokens/s"]  # titles
    assert curves_html(view_of([])).count("no data") == 1


def test_the_loss_chart_carries_the_learning_rate_on_a_second_axis():
    # Warm-up to 1e-3 over 5 steps, then a linear decay to 1e-4 at step 20; step 8's update was skipped.
    lr = {s: 1e-3 * s / 5 if s <= 5 else 1e-3 - 9e-4 * (s - 5) / 15 for s in range(1, 21)}
    records = [{"step": s, "loss": 6.0 - s / 10, "lr": lr[s]} for s in range(1, 21)]
    records[7] |= {"loss": math.nan, "skipped": True}
    fig = charts.run_charts(view_of(records)).loss
    loss_axes, lr_axes = fig.axes
    assert lr_axes.get_shared_x_axes().joined(loss_axes, lr_axes)  # one step axis
    assert lr_axes.get_ylabel() == "learning rate" and loss_axes.get_ylabel() == "loss"
    assert lr_axes.yaxis.get_label_position() == "right"
    (line,) = lr_axes.get_lines()
    assert line.get_gid() == "lr"
    assert list(line.get_xdata()) == list(range(1, 21))  # the skipped step's rate too...
    assert list(line.get_ydata()) == pytest.approx([lr[s] for s in range(1, 21)])
    (raw,) = [ln for ln in loss_axes.get_lines() if ln.get_gid() == "raw-0"]
    assert 8 not in list(raw.get_xdata())  # ...but not its loss
    assert lr_axes.get_ylim()[0] == 0.0 and lr_axes.get_ylim()[1] >= 1e-3  # the schedule from 0, its peak in view
    legend = fig.legends[0] if fig.legends else loss_axes.get_legend()
    assert "learning rate" in [t.get_text() for t in legend.get_texts()]


def test_a_run_without_a_learning_rate_has_a_loss_chart_of_one_axis():
    records = [{"step": s, "loss": 6.0 - s / 10, "grad_norm": 1.0} for s in range(1, 11)]  # an older run's records
    fig = charts.run_charts(view_of(records)).loss
    (loss_axes,) = fig.axes
    assert all(ln.get_gid() != "lr" for ln in loss_axes.get_lines())
    assert "learning rate" not in [t.get_text() for t in loss_axes.get_legend().get_texts()]
    (root, _) = html_charts(curves_html(view_of(records)))  # the loss and the gradient norm
    assert svg_ids(root, "lr") == [] and "learning rate" not in svg_texts(root)


def test_mfu_is_charted_in_percent():
    records = [{"step": s, "loss": 5.0, "mfu": 0.3 + s / 1000, "peak_flops": 1e12, "peak_flops_source": "cfg"} for s in range(10)]
    _, mfu = html_charts(curves_html(view_of(records)))
    assert {"model FLOPs utilisation", "MFU (%)"} <= set(svg_texts(mfu))
    y_ticks = [float(t) for t in svg_texts(svg_group(mfu, "matplotlib.axis_2")) if re.fullmatch(r"[\d.]+", t)]
    assert y_ticks and 29.5 < min(y_ticks) and max(y_ticks) < 31.5  # 30.0 % to 30.9 %, not 0.300 to 0.309


def test_straggler_warnings_and_health_events_are_listed():
    records = breakdown_records(8)
    records[3] |= {
        "window": [1, 4],
        "slowest_rank": 1,
        "slowest_ratio": 2.5,
        "straggler_warning": "rank 1 has been the slowest for 2 windows",
    }
    records[5] |= {
        "skipped": True,
        "health": {
            "step": 6,
            "loss": "nan",
            "problem": "loss is nan",
            "action": "skipped",
            "batch": {"shards": [{"shard": "s3://b/datasets/v/shards/train-00003.tar", "rows": [4, 5, 6]}]},
        },
    }
    html = run_html.run_warnings(view_of(records))
    stragglers = re.search(r"<table class='stragglers'>(.*?)</table>", html).group(1)
    assert stragglers.count("<tr>") == 2  # the header and step 4's warning
    assert "<td>4</td><td>1</td><td>2.5</td><td>rank 1 has been the slowest for 2 windows</td>" in stragglers
    health = re.search(r"<table class='health'>(.*?)</table>", html).group(1)
    assert health.count("<tr>") == 2
    assert "<td>6</td><td>nan</td><td>skipped</td><td>loss is nan</td>" in health
    assert "train-00003.tar (3 rows)" in health


def test_a_quiet_run_says_none_twice():
    html = run_html.run_warnings(view_of(breakdown_records(3)))
    assert html.count("<p>none</p>") == 2 and "<table class='stragglers'>" not in html and "<table class='health'>" not in html


def test_strings_are_escaped():
    hostile = "<script>alert('x')</script>"
    records = breakdown_records(2)
    records[0] |= {"straggler_warning": hostile, "slowest_rank": hostile, "slowest_ratio": 1.5, "window": [1, 1]}
    records[1] |= {
        "health": {"step": 2, "loss": 1.0, "problem": hostile, "action": hostile, "batch": {"shards": [{"shard": hostile}]}}
    }
    html = run_html.run_warnings(view_of(records))
    assert "<script>" not in html and "alert('x')" not in html
    assert html.count("&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;") == 5
    drawn = chart(charts.lines_figure([1, 2], [(hostile, [1.0, 2.0])], hostile, hostile, hostile, log=True))
    (root,) = html_charts(drawn)
    assert "<script>" not in drawn and not list(root.iter("{http://www.w3.org/2000/svg}script"))
    assert svg_texts(root).count(hostile) == 4  # title, legend, both axes: shown as text, escaped in the SVG
    dollars = chart(charts.lines_figure([1, 2], [("cost $x", [1.0, 2.0])], "a $ b", "_hidden", "y"))
    assert {"cost $x", "a $ b"} <= set(svg_texts(html_charts(dollars)[0]))  # no math mode, no error on an odd '$'


def step_time_html(view: RunView) -> str:
    return run_html.step_time(view, charts.run_charts(view))


def curves_html(view: RunView) -> str:
    return run_html.training_curves(view, charts.run_charts(view))
