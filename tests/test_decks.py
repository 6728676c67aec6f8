"""The train task's Decks: the training curves and the stacked step-time plot (matplotlib SVG, read back as
XML), the straggler and loss-health tables."""

from __future__ import annotations

import math
import re

import pytest

from tasks import run_decks
from tests.helpers import svg_group, svg_ids, svg_lines, svg_marks, svg_root, svg_texts
from training.observe.timing import BREAKDOWN_KEYS

LABELS = ["data", "forward+backward", "collective", "optimizer", "checkpoint", "other"]
SVG = re.compile(r"<svg.*?</svg>", re.DOTALL)


def breakdown_records(n: int) -> list[dict]:
    """Steps 1..n with a per-phase breakdown; step 4 checkpoints, step 3 is the slowest overall."""
    records = []
    for step in range(1, n + 1):
        seconds = dict(zip(BREAKDOWN_KEYS, [0.01, 0.2, 0.05, 0.03, 0.0, 0.01], strict=True))
        if step == 3:
            seconds["time_forward_backward_s"] = 0.9
        if step == 4:
            seconds["time_checkpoint_s"] = 0.4
        records.append({"step": step, "loss": 5.0 - step / 10, **seconds})
    return records


def charts_of(html: str) -> list:
    """Every inline chart of a Deck, parsed (each must be well-formed SVG)."""
    return [svg_root(svg) for svg in SVG.findall(html)]


def edges(root, gid: str) -> dict[float, tuple[float, float]]:
    """A filled area's (top, bottom) SVG y at each x it spans (y grows downwards)."""
    (outline,) = svg_lines(svg_group(root, gid))
    by_x: dict[float, list[float]] = {}
    for x, y in outline:
        by_x.setdefault(round(x, 3), []).append(round(y, 3))
    return {x: (min(ys), max(ys)) for x, ys in sorted(by_x.items())}


def test_stacked_plot_has_one_area_per_phase_a_legend_and_axis_labels():
    records = [{"step": 0, "loss": 9.0}] + breakdown_records(5)  # a record without a breakdown is left out
    (root,) = charts_of(run_decks.step_time_breakdown(records, BREAKDOWN_KEYS))
    assert svg_ids(root, "area-") == [f"area-{i}" for i in range(6)] and len(BREAKDOWN_KEYS) == 6
    texts = svg_texts(root)
    assert texts[-6:] == LABELS[::-1]  # the legend lists the top of the stack first
    assert {"step", "seconds per step", "step time by phase (rank 0)"} <= set(texts)
    assert {"1", "5"} <= set(texts) and "0" not in texts and "6" not in texts  # the x axis spans steps 1 to 5
    areas = [edges(root, f"area-{i}") for i in range(6)]
    assert all(len(area) == 5 for area in areas)  # one x per step
    # Stacked: each area's lower edge is the one below's upper edge, the first sits on the axis.
    assert len({bottom for _, bottom in areas[0].values()}) == 1
    for below, above in zip(areas, areas[1:], strict=False):
        assert [bottom for _, bottom in above.values()] == [top for top, _ in below.values()]
    # The top edge is the step time: highest (smallest y) at the slow step 3, then the checkpoint step 4.
    top = [t for t, _ in areas[-1].values()]
    assert sorted(range(5), key=top.__getitem__)[:2] == [2, 3]
    # The checkpoint's area has height only at step 4, and in proportion: 0.4 s against step 3's 1.0 s top.
    checkpoint = areas[BREAKDOWN_KEYS.index("time_checkpoint_s")]
    heights = [bottom - t for t, bottom in checkpoint.values()]
    assert [h > 0 for h in heights] == [False, False, False, True, False]
    axis = next(iter(areas[0].values()))[1]
    assert heights[3] / (axis - top[2]) == pytest.approx(0.4 / 1.0, rel=1e-3)


def test_a_run_without_a_breakdown_says_so():
    assert "no data" in run_decks.step_time_breakdown([{"step": 1, "loss": 3.0}], BREAKDOWN_KEYS)
    (single,) = charts_of(run_decks.step_time_breakdown(breakdown_records(1), BREAKDOWN_KEYS))
    assert svg_ids(single, "area-") == [f"area-{i}" for i in range(6)]  # one step still draws every phase
    assert all(len(edges(single, f"area-{i}")) == 2 for i in range(6))  # as a band one step wide


def test_training_curves_draw_the_loss_raw_smoothed_with_validation_points_and_the_other_series():
    records = [
        {"step": s, "loss": 6.0 - s / 10 + (0.3 if s % 2 else 0.0), "lr": 1e-3 * s, "grad_norm": 1.0, "tokens_per_s": 900.0 + s}
        for s in range(1, 21)
    ]
    records[9] |= {"loss": math.nan, "skipped": True}  # a refused step: its NaN is not drawn
    html = run_decks.training_curves(records, validation=[(10, 5.5), (20, 4.2)])
    loss, *others = charts_of(html)
    assert len(others) == 3  # lr, grad norm, tokens/s; no MFU in these records
    assert {"step", "loss"} <= set(svg_texts(loss)) and "validation loss" in svg_texts(loss)
    (raw,) = svg_lines(svg_group(loss, "raw-0"))
    (smoothed,) = svg_lines(svg_group(loss, "smooth-0"))
    assert len(raw) == len(smoothed) == 19  # every applied step; the skipped one left out
    # Smoothed: a centered moving average over 3 points (fewer at the ends); the axes map y linearly, so the
    # mean of the raw points' SVG y is the smoothed point's.
    ys = [y for _, y in raw]
    means = [sum(ys[max(0, i - 1) : i + 2]) / len(ys[max(0, i - 1) : i + 2]) for i in range(len(ys))]
    assert [y for _, y in smoothed] == pytest.approx(means, abs=1e-3)
    assert [x for x, _ in smoothed] == [x for x, _ in raw]
    # The validation markers sit at steps 10 and 20: x interpolated from the raw line's ends (steps 1 and 20).
    (x1, _), (x20, _) = raw[0], raw[-1]
    marks = svg_marks(svg_group(loss, "validation-0"))
    assert [round(x, 2) for x, _ in marks] == [round(x1 + (s - 1) * (x20 - x1) / 19, 2) for s in (10, 20)]
    assert marks[0][1] < marks[1][1]  # 5.5 above 4.2
    assert [svg_texts(c)[-1] for c in others] == ["learning rate", "gradient norm", "tokens/s"]  # titles
    assert run_decks.training_curves([]).count("no data") == 1


def test_straggler_warnings_and_health_events_are_listed():
    records = breakdown_records(8)
    records[3] |= {"slowest_rank": 1, "slowest_ratio": 2.5, "straggler_warning": "rank 1 has been the slowest for 2 windows"}
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
    html = run_decks.run_warnings(records)
    stragglers = re.search(r"<table class='stragglers'>(.*?)</table>", html).group(1)
    assert stragglers.count("<tr>") == 2  # the header and step 4's warning
    assert "<td>4</td><td>1</td><td>2.5</td><td>rank 1 has been the slowest for 2 windows</td>" in stragglers
    health = re.search(r"<table class='health'>(.*?)</table>", html).group(1)
    assert health.count("<tr>") == 2
    assert "<td>6</td><td>nan</td><td>skipped</td><td>loss is nan</td>" in health
    assert "train-00003.tar (3 rows)" in health


def test_a_quiet_run_says_none_twice():
    html = run_decks.run_warnings(breakdown_records(3))
    assert html.count("<p>none</p>") == 2 and "<table class='stragglers'>" not in html and "<table class='health'>" not in html


def test_strings_are_escaped():
    hostile = "<script>alert('x')</script>"
    records = breakdown_records(2)
    records[0] |= {"straggler_warning": hostile, "slowest_rank": hostile}
    records[1] |= {
        "health": {"step": 2, "loss": 1.0, "problem": hostile, "action": hostile, "batch": {"shards": [{"shard": hostile}]}}
    }
    html = run_decks.run_warnings(records)
    assert "<script>" not in html and "alert('x')" not in html
    assert html.count("&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;") == 5
    chart = run_decks.stacked_area_chart([1, 2], [(hostile, [1.0, 2.0])], hostile, hostile, hostile)
    (root,) = charts_of(chart)
    assert "<script>" not in chart and not list(root.iter("{http://www.w3.org/2000/svg}script"))
    assert svg_texts(root).count(hostile) == 4  # title, legend, both axes: shown as text, escaped in the SVG
    dollars = run_decks.stacked_area_chart([1, 2], [("cost $x", [1.0, 2.0])], "a $ b", "_hidden", "y")
    assert {"cost $x", "a $ b"} <= set(svg_texts(charts_of(dollars)[0]))  # no math mode, no error on an odd '$'


def test_a_rare_slow_step_does_not_flatten_the_others():
    records = breakdown_records(40)
    records[19]["time_checkpoint_s"] = 9.0  # step 20: a save thirty times an ordinary step
    (root,) = charts_of(run_decks.step_time_breakdown(records, BREAKDOWN_KEYS))
    assert "off the chart: step 20: 9.3" in svg_texts(root)  # its total, named (step 3's 1.0 s and 4's 0.7 s are not)
    y_ticks = [float(t) for t in svg_texts(root) if re.fullmatch(r"\d+\.\d+", t)]
    assert max(y_ticks) < 2.0  # the axis stops near the usual steps, not at 9.3
    (quiet,) = charts_of(run_decks.step_time_breakdown(breakdown_records(40), BREAKDOWN_KEYS))
    assert not any(t.startswith("off the chart") for t in svg_texts(quiet))
