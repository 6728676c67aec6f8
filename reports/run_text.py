"""A run, runs side by side and the list of runs as terminal text (``pretrain runs list``, ``show``, ``compare``):
each renders ``runs.view.RunView``s, as the HTML report (``reports.run_html``) does."""

from __future__ import annotations

import math
import textwrap
import time
from collections import Counter
from typing import Any

from common.settings import value_text
from runs.catalog import SHORT_ID
from runs.ledger import PARTS as GOODPUT_PARTS
from runs.ledger import Goodput
from runs.records import row_ranges
from runs.view import FINAL_LOSS_STEPS, RunView


def _when(seconds: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds)) if seconds is not None else ""


def _num(value: float | None, spec: str, unknown: str = "-") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else unknown


def list_line(view: RunView) -> str:
    """One run of ``pretrain runs list``."""
    planned = view.steps_planned if view.steps_planned is not None else "?"
    checkpoint = view.last_checkpoint if view.last_checkpoint is not None else "none"
    history = len(view.layout_history)
    layout = (view.layout or "layout ?") + (f" (+{history - 1} earlier)" if history > 1 else "")
    dataset = (view.dataset or "?")[:SHORT_ID]
    goodput = view.goodput.fraction if view.goodput is not None else None
    return (
        f"{view.id}  {view.name + '  ' if view.name else ''}steps {view.steps_done}/{planned}  checkpoint {checkpoint}  "
        f"loss {_num(view.final_loss, '.4f')}  "
        f"{_num(view.tokens_per_s, ',.0f')} tok/s  MFU {_num(view.mfu, '.1%')}  goodput {_num(goodput, '.1%')}  "
        f"{layout}  dataset {dataset}" + (f"  {_when(view.modified)}" if view.modified is not None else "")
    )


def _mixture_lines(meta: dict[str, Any]) -> list[str]:
    """A mixture's components: weight and the tokens trained on each through the latest checkpoint."""
    weights = meta.get("mixture") or {}
    if not weights:
        return []
    samples = (meta.get("loader") or {}).get("component_samples") or {}
    seq_len = meta.get("seq_len") or 0
    parts = [
        f"{name} {weight:.3f}" + (f" ({samples[name] * seq_len:,} tokens)" if name in samples and seq_len else "")
        for name, weight in weights.items()
    ]
    return ["mixture (weight, tokens trained through the latest checkpoint):", *_wrapped(", ".join(parts))]


def run_lines(run: RunView) -> list[str]:
    """``pretrain runs show`` in words, section by section."""
    planned = run.steps_planned if run.steps_planned is not None else "?"
    checkpoints = ", ".join(str(c["step"]) for c in run.checkpoints) or "none committed"
    named = f" ({run.name})" if run.name else ""
    out = [f"run {run.id}{named}  {run.uri}" + (f"  updated {_when(run.modified)}" if run.modified is not None else "")]
    out.append(f"  steps {run.steps_done}/{planned}, checkpoints at {checkpoints}; dataset {run.dataset or '?'}")
    out += _mixture_lines(run.meta)
    out.append("layout:")
    out += [f"  {span_text(span)}" for span in run.layout_history] or ["  not recorded (no committed checkpoint)"]
    for section, values in run.config.items():
        if values:
            out.append(f"{section}:")
            out += _wrapped(", ".join(f"{k}={v}" for k, v in values.items()))
    out.append("figures:")
    skipped = f", {run.skipped_steps} skipped" if run.skipped_steps else ""
    out.append(
        f"  loss {_num(run.first_loss, '.4f')} -> {_num(run.final_loss, '.4f')} "
        f"(mean of the last {run.final_loss_steps} applied steps{skipped})"
    )
    out.append(
        f"  median {_num(run.tokens_per_s, ',.0f')} tok/s, MFU {_num(run.mfu, '.1%')}, data wait "
        f"{_num(run.data_wait_fraction, '.1%')}; peak memory {_num(run.peak_memory_mib, ',.0f')} MiB"
    )
    if run.peak_flops_source:
        out.append(f"  MFU's peak FLOP/s: {run.peak_flops_source}")
    out += _goodput_lines(run.goodput)
    out += _breakdown_lines(run.breakdown)
    out += _rank_lines(run.ranks, run.stragglers)
    out.append(f"health: {_count(len(run.health), 'event')}" if run.health else "health: no NaN/Inf or spiking loss")
    for event in run.health:
        shards = event.get("batch", {}).get("shards", [])
        out.append(f"  step {event['step']}: {event['problem']} ({event.get('action', 'stopped')}); the batch's rows:")
        out += [f"    {s['shard']} rows {row_ranges(s['rows'], 8)} ({_count(len(s['rows']), 'row')})" for s in shards]
        out += [] if shards else ["    not recorded"]
    for evaluation in run.evaluations:
        out.append(
            f"evaluation at step {evaluation.get('step')}: val_loss {_num(evaluation.get('val_loss'), '.4f')}, "
            f"perplexity {_num(evaluation.get('perplexity'), '.1f')}, bits/byte {_num(evaluation.get('bits_per_byte'), '.3f')}  "
            f"{evaluation['uri']}"
        )
    return out + _file_lines(run.files)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def span_text(span: dict) -> str:
    layout = span["layout"]
    tp, pp, world = layout["tensor_parallel"], layout["pipeline_parallel"], layout["world_size"]
    return (
        f"steps {span['first_step']}-{span['last_step']}: {world} ranks, tensor_parallel={tp}, pipeline_parallel={pp}, "
        f"data_parallel={world // (tp * pp)}, distributed_optimizer={str(layout.get('distributed_optimizer', False)).lower()}, "
        f"fsdp={str(layout.get('fsdp', False)).lower()}"
    )


def _wrapped(text: str, width: int = 110) -> list[str]:

    return textwrap.wrap(text, width, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False)


def _goodput_lines(goodput: Goodput | None) -> list[str]:
    """The goodput ledger: the productive fraction of the run's wall time, and every part of that time."""
    if goodput is None:
        return ["goodput: not recorded (a run from before the goodput ledger)"]
    wall = goodput.wall_s
    out = [
        f"goodput: {_num(goodput.fraction, '.1%')} of {wall:.1f} s wall time productive, "
        f"over {_count(goodput.attempts, 'attempt')} (first start to last update)",
        f"  {'part':<23} {'seconds':>9} {'share':>7}",
    ]
    for part in GOODPUT_PARTS:
        seconds = goodput.parts.get(part, 0.0)
        out.append(f"  {part:<23} {seconds:9.2f} {_num(seconds / wall if wall > 0 else None, '7.1%')}")
    out.append(f"  {'unaccounted':<23} {goodput.unaccounted_s:9.2f}")
    if goodput.skew_s > 0:  # moved out of the wall time, counted in no part
        out.append(f"  {'clock skew (left out)':<23} {goodput.skew_s:9.2f}")
    return out + [f"  WARNING: {line}" for line in goodput.warnings]


def _breakdown_lines(breakdown: dict) -> list[str]:
    if not breakdown["phases"]:
        return ["step time: no steps recorded"]
    out = [
        f"step time, rank 0: median step {_num(breakdown['median_step_s'], '.4f')} s; {breakdown['steps']} steps, "
        f"checkpoint saves included, took {breakdown['wall_s']:.2f} s",
        f"  {'phase':<18} {'median s':>9} {'total s':>9} {'share':>7}",
    ]
    for row in breakdown["phases"]:
        out.append(
            f"  {row['phase']:<18} {_num(row['median_s'], '9.4f')} {_num(row['total_s'], '9.3f')} {_num(row['share'], '7.1%')}"
        )
    return out


def _rank_lines(ranks: dict, stragglers: dict) -> list[str]:
    if not ranks["ranks"]:
        return ["ranks: no step times exchanged (train.straggler_every: 0, or no exchange step reached)"]
    out = [f"ranks ({ranks['steps']} steps exchanged; busy = step minus collective waits):"]
    for row in ranks["ranks"]:
        out.append(
            f"  rank {row['rank']:<4} median step {_num(row['median_step_s'], '.4f')} s, "
            f"collective {_num(row['median_s'].get('collective'), '.4f')} s, busy {row['busy_s']:.3f} s in all"
        )
    out.append(f"  slowest rank {ranks['slowest_rank']}: busy {_num(ranks['slowest_ratio'], '.2f')}× the median of the others'")
    if stragglers["windows"]:
        counts = ", ".join(f"rank {rank} in {n}" for rank, n in stragglers["slowest_counts"].items())
        worst = stragglers["worst"]
        out.append(
            f"  straggler windows: {stragglers['windows']}; slowest {counts}; worst {worst['slowest_ratio']:.2f}× "
            f"(rank {worst['slowest_rank']}, steps {worst['window'][0]}-{worst['window'][1]})"
        )
    out += [f"  WARNING at step {w['step']}: {w['message']}" for w in stragglers["warnings"]]
    return out


def _file_lines(files: dict) -> list[str]:
    out = [
        "files:",
        f"  metrics      {files['metrics']}",
        f"  step times   {files['step_times']}",
        f"  health       {files['health']}",
        f"  tensorboard  {files['tensorboard']}",
        f"  goodput      {files['goodput']}",
    ]
    for window in files["profiles"]:
        out.append(f"  profile of steps {window['first']}-{window['last']} (Perfetto, TensorBoard's profiler):")
        out += [f"    {uri}" for uri in window["traces"]]
        if window["memory_snapshots"]:
            out.append("    memory snapshots (pytorch.org/memory_viz):")
            out += [f"    {uri}" for uri in window["memory_snapshots"]]
    if not files["profiles"]:
        out.append("  profiles     none (set train.profile, e.g. '11-13')")
    out.append("  diagnostics" + ("" if files["diagnostics"] else "  none (written when ranks stall)"))
    out += [f"    {uri}" for uri in files["diagnostics"]]
    return out


def compare_lines(compared: dict, names: list[str]) -> list[str]:
    """``pretrain runs compare`` in words: the runs, the settings that differ, the figures, the image."""
    out = [f"runs in {compared['store']}:"] + [f"  {n}  {r['uri']}" for n, r in zip(names, compared["runs"], strict=True)]
    differences = compared["differences"]
    if differences:
        out.append(f"config differences ({len(differences)} of {compared['keys_compared']} settings):")
        rows = [(d["key"], [value_text(v) for v in d["values"]]) for d in differences]
        out += _side_by_side([("setting", names), *rows])
    else:
        out.append(f"config: no differences in the {compared['keys_compared']} settings compared")
    out.append("figures:")
    out += _side_by_side([("", names), *figure_rows(compared["runs"])])
    out.append(f"loss curves: {compared['image']} ({compared['image_bytes']:,} bytes)")
    return out


def _side_by_side(rows: list[tuple[str, list[str]]]) -> list[str]:
    """Rows of (name, one value per run) as aligned columns."""
    first = max(len(name) for name, _ in rows)
    widths = [max(len(values[i]) for _, values in rows) for i in range(len(rows[0][1]))]
    return [
        "  " + "  ".join([name.ljust(first), *(v.ljust(w) for v, w in zip(values, widths, strict=True))]).rstrip()
        for name, values in rows
    ]


def _fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def figure_rows(runs: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """The figures of ``compare``'s runs as (name, one text per run), the same rows on the CLI and in the Deck."""
    evals = {r["eval_step"] for r in runs}
    at = "" if len(evals) != 1 or None in evals else f" (step {evals.pop()})"
    return [
        ("steps", [f"{r['steps_done']}/{r['steps_planned'] if r['steps_planned'] is not None else '?'}" for r in runs]),
        (f"final train loss (last {FINAL_LOSS_STEPS})", [_fmt(r["final_loss"], ".4f") for r in runs]),
        (f"evaluation val_loss{at}", [_fmt(r["val_loss"], ".4f") for r in runs]),
        ("bits per byte", [_fmt(r["bits_per_byte"], ".4f") for r in runs]),
        ("perplexity", [_fmt(r["perplexity"], ".2f") for r in runs]),
        ("tokens/s (median)", [_fmt(r["tokens_per_s"], ",.0f") for r in runs]),
        ("MFU (median)", [_fmt(r["mfu"], ".2%") for r in runs]),
    ]


def column_names(views: list[RunView]) -> list[str]:
    """Names for runs side by side: each run's name for people (``common.run_names``) with the short id that keeps
    two of the same name apart, or the short id alone for a run that recorded no name."""
    ids = short_ids([view.id for view in views])
    counts = Counter(view.name for view in views)
    return [
        (f"{view.name} ({short})" if counts[view.name] > 1 else view.name) if view.name else short
        for view, short in zip(views, ids, strict=True)
    ]


def short_ids(ids: list[str]) -> list[str]:
    """The first ``SHORT_ID`` characters of each id, more where two share them."""
    width = SHORT_ID
    while len({i[:width] for i in ids}) < len(set(ids)) and width < max(map(len, ids)):
        width += 4
    return [i[:width] for i in ids]
