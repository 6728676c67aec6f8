"""The train task's Decks: the stacked step-time plot, the straggler and loss-health tables."""

from __future__ import annotations

import re
from itertools import pairwise

from tasks import decks
from training.timing import BREAKDOWN_KEYS

LABELS = ["data", "forward+backward", "collective", "optimizer", "checkpoint", "other"]
POLYGON = re.compile(r"<polygon class='area'[^>]*points='([^']*)'>")


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


def areas(html: str) -> list[list[tuple[float, float]]]:
    return [[tuple(map(float, p.split(","))) for p in points.split()] for points in POLYGON.findall(html)]


def test_stacked_plot_has_one_area_per_phase_a_legend_and_axis_labels():
    records = [{"step": 0, "loss": 9.0}] + breakdown_records(5)  # a record without a breakdown is left out
    html = decks.step_time_breakdown(records, BREAKDOWN_KEYS)
    shapes = areas(html)
    assert len(shapes) == len(BREAKDOWN_KEYS) == 6
    assert re.findall(r"<text class='legend'[^>]*>([^<]*)</text>", html) == LABELS
    assert re.search(r"<text class='x-label'[^>]*>step</text>", html)
    assert re.search(r"<text class='y-label'[^>]*>seconds per step</text>", html)
    assert ">1</text>" in html and ">5</text>" in html  # the x axis spans steps 1 to 5
    n = 5
    # Stacked: each area's lower edge is the one below's upper edge, the first sits on the axis.
    baseline = {y for _, y in shapes[0][n:]}
    assert len(baseline) == 1
    for below, above in pairwise(shapes):
        assert [y for _, y in above[n:]] == [y for _, y in reversed(below[:n])]
    # The top edge is the step time: highest (smallest y) at the slow step 3, then the checkpoint step 4.
    top = [y for _, y in shapes[-1][:n]]
    assert sorted(range(n), key=top.__getitem__)[:2] == [2, 3]
    # The checkpoint's area has height only at step 4.
    checkpoint = shapes[BREAKDOWN_KEYS.index("time_checkpoint_s")]
    heights = [lo - hi for (_, hi), (_, lo) in zip(checkpoint[:n], reversed(checkpoint[n:]), strict=True)]
    assert [h > 0 for h in heights] == [False, False, False, True, False]


def test_a_run_without_a_breakdown_says_so():
    assert "no data" in decks.step_time_breakdown([{"step": 1, "loss": 3.0}], BREAKDOWN_KEYS)
    single = decks.step_time_breakdown(breakdown_records(1), BREAKDOWN_KEYS)
    assert len(areas(single)) == 6  # one step still draws every phase


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
    html = decks.run_warnings(records)
    stragglers = re.search(r"<table class='stragglers'>(.*?)</table>", html).group(1)
    assert stragglers.count("<tr>") == 2  # the header and step 4's warning
    assert "<td>4</td><td>1</td><td>2.5</td><td>rank 1 has been the slowest for 2 windows</td>" in stragglers
    health = re.search(r"<table class='health'>(.*?)</table>", html).group(1)
    assert health.count("<tr>") == 2
    assert "<td>6</td><td>nan</td><td>skipped</td><td>loss is nan</td>" in health
    assert "train-00003.tar (3 rows)" in health


def test_a_quiet_run_says_none_twice():
    html = decks.run_warnings(breakdown_records(3))
    assert html.count("<p>none</p>") == 2 and "<table class='stragglers'>" not in html and "<table class='health'>" not in html


def test_strings_are_escaped():
    hostile = "<script>alert('x')</script>"
    records = breakdown_records(2)
    records[0] |= {"straggler_warning": hostile, "slowest_rank": hostile}
    records[1] |= {
        "health": {"step": 2, "loss": 1.0, "problem": hostile, "action": hostile, "batch": {"shards": [{"shard": hostile}]}}
    }
    html = decks.run_warnings(records)
    assert "<script>" not in html and "alert('x')" not in html
    assert html.count("&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;") == 5
    chart = decks.stacked_area_chart([1, 2], [(hostile, [1.0, 2.0])], hostile, hostile, hostile)
    assert "<script>" not in chart and chart.count("&lt;script&gt;") == 5  # title, area tooltip, legend, both axes
