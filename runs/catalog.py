"""Training runs as the store holds them, for ``pretrain runs list`` and ``pretrain runs show``.

Read-only, and torch-free so that the command starts fast: everything comes from the files a run
leaves under ``runs/<id>/`` (``common.contracts`` names them):

- ``metrics.jsonl``: one record per step (loss, tokens/s, MFU, memory, the ``time_<phase>_s``
  breakdown, the straggler summary on exchange steps, ``skipped``/``health`` on refused steps);
- ``step_times.jsonl``: every rank's breakdown of every step, gathered at the straggler exchanges;
- ``health.jsonl``: loss-health events;
- ``checkpoints/step-NNNNNNN/meta.json`` of the latest committed checkpoint: configs, layout history,
  dataset version;
- ``tensorboard/plugins/profile/steps_A-B/``: profiler traces and memory snapshots per rank;
- ``diagnostics/``: stacks and flight-recorder dumps of stalled ranks;
- ``eval/<key>/results.json``: committed evaluations;
- ``goodput/attempt-*.json``: each training attempt's goodput ledger (``training.runs.goodput``).

A run is found by its id or a unique prefix of it (``resolve_run``).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import Counter
from typing import Any

from common.contracts import (
    CHECKPOINT_META,
    EVAL_RESULTS,
    MEMORY_SNAPSHOT_SUFFIX,
    TRACE_SUFFIX,
    checkpoint_prefix,
    committed_steps,
    diagnostics_prefix,
    eval_prefix,
    health_key,
    metrics_key,
    run_prefix,
    step_times_key,
    tensorboard_prefix,
)
from common.errors import UserError
from common.settings import flat_settings
from storage import Store
from training.runs.goodput import Goodput, goodput_prefix, load_goodput
from training.runs.runlog import read_jsonl

RUNS = "runs"
FINAL_LOSS_STEPS = 10
"""The final loss is the mean over this many last accepted steps, as in the training summary."""
SHORT_ID = 12
"""Characters of a run id or dataset version shown in a listing."""

_PHASE_KEY = re.compile(r"^time_(?P<phase>.+)_s$")
_WINDOW = re.compile(r"^steps_(?P<first>\d+)-(?P<last>\d+)$")


class RunNotFound(UserError, LookupError):
    """No run, or more than one, matches the id or prefix given."""


# -- finding runs ---------------------------------------------------------------------------
def run_ids(store: Store) -> list[str]:
    """The ids of every run in the store, sorted."""
    return store.children(RUNS)


def resolve_run(store: Store, text: str) -> str:
    """The id of the run ``text`` names: its id, ``runs/<id>``, or a prefix of the id matching one run only."""
    wanted = text.strip().removeprefix(f"{RUNS}/").rstrip("/")
    ids = run_ids(store)
    if wanted in ids:
        return wanted
    matches = [i for i in ids if wanted and i.startswith(wanted)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise RunNotFound(
            f"run {text!r} is ambiguous in {store.uri}: {len(matches)} runs start with it ({_names(matches)}); "
            "give more characters of the id"
        )
    known = f"runs there: {_names(ids)}" if ids else "it holds no runs"
    raise RunNotFound(f"no run {text!r} in {store.uri} ({known}); `pretrain runs list --store {store.uri}` lists them")


def _names(ids: list[str], most: int = 8) -> str:
    shown = ", ".join(ids[:most])
    return f"{shown} and {len(ids) - most} more" if len(ids) > most else shown


# -- reading a run's files ----------------------------------------------------------------
def _median(values: list[float]) -> float | None:
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return statistics.median(values) if values else None


def final_loss(metrics: list[dict]) -> float | None:
    """Mean loss of the last ``FINAL_LOSS_STEPS`` steps whose update was applied (a skipped step's loss
    may be NaN: it says nothing about where training is)."""
    accepted = [m["loss"] for m in metrics if "skipped" not in m and isinstance(m.get("loss"), (int, float))]
    last = [v for v in accepted[-FINAL_LOSS_STEPS:] if math.isfinite(v)]
    return sum(last) / len(last) if last else None


def _layout_short(span: dict) -> str:
    layout = span["layout"]
    tp, pp, world = layout["tensor_parallel"], layout["pipeline_parallel"], layout["world_size"]
    text = f"TP{tp} PP{pp} DP{world // (tp * pp)}"
    return text + (" distopt" if layout.get("distributed_optimizer") else "") + (" fsdp" if layout.get("fsdp") else "")


def _layouts(meta: dict) -> list[dict]:
    """The meta.json's layout history; a checkpoint older than the history names only its own layout."""
    if "layouts" in meta:
        return list(meta["layouts"])
    if "layout" in meta:
        return [{"first_step": 1, "last_step": meta.get("step", 0), "layout": meta["layout"]}]
    return []


def _latest_meta(store: Store, run: str, steps: list[int]) -> dict:
    return store.get_json(f"{checkpoint_prefix(run, steps[-1])}/{CHECKPOINT_META}") if steps else {}


def summary(store: Store, run_id: str, goodput: Goodput | None = None) -> dict[str, Any]:
    """One row of ``pretrain runs list``: progress, final figures, goodput (the productive fraction of its wall
    time), layout, dataset, last change. ``goodput``: the run's, when the caller has loaded it already."""
    run = run_prefix(run_id)
    goodput = goodput or load_goodput(store, run)
    steps = committed_steps(store, run)
    meta = _latest_meta(store, run, steps)
    metrics = read_jsonl(store, metrics_key(run))
    layouts = _layouts(meta)
    mfu = _median([m["mfu"] for m in metrics if m.get("mfu") is not None])
    return {
        "id": run_id,
        "uri": store.url(run),
        "steps_done": max((m["step"] for m in metrics), default=steps[-1] if steps else 0),
        "steps_planned": meta.get("train", {}).get("steps"),
        "last_checkpoint": steps[-1] if steps else None,
        "final_loss": final_loss(metrics),
        "final_loss_steps": min(FINAL_LOSS_STEPS, sum(1 for m in metrics if "skipped" not in m)),
        "tokens_per_s": _median([m.get("tokens_per_s") for m in metrics]),
        "mfu": mfu,
        "goodput": goodput.fraction if goodput is not None else None,
        "layout": _layout_short(layouts[-1]) if layouts else None,
        "layouts": len(layouts),
        "dataset": meta.get("dataset"),
        "skipped_steps": sum(1 for m in metrics if "skipped" in m),
        "modified": _modified(store, run, steps),
    }


def _modified(store: Store, run: str, steps: list[int]) -> float | None:
    """When the run last wrote: its metrics.jsonl (rank 0 rewrites it at every checkpoint and at the end),
    else its latest checkpoint's meta.json."""
    when = store.modified(metrics_key(run))
    if when is None and steps:
        when = store.modified(f"{checkpoint_prefix(run, steps[-1])}/{CHECKPOINT_META}")
    return when


def list_runs(store: Store) -> list[dict[str, Any]]:
    """Every run's ``summary``, the most recently changed first (runs whose time is unknown last, by id)."""
    rows = [summary(store, run_id) for run_id in run_ids(store)]
    return sorted(rows, key=lambda r: (r["modified"] is None, -(r["modified"] or 0.0), r["id"]))


# -- one run in detail ----------------------------------------------------------------------
def phases_of(records: list[dict]) -> list[str]:
    """The breakdown's phases, in the order the records hold them (``time_<phase>_s`` keys)."""
    seen: dict[str, None] = {}
    for record in records:
        for key in record:
            match = _PHASE_KEY.match(key)
            if match:
                seen.setdefault(match["phase"])
    return list(seen)


def breakdown(metrics: list[dict]) -> dict[str, Any]:
    """Rank 0's step time over the run, per phase: the median seconds of a step, the total, and the share of
    all steps' ``step_time_s`` (a step's time includes its checkpoint save). The shares sum to 1 when the
    phases account for the steps: 'other' is what no phase covered."""
    records = [m for m in metrics if "step_time_s" in m]
    phases = phases_of(records)
    wall = sum(m["step_time_s"] for m in records)
    rows = []
    for phase in phases:
        values = [m.get(f"time_{phase}_s", 0.0) for m in records]
        total = sum(values)
        rows.append({"phase": phase, "median_s": _median(values), "total_s": total, "share": total / wall if wall else None})
    return {"steps": len(records), "wall_s": wall, "median_step_s": _median([m["step_time_s"] for m in records]), "phases": rows}


def ranks(step_times: list[dict]) -> dict[str, Any]:
    """Every rank over the steps ``step_times.jsonl`` holds: median step and phase seconds, and its busy
    time (step minus collective waits, summed), which finds the slowest rank as the straggler exchange does;
    ``slowest_ratio`` is its busy time over the median of the other ranks'."""
    by_rank: dict[int, list[dict]] = {}
    for line in step_times:
        by_rank.setdefault(int(line["rank"]), []).append(line)
    if not by_rank:
        return {"steps": 0, "ranks": [], "slowest_rank": None, "slowest_ratio": None}
    phases = phases_of(step_times)
    rows = []
    for rank, lines in sorted(by_rank.items()):
        busy = sum(line["step_s"] - line.get("time_collective_s", 0.0) for line in lines)
        rows.append(
            {
                "rank": rank,
                "steps": len(lines),
                "median_step_s": _median([line["step_s"] for line in lines]),
                "busy_s": busy,
                "median_s": {p: _median([line.get(f"time_{p}_s", 0.0) for line in lines]) for p in phases},
            }
        )
    slowest = max(rows, key=lambda r: r["busy_s"])
    # Against the median of the *other* ranks, as the straggler exchange compares: with the slowest counted
    # in, two ranks could never differ by more than 2× (the median of two is their mean).
    others = [r["busy_s"] for r in rows if r is not slowest] or [slowest["busy_s"]]
    median_busy = statistics.median(others)
    return {
        "steps": len({line["step"] for line in step_times}),
        "ranks": rows,
        "slowest_rank": slowest["rank"],
        "slowest_ratio": slowest["busy_s"] / median_busy if median_busy > 0 else None,
    }


def stragglers(metrics: list[dict]) -> dict[str, Any]:
    """The straggler exchanges recorded in the metrics: which rank was slowest how often, the worst
    window, and the warnings."""
    windows = [
        {"window": m["window"], "slowest_rank": m["slowest_rank"], "slowest_ratio": m["slowest_ratio"]}
        for m in metrics
        if "slowest_rank" in m
    ]
    worst = max(windows, key=lambda w: w["slowest_ratio"], default=None)
    counts = Counter(w["slowest_rank"] for w in windows)
    return {
        "windows": len(windows),
        "slowest_counts": {str(rank): n for rank, n in sorted(counts.items())},
        "worst": worst,
        "warnings": [{"step": m["step"], "message": m["straggler_warning"]} for m in metrics if "straggler_warning" in m],
    }


def _files(store: Store, run: str) -> dict[str, Any]:
    """Store URLs of the run's profiles (per window), memory snapshots and diagnostics."""
    base = f"{tensorboard_prefix(run)}/plugins/profile"
    windows: dict[str, dict[str, Any]] = {}
    for key in store.list(f"{base}/"):
        folder, _, name = store.relative(base, key).partition("/")
        match = _WINDOW.match(folder)
        if not match or "/" in name:
            continue
        window = windows.setdefault(
            folder,
            {"first": int(match["first"]), "last": int(match["last"]), "uri": store.url(f"{base}/{folder}"), "traces": []},
        )
        window.setdefault("memory_snapshots", [])
        if name.endswith(TRACE_SUFFIX):
            window["traces"].append(store.url(key))
        elif name.endswith(MEMORY_SNAPSHOT_SUFFIX):
            window["memory_snapshots"].append(store.url(key))
    return {
        "metrics": store.url(metrics_key(run)),
        "step_times": store.url(step_times_key(run)),
        "health": store.url(health_key(run)),
        "tensorboard": store.url(tensorboard_prefix(run)),
        "goodput": store.url(goodput_prefix(run)),
        "profiles": sorted(windows.values(), key=lambda w: (w["first"], w["last"])),
        "diagnostics": [store.url(key) for key in store.list(f"{diagnostics_prefix(run)}/")],
    }


def _evaluations(store: Store, run: str) -> list[dict[str, Any]]:
    out = []
    for key in store.children(f"{run}/eval"):
        prefix = eval_prefix(run, key)
        if not store.is_committed(prefix):
            continue
        results = store.get_json(f"{prefix}/{EVAL_RESULTS}")
        figures = ("step", "val_loss", "perplexity", "bits_per_byte", "tokens_evaluated")
        out.append({"uri": store.url(prefix), **{k: results[k] for k in figures if k in results}})
    return sorted(out, key=lambda e: (e.get("step") or 0, e["uri"]))


def show(store: Store, text: str) -> dict[str, Any]:
    """Everything ``pretrain runs show`` prints of the run ``text`` names (id or unique prefix)."""
    run_id = resolve_run(store, text)
    run = run_prefix(run_id)
    steps = committed_steps(store, run)
    meta = _latest_meta(store, run, steps)
    metrics = read_jsonl(store, metrics_key(run))
    health = read_jsonl(store, health_key(run))
    if not health:  # a run from before health.jsonl: its refused steps carry the event
        health = [m["health"] for m in metrics if "health" in m]
    memory = [m["peak_memory_mib"] for m in metrics if isinstance(m.get("peak_memory_mib"), (int, float))]
    goodput = load_goodput(store, run)
    return {
        **summary(store, run_id, goodput),
        "goodput": goodput.to_dict() if goodput is not None else None,
        "checkpoints": [{"step": s, "uri": store.url(checkpoint_prefix(run, s))} for s in steps],
        "config": {"model": meta.get("model"), "train": meta.get("train")},
        "layout_history": _layouts(meta),
        "first_loss": metrics[0]["loss"] if metrics else None,
        "peak_memory_mib": max(memory) if memory else None,
        "data_wait_fraction": _median([m.get("data_wait_fraction") for m in metrics]),
        "peak_flops_source": next((m["peak_flops_source"] for m in reversed(metrics) if m.get("peak_flops_source")), None),
        "breakdown": breakdown(metrics),
        "ranks": ranks(read_jsonl(store, step_times_key(run))),
        "stragglers": stragglers(metrics),
        "health": health,
        "evaluations": _evaluations(store, run),
        "files": _files(store, run),
    }


# -- several runs side by side ----------------------------------------------------------------
def flat_config(meta: dict) -> dict[str, Any]:
    """The settings a run was trained with, flattened to ``section.key`` (``train.lr``, ``model.num_layers``),
    plus ``dataset`` (its version) and ``layouts`` (which layout trained which steps), from its latest
    checkpoint's meta.json; {} for a run with no committed checkpoint."""
    flat: dict[str, Any] = {}
    if meta.get("dataset") is not None:
        flat["dataset"] = meta["dataset"]
    for section in ("model", "train"):
        flat.update(flat_settings(meta.get(section) or {}, f"{section}."))
    layouts = _layouts(meta)
    if layouts:
        flat["layouts"] = "; ".join(f"{s['first_step']}-{s['last_step']} {_layout_short(s)}" for s in layouts)
    return flat


def differences(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The keys whose value is not the same in every config (a key some lack counts as differing, the missing
    value None), sorted: ``[{"key": "train.lr", "values": [0.003, 0.001]}, ...]``."""
    keys = sorted(set().union(*configs)) if configs else []
    out = []
    for key in keys:
        values = [config.get(key) for config in configs]
        if any(v != values[0] for v in values[1:]):
            out.append({"key": key, "values": values})
    return out


def latest_evaluation(evaluations: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The evaluation at the highest step (``_evaluations`` sorts them by step, then by where they are)."""
    return evaluations[-1] if evaluations else None


def compare(store: Store, texts: list[str]) -> dict[str, Any]:
    """What ``pretrain runs compare`` prints of the runs ``texts`` name (ids or unique prefixes), from the store
    alone: the config keys that differ between them and each run's figures (final train loss, the latest
    evaluation's validation loss, perplexity and bits per byte, median tokens/s and MFU, steps)."""
    ids = [resolve_run(store, text) for text in texts]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise UserError(f"run {twice[0]} is named more than once ({', '.join(texts)}); name each run to compare once")
    configs, runs = [], []
    for run_id in ids:
        run = run_prefix(run_id)
        meta = _latest_meta(store, run, committed_steps(store, run))
        configs.append(flat_config(meta))
        row = summary(store, run_id)
        evaluation = latest_evaluation(_evaluations(store, run)) or {}
        runs.append(
            {
                "id": run_id,
                "uri": row["uri"],
                "steps_done": row["steps_done"],
                "steps_planned": row["steps_planned"],
                "final_loss": row["final_loss"],
                "final_loss_steps": row["final_loss_steps"],
                "val_loss": evaluation.get("val_loss"),
                "perplexity": evaluation.get("perplexity"),
                "bits_per_byte": evaluation.get("bits_per_byte"),
                "eval_step": evaluation.get("step"),
                "eval_uri": evaluation.get("uri"),
                "tokens_per_s": row["tokens_per_s"],
                "mfu": row["mfu"],
            }
        )
    return {"store": store.uri, "runs": runs, "keys_compared": len(set().union(*configs)), "differences": differences(configs)}


def loss_history(store: Store, run_id: str, metrics: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A run's loss per step (steps whose update was skipped are left out: their loss may be NaN) and its
    held-out points as (step, val_loss): what a loss chart draws. The points are those the training measured
    (``train.val_every``) and those of its committed evaluations; at a step that has both, the evaluation's
    (it reads more rows). ``metrics``: the run's metrics.jsonl records, when the caller has read them already."""
    run = run_prefix(run_id)
    if metrics is None:
        metrics = read_jsonl(store, metrics_key(run))
    records = [m for m in metrics if "skipped" not in m and isinstance(m.get("loss"), (int, float))]
    evaluations = [e for e in _evaluations(store, run) if e.get("step") is not None and e.get("val_loss") is not None]
    validation = {int(m["step"]): float(m["val_loss"]) for m in records if isinstance(m.get("val_loss"), (int, float))}
    validation |= {int(e["step"]): float(e["val_loss"]) for e in evaluations}
    return {
        "steps": [int(m["step"]) for m in records],
        "loss": [float(m["loss"]) for m in records],
        "validation": sorted(validation.items()),
    }


def value_text(value: Any) -> str:
    """A config value as a person reads it: '-' for a missing one, floats briefly (0.003, 3e-05)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def figure_rows(runs: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """The figures of ``compare``'s runs as (name, one text per run), the same rows on the CLI and in the Deck."""
    evals = {r["eval_step"] for r in runs}
    at = "" if len(evals) != 1 or None in evals else f" (step {evals.pop()})"
    return [
        ("steps", [f"{r['steps_done']}/{r['steps_planned'] if r['steps_planned'] is not None else '?'}" for r in runs]),
        (f"final train loss (last {FINAL_LOSS_STEPS})", [_fmt(r["final_loss"], ".4f") for r in runs]),
        (f"validation loss{at}", [_fmt(r["val_loss"], ".4f") for r in runs]),
        ("bits per byte", [_fmt(r["bits_per_byte"], ".4f") for r in runs]),
        ("perplexity", [_fmt(r["perplexity"], ".2f") for r in runs]),
        ("tokens/s (median)", [_fmt(r["tokens_per_s"], ",.0f") for r in runs]),
        ("MFU (median)", [_fmt(r["mfu"], ".2%") for r in runs]),
    ]


def column_names(ids: list[str]) -> list[str]:
    """Short names for runs side by side: the first ``SHORT_ID`` characters of each id, more where two share them."""
    width = SHORT_ID
    while len({i[:width] for i in ids}) < len(set(ids)) and width < max(map(len, ids)):
        width += 4
    return [i[:width] for i in ids]
