"""`pretrain runs compare` and the comparison Deck on two real 2-rank training runs that differ only in
``train.lr``, and the loss chart itself (matplotlib SVG read back as XML, PNG checked by its header)."""

from __future__ import annotations

import json
import re
import statistics
import struct
from dataclasses import replace
from types import SimpleNamespace

import pytest

from cli.main import main as cli
from common.contracts import eval_prefix
from reports import charts, plotting, run_html, run_text
from runs.catalog import load_runs
from runs.view import final_loss
from storage import open_store
from tests.helpers import fresh_copy, run_metrics, svg_group, svg_ids, svg_lines, svg_marks, svg_root, svg_texts, tiny_model
from training.config import ParallelConfig, TrainConfig
from training.launch import launch
from training.train import train

STEPS = 6
CFG = TrainConfig(steps=STEPS, micro_batch_size=4, global_batch_size=8, warmup_steps=1, lr=3e-3, checkpoint_every=STEPS)
LRS = (3e-3, 1e-3)
PARALLEL = ParallelConfig(tensor_parallel=1, collective_timeout_s=300)  # a loaded machine: not a test of timeouts
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Two evaluations per run, as evaluation/evaluate.py commits them; the later one gives the figures.
EVALS = {"a": {3: (5.9, 2.61), STEPS: (5.7, 2.52)}, "b": {3: (6.0, 2.66), STEPS: (5.8, 2.57)}}


@pytest.fixture(scope="module")
def two_runs(tiny_dataset, tmp_path_factory):
    """Two runs in one store, the same but for train.lr, each with two committed evaluations."""
    dataset = fresh_copy(tiny_dataset, tmp_path_factory.mktemp("compare"))
    refs = [launch(train, 2, dataset, tiny_model(), PARALLEL, replace(CFG, lr=lr)) for lr in LRS]
    store = open_store(dataset.store)
    for ref, name in zip(refs, EVALS, strict=True):
        for step, (val_loss, bits) in EVALS[name].items():
            prefix = eval_prefix(ref.run, f"{name}-{step}")
            store.put_json(
                f"{prefix}/results.json",
                {"step": step, "val_loss": val_loss, "perplexity": 2.718**val_loss, "bits_per_byte": bits},
            )
            store.commit(prefix)
    return store, [ref.run.removeprefix("runs/") for ref in refs]


def pretrain(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = cli(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def section(lines: list[str], header: str, end: str) -> list[str]:
    first = next(i for i, line in enumerate(lines) if line.startswith(header))
    last = next(i for i, line in enumerate(lines) if i > first and line.startswith(end))
    return lines[first + 1 : last]


@pytest.mark.slow
def test_compare_prints_the_lr_difference_the_figures_and_writes_the_loss_png(two_runs, tmp_path, monkeypatch, capsys):
    store, (a, b) = two_runs
    monkeypatch.chdir(tmp_path)
    status, out, err = pretrain(capsys, "runs", "compare", a[:10], b, "--store", store.uri)
    assert status == 0, err
    print(out)  # the text the report quotes
    lines = out.splitlines()
    assert lines[1:3] == [f"  {a[:12]}  {store.url(f'runs/{a}')}", f"  {b[:12]}  {store.url(f'runs/{b}')}"]
    # One setting differs, and only it is listed: its two values side by side, under the two runs.
    assert re.match(r"config differences \(1 of \d+ settings\):", lines[3]), lines[3]
    header, row = section(lines, "config differences", "figures:")
    assert header.split() == ["setting", a[:12], b[:12]] and row.split() == ["train.lr", "0.003", "0.001"]

    rows = [re.split(r"\s{2,}", line.strip()) for line in section(lines, "figures:", "loss curves:")[1:]]
    figures = {row[0]: row[1:] for row in rows}
    metrics = [run_metrics(store, f"runs/{run}") for run in (a, b)]
    assert figures["steps"] == [f"{STEPS}/{STEPS}"] * 2
    assert figures["final train loss (last 10)"] == [f"{final_loss(m):.4f}" for m in metrics]
    assert final_loss(metrics[0]) != final_loss(metrics[1])  # the lr really changed the run
    assert figures[f"evaluation val_loss (step {STEPS})"] == ["5.7000", "5.8000"]  # the later evaluation, not step 3's
    assert figures["bits per byte"] == ["2.5200", "2.5700"]
    assert figures["tokens/s (median)"] == [f"{statistics.median_high(r['tokens_per_s'] for r in m):,.0f}" for m in metrics]
    assert figures["MFU (median)"] == [f"{statistics.median_high(r['mfu'] for r in m):.2%}" for m in metrics]

    image = tmp_path / f"loss-{a[:12]}-{b[:12]}.png"
    assert lines[-1] == f"loss curves: {image} ({image.stat().st_size:,} bytes)"
    width, height = png_size(image.read_bytes())
    assert 600 < width < 1400 and 250 < height < 700 and image.stat().st_size > 10_000


def test_compare_json_has_the_same_content(two_runs, tmp_path, capsys):
    store, (a, b) = two_runs
    out_file = tmp_path / "cmp.svg"
    status, out, _ = pretrain(capsys, "runs", "compare", a, b, "--json", "--out", str(out_file), "--store", store.uri)
    assert status == 0
    result = json.loads(out)
    assert result["differences"] == [{"key": "train.lr", "values": list(LRS)}]
    assert result["keys_compared"] > 20  # model.*, train.*, dataset, layouts: all compared, only lr differs
    metrics = [run_metrics(store, f"runs/{run}") for run in (a, b)]
    for row, run, m, name in zip(result["runs"], (a, b), metrics, EVALS, strict=True):
        assert (row["id"], row["steps_done"], row["steps_planned"], row["eval_step"]) == (run, STEPS, STEPS, STEPS)
        assert row["final_loss"] == pytest.approx(final_loss(m))
        assert (row["val_loss"], row["bits_per_byte"]) == EVALS[name][STEPS]
        assert row["tokens_per_s"] == pytest.approx(statistics.median_high(r["tokens_per_s"] for r in m))
    assert result["image"] == str(out_file) and result["image_bytes"] == out_file.stat().st_size
    root = svg_root(out_file.read_text())
    assert svg_ids(root, "smooth-") == ["smooth-0", "smooth-1"]
    assert [len(svg_marks(svg_group(root, f"evaluation-{i}"))) for i in (0, 1)] == [2, 2]

    status, _, err = pretrain(capsys, "runs", "compare", a, "nosuchrun", "--store", store.uri)
    assert status == 2 and err.startswith("error: no run 'nosuchrun' in ") and len(err.strip().splitlines()) == 1


def test_runs_are_shown_by_their_names_with_the_short_id_only_where_two_share_one():
    """Issue 51: a run's name for people (model, data, settings that differ) labels it; its id keys it."""
    views = [
        SimpleNamespace(id="a" * 16, name="gpt-tiny on python-stdlib"),
        SimpleNamespace(id="b" * 16, name="gpt-tiny on python-stdlib lr=0.001"),
        SimpleNamespace(id="c" * 12 + "1111", name="gpt-tiny on code+docs"),
        SimpleNamespace(id="c" * 12 + "2222", name="gpt-tiny on code+docs"),
        SimpleNamespace(id="d" * 16, name=""),  # a run of before names, or a direct launch
    ]
    assert run_text.column_names(views) == [
        "gpt-tiny on python-stdlib",
        "gpt-tiny on python-stdlib lr=0.001",
        "gpt-tiny on code+docs (cccccccccccc1111)",
        "gpt-tiny on code+docs (cccccccccccc2222)",
        "d" * 16,  # the ids as wide as the two that share their first 12 characters need
    ]


def test_the_comparison_deck_shows_the_same(two_runs):
    store, (a, b) = two_runs
    html = run_html.run_comparison(load_runs(store, [f"runs/{a}", b[:8]]), ["this execution", "production v1"])
    rows = re.search(r"<table class='differences'>(.*?)</table>", html).group(1).split("</tr>")[:-1]
    assert len(rows) == 2 and "this execution" in rows[0] and "production v1" in rows[0]
    assert rows[1] == "<tr><th>train.lr</th><td>0.003</td><td>0.001</td>"
    figures = re.search(r"<table class='figures'>(.*?)</table>", html).group(1)
    assert f"<tr><th>evaluation val_loss (step {STEPS})</th><td>5.7000</td><td>5.8000</td></tr>" in figures
    (svg,) = re.findall(r"<svg.*?</svg>", html, re.DOTALL)
    texts = svg_texts(svg_root(svg))
    assert {"this execution", "production v1", "step", "loss", "evaluation val_loss"} <= set(texts)
    with pytest.raises(ValueError, match="2 runs but 1 labels"):
        run_html.run_comparison(load_runs(store, [a, b]), ["one"])


def test_the_loss_chart_draws_each_run_raw_and_smoothed_with_its_evaluation_points():
    steps = list(range(1, 41))
    curves = [
        charts.Curve(
            "lr 3e-3", steps, [5 - s / 20 + (0.2 if s % 3 == 0 else 0) for s in steps], evaluation=[(20, 4.1), (40, 3.2)]
        ),
        charts.Curve("lr 1e-3", steps[:30], [5 - s / 40 for s in steps[:30]], evaluation=[(30, 4.3)]),
    ]
    fig = charts.loss_figure(curves)
    root = svg_root(plotting.svg(fig))
    assert svg_ids(root, "raw-") == ["raw-0", "raw-1"] and svg_ids(root, "smooth-") == ["smooth-0", "smooth-1"]
    assert svg_ids(root, "evaluation-") == ["evaluation-0", "evaluation-1"] and svg_ids(root, "heldout-") == []
    texts = svg_texts(root)
    assert {"step", "loss", "training loss", "lr 3e-3", "lr 1e-3", "evaluation val_loss"} <= set(texts)
    assert "centered moving average over 3 steps" in texts
    (raw0,) = svg_lines(svg_group(root, "raw-0"))
    (raw1,) = svg_lines(svg_group(root, "raw-1"))
    assert (len(raw0), len(raw1)) == (40, 30)
    # Each validation point at its step: x on the line through the raw curve's ends (steps 1 and 40).
    (x1, _), (x40, _) = raw0[0], raw0[-1]

    def x_of(step: int) -> float:
        return round(x1 + (step - 1) * (x40 - x1) / 39, 2)

    assert [round(x, 2) for x, _ in svg_marks(svg_group(root, "evaluation-0"))] == [x_of(20), x_of(40)]
    assert [round(x, 2) for x, _ in svg_marks(svg_group(root, "evaluation-1"))] == [x_of(30)]
    assert round(raw1[-1][0], 2) == x_of(30)  # the shorter run ends at its own last step

    png = plotting.png(fig)
    width, height = png_size(png)
    assert width > 600 and height > 250


def test_smoothing_is_a_centered_moving_average():
    assert charts.window_for(8) == 3 and charts.window_for(300) == 15 and charts.window_for(100) == 5
    assert charts.smooth([1.0, 2.0, 6.0, 4.0, 5.0], 3) == pytest.approx([1.5, 3.0, 4.0, 5.0, 4.5])
    assert charts.smooth([1.0, float("nan"), 3.0], 3) == pytest.approx([1.0, 2.0, 3.0])  # a NaN is left out
