"""`pretrain runs list`, `pretrain runs show` and `pretrain runs report` on a real 2-rank run: profiled, with one
step whose loss was NaN (skipped), its straggler exchanges and checkpoints, read from a local folder and from S3."""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import statistics
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from cli.main import main as cli
from common.contracts import diagnostics_prefix, eval_prefix, profile_prefix, validation_prefix
from runs.reading import load_run
from storage import open_store
from tests.helpers import (
    copy_run,
    fresh_copy,
    html_charts,
    html_table,
    run_decks,
    run_metrics,
    svg_group,
    svg_marks,
    svg_texts,
    tiny_model,
    train_with_bad_loss,
)
from training.config import ParallelConfig, TrainConfig
from training.launch import launch

MODEL = tiny_model()
NAN_STEP = 6
CFG = TrainConfig(
    steps=8,
    micro_batch_size=4,
    global_batch_size=8,
    warmup_steps=2,
    lr=3e-3,
    checkpoint_every=4,
    profile="3-4",
    straggler_every=2,
    on_bad_loss="skip",
    log_every=4,
)
# Two data-parallel ranks: a real gradient all-reduce every step. A generous timeout: the machine is shared.
PARALLEL = ParallelConfig(tensor_parallel=1, collective_timeout_s=300)


@pytest.fixture(scope="module")
def profiled_run(tiny_dataset, tmp_path_factory):
    """One run for the module: steps 3-4 profiled, step 6's loss NaN on rank 0 (so the mean on both), skipped."""
    dataset = fresh_copy(tiny_dataset, tmp_path_factory.mktemp("runs-cli"))
    return launch(train_with_bad_loss, 2, NAN_STEP, (0,), dataset, MODEL, PARALLEL, CFG)


def pretrain(capsys, *args: str) -> tuple[int, str, str]:
    """``pretrain *args`` in this process: exit status, stdout, stderr."""
    capsys.readouterr()
    status = cli(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def run_id(ref) -> str:
    return ref.run.removeprefix("runs/")


@pytest.mark.slow
def test_list_shows_the_run_with_its_steps_loss_and_layout(profiled_run, capsys):
    store = open_store(profiled_run.store)
    metrics = run_metrics(store, profiled_run.run)
    applied = [m["loss"] for m in metrics if "skipped" not in m][-10:]
    assert len(applied) == CFG.steps - 1

    status, out, _ = pretrain(capsys, "runs", "list", "--json", "--store", store.uri)
    assert status == 0
    (row,) = json.loads(out)
    assert row["id"] == run_id(profiled_run)
    assert (row["steps_done"], row["steps_planned"], row["last_checkpoint"], row["skipped_steps"]) == (8, 8, 8, 1)
    assert math.isfinite(row["final_loss"]) and row["final_loss"] == pytest.approx(sum(applied) / len(applied))
    assert row["tokens_per_s"] == pytest.approx(statistics.median_high(m["tokens_per_s"] for m in metrics))
    assert row["layout"] == "TP1 PP1 DP2"
    assert row["dataset"] == profiled_run.dataset.version
    assert abs(row["modified"] - time.time()) < 3600

    status, out, _ = pretrain(capsys, "runs", "list", "--store", store.uri)
    (line,) = out.strip().splitlines()
    assert line.startswith(f"{row['id']}  steps 8/8  checkpoint 8  loss {row['final_loss']:.4f}  "), line
    assert "TP1 PP1 DP2" in line and f"dataset {profiled_run.dataset.version[:12]}" in line and line.endswith(" UTC")


def test_show_json_breaks_down_step_time_and_points_at_traces_and_health(profiled_run, capsys):
    store = open_store(profiled_run.store)
    status, out, _ = pretrain(capsys, "runs", "show", run_id(profiled_run)[:6], "--json", "--store", store.uri)
    assert status == 0
    show = json.loads(out)
    assert show["id"] == run_id(profiled_run)

    # Step time: every phase measured, and together they account for the steps (checkpoint saves included).
    phases = {row["phase"]: row for row in show["breakdown"]["phases"]}
    assert list(phases)[:4] == ["data", "forward_backward", "collective", "optimizer"] and "other" in phases
    assert sum(row["share"] for row in phases.values()) == pytest.approx(1.0, abs=0.02)
    assert phases["forward_backward"]["median_s"] > 0 and phases["collective"]["median_s"] > 0
    assert phases["checkpoint"]["total_s"] > 0  # two saves, part of their steps' time
    assert show["breakdown"]["steps"] == CFG.steps

    # Every rank from step_times.jsonl; the slowest is the one with the most busy time.
    ranks = show["ranks"]["ranks"]
    assert [(r["rank"], r["steps"]) for r in ranks] == [(0, 8), (1, 8)]
    busiest = max(ranks, key=lambda r: r["busy_s"])
    assert show["ranks"]["slowest_rank"] == busiest["rank"]
    assert show["ranks"]["slowest_ratio"] == pytest.approx(busiest["busy_s"] / min(r["busy_s"] for r in ranks))
    assert show["stragglers"]["windows"] == CFG.steps // CFG.straggler_every

    # The profiled window: one gzip'd Chrome trace per rank, each in the store.
    (window,) = show["files"]["profiles"]
    assert (window["first"], window["last"]) == (3, 4)
    prefix = profile_prefix(profiled_run.run, 3, 4)
    assert window["traces"] == [store.url(f"{prefix}/rank_{rank:05d}.pt.trace.json.gz") for rank in (0, 1)]
    trace = json.loads(gzip.decompress(store.get_bytes(f"{prefix}/rank_00001.pt.trace.json.gz")))
    assert trace["traceEvents"]

    # The skipped step, with the rows of its batch.
    (event,) = show["health"]
    assert (event["step"], event["action"]) == (NAN_STEP, "skipped") and "nan" in event["problem"]
    assert event["batch"]["shards"] and all(s["shard"].startswith(store.url("datasets/")) for s in event["batch"]["shards"])

    assert show["layout_history"] == [
        {
            "first_step": 1,
            "last_step": 8,
            "layout": {
                "world_size": 2,
                "tensor_parallel": 1,
                "pipeline_parallel": 1,
                "distributed_optimizer": False,
                "fsdp": False,
            },
        }
    ]
    assert show["config"]["model"] == asdict(MODEL) and show["config"]["train"]["profile"] == "3-4"
    assert [c["step"] for c in show["checkpoints"]] == [4, 8]
    assert show["files"]["diagnostics"] == []


def test_show_prints_the_run_for_a_person(profiled_run, capsys):
    store = open_store(profiled_run.store)
    status, out, _ = pretrain(capsys, "runs", "show", run_id(profiled_run), "--store", store.uri)
    assert status == 0
    print(out)  # the text a person reads (docs/troubleshooting.md describes it)
    lines = out.splitlines()
    assert lines[0].startswith(f"run {run_id(profiled_run)}  {store.url(profiled_run.run)}")
    assert (
        "  steps 1-8: 2 ranks, tensor_parallel=1, pipeline_parallel=1, data_parallel=2, distributed_optimizer=false, fsdp=false"
        in lines
    )
    assert any(line.startswith("  collective ") for line in lines)
    assert any(line.startswith("  slowest rank ") for line in lines)
    assert f"  step {NAN_STEP}: loss is nan (skipped); the batch's rows:" in lines
    assert "  profile of steps 3-4 (Perfetto, TensorBoard's profiler):" in lines
    prefix = profile_prefix(profiled_run.run, 3, 4)
    assert f"    {store.url(f'{prefix}/rank_00000.pt.trace.json.gz')}" in lines


def test_runs_on_s3_list_with_their_time_and_show_traces_and_diagnostics(profiled_run, s3_store, capsys):
    local = open_store(profiled_run.store)
    run = copy_run(local, profiled_run.run, s3_store)
    # What a GPU run and a stall would add, written as they would be: the listing is what is tested here.
    stacks = f"{diagnostics_prefix(run)}/rank_00001.stacks.txt"
    s3_store.put_bytes(stacks, b"rank 1: stalled\n")
    snapshot = f"{profile_prefix(run, 3, 4)}/rank_00000.memory_snapshot.pickle"
    s3_store.put_bytes(snapshot, b"snapshot")
    evaluation = eval_prefix(run, "k1")
    s3_store.put_json(f"{evaluation}/results.json", {"step": 8, "val_loss": 5.5, "perplexity": 244.7, "bits_per_byte": 2.1})
    s3_store.commit(evaluation)
    s3_store.put_json(f"{eval_prefix(run, 'k2')}/results.json", {"step": 8, "val_loss": 9.9})  # never committed

    status, out, _ = pretrain(capsys, "runs", "list", "--json", "--store", s3_store.uri)
    assert status == 0
    (row,) = json.loads(out)
    assert (row["id"], row["steps_done"], row["last_checkpoint"]) == (run_id(profiled_run), 8, 8)
    assert abs(row["modified"] - time.time()) < 600  # the copy's S3 LastModified

    status, out, _ = pretrain(capsys, "runs", "show", row["id"], "--json", "--store", s3_store.uri)
    assert status == 0
    show = json.loads(out)
    (window,) = show["files"]["profiles"]
    profiles = f"{s3_store.uri}/{run}/tensorboard/plugins/profile/"
    assert len(window["traces"]) == 2 and all(url.startswith(profiles) for url in window["traces"])
    assert all(s3_store.exists(url.removeprefix(f"{s3_store.uri}/")) for url in window["traces"])
    assert window["memory_snapshots"] == [s3_store.url(snapshot)]
    assert show["files"]["diagnostics"] == [s3_store.url(stacks)]
    assert [(e["uri"], e["val_loss"]) for e in show["evaluations"]] == [(s3_store.url(evaluation), 5.5)]
    assert [e["step"] for e in show["health"]] == [NAN_STEP]
    assert sum(row["share"] for row in show["breakdown"]["phases"]) == pytest.approx(1.0, abs=0.02)


def test_runs_sort_newest_first_and_a_bad_run_id_is_one_line_with_status_2(profiled_run, tmp_path, capsys):
    local = open_store(profiled_run.store)
    store = open_store(str(tmp_path / "store"))
    status, out, _ = pretrain(capsys, "runs", "list", "--store", store.uri)
    assert (status, out.strip()) == (0, f"no training runs in {store.uri}")

    older, newer = "abc1" + run_id(profiled_run)[4:], "abc2" + run_id(profiled_run)[4:]
    for name, age in ((older, 7200), (newer, 60)):
        copy_run(local, profiled_run.run, store, f"runs/{name}")
        when = time.time() - age
        os.utime(Path(store.uri) / "runs" / name / "metrics.jsonl", (when, when))
    status, out, _ = pretrain(capsys, "runs", "list", "--json", "--store", store.uri)
    assert [row["id"] for row in json.loads(out)] == [newer, older]

    status, out, err = pretrain(capsys, "runs", "show", "abc", "--store", store.uri)
    assert status == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("error: run 'abc' is ambiguous") and older in line and newer in line

    status, out, err = pretrain(capsys, "runs", "show", "zzz", "--json", "--store", store.uri)
    assert status == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("error: no run 'zzz' in ") and older in line and newer in line

    status, out, _ = pretrain(capsys, "runs", "show", "abc2", "--json", "--store", store.uri)
    assert status == 0 and json.loads(out)["id"] == newer


VALIDATION_RESULT = {
    "success": True,
    "outcomes": [
        {
            "suite": "dataset",
            "expectation": "expect_column_max_to_be_between",
            "column": "skipped_fraction",
            "success": True,
            "observed": "0.1",
            "expected": "max_value=0.5",
        }
    ],
    "modified": [],
}


def test_report_is_one_offline_page_of_the_runs_decks_its_dataset_and_validation(profiled_run, tmp_path, capsys):
    store = open_store(fresh_copy(profiled_run.dataset, tmp_path / "store").store)  # the run's dataset, committed
    run = copy_run(open_store(profiled_run.store), profiled_run.run, store)
    for step, val_loss in ((4, 5.9), (8, 5.4)):  # two evaluations, committed as evaluate_model commits them
        store.put_json(f"{eval_prefix(run, f'k{step}')}/results.json", {"step": step, "val_loss": val_loss, "perplexity": 2.7})
        store.commit(eval_prefix(run, f"k{step}"))
    store.put_json(f"{validation_prefix(profiled_run.dataset.prefix)}/result.json", VALIDATION_RESULT)
    store.commit(validation_prefix(profiled_run.dataset.prefix))

    # The train task's Decks take the run's committed evaluations as the loss chart's evaluation points.
    decks = run_decks(load_run(store, run.removeprefix("runs/")))
    assert list(decks) == ["Training curves", "Step time", "Warnings"]
    (loss, *_) = html_charts(decks["Training curves"])
    assert len(svg_marks(svg_group(loss, "evaluation-0"))) == 2

    out = tmp_path / "reports" / "run.html"
    status, printed, _ = pretrain(capsys, "runs", "report", run_id(profiled_run)[:6], "--out", str(out), "--store", store.uri)
    assert status == 0 and printed.startswith(f"report of run {run_id(profiled_run)}: {out}")
    html = out.read_text()
    sections = re.findall(r"<h2>(.*?)</h2>", html)
    assert sections[:5] == ["Run", "Training curves", "Step time", "Warnings", "Dataset"] and "Data validation" in sections
    # The contents link to every section.
    assert all(f"<a href='#{section_id}'>" in html for section_id in re.findall(r"<section id='([^']+)'>", html))
    # The loss chart with the two evaluation points, the higher loss (step 4) drawn higher up.
    (loss,) = [c for c in html_charts(html) if svg_group(c, "evaluation-0") is not None]
    (early, late) = svg_marks(svg_group(loss, "evaluation-0"))
    assert early[0] < late[0] and early[1] < late[1] and "evaluation val_loss" in svg_texts(loss)
    # The phase table `runs show` prints and a row per rank.
    phases = [row[0] for row in html_table(html, "phases")[1:]]
    assert phases == ["data", "forward+backward", "collective", "optimizer", "checkpoint", "other"]
    assert [row[:2] for row in html_table(html, "ranks")[1:]] == [["0", "8"], ["1", "8"]]
    assert "<td>6</td><td>nan</td><td>skipped</td>" in html  # the NaN step, among the warnings
    assert "documents skipped, by reason" in html and "PASSED: all 1 expectations" in html
    # Self-contained: no script, and no address but the SVG namespaces' (names, never fetched).
    assert "<script" not in html.lower() and "<link" not in html.lower()
    assert not re.findall(r"https?://", re.sub(r'xmlns(:\w+)?="http://www\.w3\.org/[^"]*"', "", html))
