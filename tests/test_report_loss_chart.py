"""The loss chart (``reports.charts.loss_figure``) and what it draws from (``runs.view.loss_history``): the training's
held-out loss and the evaluations' val_loss as two series (issue 51, item 2), one smoothing window for every run of
a chart, named in the legend, and legend swatches in the colours the lines are drawn in (item 7). Built from records
written here: no run is trained."""

from __future__ import annotations

import math

import pytest
from matplotlib.colors import to_hex

from reports import charts, plotting
from reports.plotting import COLORS
from runs.view import loss_history
from tests.helpers import svg_group, svg_ids, svg_marks, svg_root, svg_texts, view_of


def legend_of(fig):
    return fig.legends[0] if fig.legends else fig.axes[0].get_legend()


def entries(fig) -> list[tuple[str, str, str]]:
    """(label, colour, marker) of each legend entry."""
    legend = legend_of(fig)
    return [
        (t.get_text(), to_hex(h.get_color()), h.get_marker())
        for t, h in zip(legend.get_texts(), legend.legend_handles, strict=True)
    ]


def test_the_heldout_points_and_the_evaluations_are_two_series():
    records = [{"step": s, "loss": 6.0 - s / 10} for s in range(1, 11)]
    records[1] |= {"val_loss": 5.9}  # a run from before the rename: its held-out loss under val_loss
    records[4] |= {"heldout_loss": 5.6, "heldout_batches": 3}
    records[9] |= {"heldout_loss": 5.1, "heldout_batches": 3}
    records[6] |= {"skipped": True, "loss": math.nan, "heldout_loss": 9.9}  # a skipped step draws nothing
    evaluations = [
        {"step": 10, "val_loss": 5.0, "tokens_evaluated": 40_960},
        {"step": 5, "val_loss": 5.5},
        {"step": None, "val_loss": 1.0},
    ]
    history = loss_history(records, evaluations)
    assert history.heldout == [(2, 5.9), (5, 5.6), (10, 5.1)]
    assert history.evaluation == [(5, 5.5), (10, 5.0)]  # the step-10 evaluation not merged into the held-out points
    assert (history.heldout_batches, history.evaluation_batches, history.evaluation_tokens) == (3, None, 40_960)
    # Records without heldout_batches: the run's train.val_batches, from its checkpoint's meta.
    old = view_of([{"step": 1, "loss": 6.0, "val_loss": 5.9}], meta={"train": {"val_batches": 4}})
    assert old.loss.heldout == [(1, 5.9)] and old.loss.heldout_batches == 4

    fig = charts.loss_figure([charts.Curve.of("run", history)])
    root = svg_root(plotting.svg(fig))
    assert svg_ids(root, "heldout-") == ["heldout-0"] and svg_ids(root, "evaluation-") == ["evaluation-0"]
    assert svg_ids(root, "validation-") == []
    assert len(svg_marks(svg_group(root, "heldout-0"))) == 3 and len(svg_marks(svg_group(root, "evaluation-0"))) == 2
    texts = svg_texts(root)
    assert {"held-out loss during training (3 batches)", "evaluation val_loss (40,960 tokens)"} <= set(texts)
    markers = {label: marker for label, _, marker in entries(fig)}
    assert markers["held-out loss during training (3 batches)"] != markers["evaluation val_loss (40,960 tokens)"]


def test_one_runs_legend_is_drawn_in_the_runs_colour():
    steps = list(range(1, 21))
    curve = charts.Curve("loss", steps, [5 - s / 10 for s in steps], heldout=[(10, 4.2)], evaluation=[(20, 3.1)])
    curve.heldout_batches, curve.evaluation_batches = 2, 40
    fig = charts.loss_figure([curve])
    assert entries(fig) == [
        ("loss at each step", COLORS[0], "None"),
        ("centered moving average over 3 steps", COLORS[0], "None"),
        ("held-out loss during training (2 batches)", COLORS[0], "o"),
        ("evaluation val_loss (40 batches)", COLORS[0], "D"),
    ]
    drawn = {line.get_gid(): to_hex(line.get_color()) for line in fig.axes[0].get_lines()}
    assert set(drawn.values()) == {COLORS[0]}  # the lines the swatches stand for


def test_runs_compared_share_one_smoothing_window_and_their_legend_names_it():
    short = charts.Curve("a", list(range(1, 9)), [5.0 + (s % 2) for s in range(1, 9)])
    long = charts.Curve("b", list(range(1, 301)), [4.0 + (s % 3) / 3 for s in range(1, 301)], evaluation=[(300, 4.1)])
    fig = charts.loss_figure([short, long])
    width = charts.window_for(300)
    assert width == 15 and charts.shared_window([short, long]) == width
    lines = {line.get_gid(): line for line in fig.axes[0].get_lines()}
    for i, curve in enumerate((short, long)):
        assert list(lines[f"smooth-{i}"].get_ydata()) == pytest.approx(charts.smooth(curve.loss, width))
    # A line per run in its colour, then the kinds of line, in black under a heading saying they take the run's colour.
    assert entries(fig) == [
        ("a", COLORS[0], "None"),
        ("b", COLORS[1], "None"),
        (charts.KINDS_HEADING, to_hex("none"), "None"),  # a heading: no swatch
        ("loss at each step", "#000000", "None"),
        ("centered moving average over 15 steps", "#000000", "None"),
        ("evaluation val_loss", "#000000", "D"),
    ]
