"""A run's files read once from the store into its view (``runs.view.RunView``): ``load_run``. Torch-free."""

from __future__ import annotations

import re
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
from runs.ledger import goodput_prefix, load_goodput
from runs.records import read_jsonl
from runs.view import RunView, build_view
from storage import Store

_WINDOW = re.compile(r"^steps_(?P<first>\d+)-(?P<last>\d+)$")


def load_run(store: Store, run_id: str, detail: bool = True) -> RunView:
    """The view of run ``run_id`` (its id: ``runs.catalog.resolve_run`` finds it from a prefix). ``detail=False``
    leaves out what only ``runs show`` and the reports use (step times, health, evaluations, files): a listing
    of many runs reads two files and a listing per run."""
    run = run_prefix(run_id)
    evaluations = _evaluations(store, run) if detail else []
    files = _files(store, run) if detail else {}
    metrics = read_jsonl(store, metrics_key(run))
    step_times = read_jsonl(store, step_times_key(run)) if detail else []
    health = read_jsonl(store, health_key(run)) if detail else []
    steps = committed_steps(store, run)
    latest = f"{checkpoint_prefix(run, steps[-1])}/{CHECKPOINT_META}" if steps else ""
    modified = store.modified(metrics_key(run))  # rank 0 rewrites it at every checkpoint and at the end
    if modified is None and latest:
        modified = store.modified(latest)
    return build_view(
        run_id,
        store.url(run),
        metrics,
        meta=store.get_json(latest) if latest else {},
        checkpoints=[{"step": s, "uri": store.url(checkpoint_prefix(run, s))} for s in steps],
        goodput=load_goodput(store, run),
        modified=modified,
        step_times=step_times,
        health=health,
        evaluations=evaluations,
        files=files,
    )


def _evaluations(store: Store, run: str) -> list[dict[str, Any]]:
    """The run's committed evaluations' figures, by step."""
    out = []
    for key in store.children(f"{run}/eval"):
        prefix = eval_prefix(run, key)
        if not store.is_committed(prefix):
            continue
        results = store.get_json(f"{prefix}/{EVAL_RESULTS}")
        figures = ("step", "val_loss", "perplexity", "bits_per_byte", "tokens_evaluated")
        out.append({"uri": store.url(prefix), **{k: results[k] for k in figures if k in results}})
    return sorted(out, key=lambda e: (e.get("step") or 0, e["uri"]))


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
