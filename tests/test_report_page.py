"""The run report page (``reports.run_report``, ``reports.deck_html.page``): contents at the top linking to each
section and its parts, and charts as wide as the page (issue 51, item 7). Built from records written here: no run
is trained."""

from __future__ import annotations

import re

from reports import charts, plotting
from reports.deck_html import chart, page
from reports.run_report import report_pages
from storage import open_store
from tests.helpers import html_charts, view_of


def test_the_run_report_opens_with_contents_linking_every_section_and_its_parts(tmp_path):
    records = [{"step": s, "loss": 6.0 - s / 10, "step_time_s": 0.1, "time_data_s": 0.01} for s in range(1, 11)]
    records[4] |= {"heldout_loss": 5.6, "heldout_batches": 2}
    view = view_of(records, evaluations=[{"step": 10, "val_loss": 5.2, "perplexity": 181.3, "uri": "file:///e"}])
    html = report_pages(open_store(str(tmp_path)), "", view, charts.run_charts(view)).run
    contents = re.search(r"<nav class='contents' id='contents'>(.*?)</nav>", html).group(1)
    links = re.findall(r"<a href='#([^']+)'>([^<]*)</a>", contents)
    ids = re.findall(r" id='([^']+)'", html.replace(contents, ""))
    sections = re.findall(r"<section id='([^']+)'>", html)
    assert [text for target, text in links if target in sections] == ["Run", "Training curves", "Step time", "Warnings"]
    assert {"figures", "goodput", "step time by phase (rank 0)", "straggler warnings", "loss health events"} <= {
        text for _, text in links
    }
    assert [target for target, _ in links] == [i for i in ids if i != "contents"]  # each link has its place, in order
    assert len(set(ids)) == len(ids)
    assert re.findall(r"<h2>(.*?)</h2>", html) == ["Run", "Training curves", "Step time", "Warnings"]
    # The overview names the two kinds of validation point apart.
    assert "<th>held-out loss during training (2 batches)</th><td>5.6000 at step 5 (the latest)</td>" in html
    assert "<th>evaluation at step 10</th><td>val_loss 5.2000, perplexity 181.3, bits/byte -</td>" in html
    # A page of one section needs no contents.
    assert "<nav" not in page("Validation of dataset v", [("Data validation", "<h3>x</h3>")])


def test_charts_are_drawn_wide_and_take_the_width_of_the_page():
    figure = charts.series_figure([1, 2, 3], [1.0, 2.0, 3.0], "tokens/s", "tokens per second")
    (svg,) = html_charts(chart(figure))
    assert svg.get("style") == "width:100%;height:auto"  # scaled to the page; the viewBox keeps its shape
    width_pt = float(svg.get("viewBox").split()[2])
    assert plotting.SIZE[0] >= 10 and width_pt > 700  # drawn at about a page's width: its text stays readable
    assert "max-width:1400px" in page("t", [("a", ""), ("b", "")])
