"""One training run as everything shown about it: ``RunView``, built once from the run's records.

``runs.reading.load_run`` reads the files a run leaves under ``runs/<id>/`` (``common.contracts`` names them) once:

- ``metrics.jsonl``: one record per step (loss, tokens/s, MFU, memory, the ``time_<phase>_s``
  breakdown, the straggler summary on exchange steps, ``skipped``/``health`` on refused steps);
- ``step_times.jsonl``: every rank's breakdown of every step, gathered at the straggler exchanges;
- ``health.jsonl``: loss-health events;
- ``checkpoints/step-NNNNNNN/meta.json`` of the latest committed checkpoint: configs, layout history,
  dataset version;
- ``tensorboard/plugins/profile/steps_A-B/``: profiler traces and memory snapshots per rank;
- ``diagnostics/``: stacks and flight-recorder dumps of stalled ranks;
- ``eval/<key>/results.json``: committed evaluations;
- ``goodput/attempt-*.json``: each training attempt's goodput ledger (``runs.ledger``).

and ``build_view`` derives every figure from those records (no store): the terminal text, the HTML report and
Decks, the MLflow artifacts and ``--json`` all render the same ``RunView`` (``reports``), so they cannot disagree.
Torch-free.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from runs.ledger import Goodput

FINAL_LOSS_STEPS = 10
"""The final loss is the mean over this many last accepted steps, as in the training summary."""

_PHASE_KEY = re.compile(r"^time_(?P<phase>.+)_s$")


@dataclass(frozen=True)
class LossHistory:
    """What a loss chart draws: the loss per applied step and two kinds of validation points, kept apart because
    they are measured differently: the training's held-out loss (every ``train.val_every`` steps, on a few batches)
    and the committed evaluations' ``val_loss`` (a checkpoint, on more of the validation split)."""

    steps: list[int]
    loss: list[float]
    heldout: list[tuple[int, float]]
    """(step, loss) the training measured on ``heldout_batches`` batches of the validation split."""
    evaluation: list[tuple[int, float]]
    """(step, val_loss) of each committed evaluation."""
    heldout_batches: int | None = None
    """Batches each held-out point read (the records' ``heldout_batches``, else the run's ``train.val_batches``;
    None: not recorded)."""
    evaluation_batches: int | None = None
    """Batches the latest evaluation read (its ``batches``; None: not recorded)."""
    evaluation_tokens: int | None = None
    """Tokens the latest evaluation read (its ``tokens_evaluated``; None: not recorded)."""


@dataclass(frozen=True)
class RunView:
    """Everything shown about one run. The figures are derived from the records in ``build_view``."""

    id: str
    uri: str
    steps_done: int
    steps_planned: int | None
    checkpoints: list[dict[str, Any]]
    """[{"step", "uri"}] of every committed checkpoint, oldest first."""
    final_loss: float | None
    """Mean loss of the last ``FINAL_LOSS_STEPS`` applied steps."""
    final_loss_steps: int
    first_loss: float | None
    tokens_per_s: float | None
    """Median over the steps, as is ``mfu`` and ``data_wait_fraction``."""
    mfu: float | None
    data_wait_fraction: float | None
    peak_memory_mib: float | None
    peak_flops: float | None
    peak_flops_source: str | None
    skipped_steps: int
    goodput: Goodput | None
    layout_history: list[dict[str, Any]]
    """The latest checkpoint's layout history: which layout trained which steps."""
    dataset: str | None
    name: str
    """The run's name for people (``common.run_names``: model, data, settings that differ), '' when not recorded."""
    config: dict[str, Any]
    """{"model": ..., "train": ...} as the latest checkpoint recorded them."""
    meta: dict[str, Any]
    """The latest committed checkpoint's meta.json ({} without one)."""
    modified: float | None
    breakdown: dict[str, Any]
    ranks: dict[str, Any]
    stragglers: dict[str, Any]
    health: list[dict[str, Any]]
    evaluations: list[dict[str, Any]]
    loss: LossHistory
    files: dict[str, Any]
    metrics: list[dict[str, Any]] = field(repr=False)
    """The per-step records, for the curves."""
    step_times: list[dict[str, Any]] = field(repr=False)

    @property
    def last_checkpoint(self) -> int | None:
        return self.checkpoints[-1]["step"] if self.checkpoints else None

    @property
    def layout(self) -> str | None:
        """The layout that trained the latest steps, briefly ('TP2 PP1 DP1')."""
        return layout_short(self.layout_history[-1]) if self.layout_history else None

    @property
    def latest_evaluation(self) -> dict[str, Any]:
        """The evaluation at the highest step ({} without one)."""
        return self.evaluations[-1] if self.evaluations else {}

    def summary(self) -> dict[str, Any]:
        """One row of ``pretrain runs list --json``: progress, final figures, goodput fraction, layout, dataset."""
        return {
            "id": self.id,
            "name": self.name,
            "uri": self.uri,
            "steps_done": self.steps_done,
            "steps_planned": self.steps_planned,
            "last_checkpoint": self.last_checkpoint,
            "final_loss": self.final_loss,
            "final_loss_steps": self.final_loss_steps,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "goodput": self.goodput.fraction if self.goodput is not None else None,
            "layout": self.layout,
            "layouts": len(self.layout_history),
            "dataset": self.dataset,
            "skipped_steps": self.skipped_steps,
            "modified": self.modified,
        }

    def to_dict(self) -> dict[str, Any]:
        """``pretrain runs show --json``: the summary with the goodput ledger in full and every detail."""
        return {
            **self.summary(),
            "goodput": self.goodput.to_dict() if self.goodput is not None else None,
            "checkpoints": self.checkpoints,
            "config": self.config,
            "layout_history": self.layout_history,
            "first_loss": self.first_loss,
            "peak_memory_mib": self.peak_memory_mib,
            "data_wait_fraction": self.data_wait_fraction,
            "peak_flops_source": self.peak_flops_source,
            "breakdown": self.breakdown,
            "ranks": self.ranks,
            "stragglers": self.stragglers,
            "health": self.health,
            "evaluations": self.evaluations,
            "files": self.files,
        }


# -- the figures, from the records alone ----------------------------------------------------------
def build_view(
    run_id: str,
    uri: str,
    metrics: list[dict[str, Any]],
    *,
    meta: dict[str, Any] | None = None,
    checkpoints: list[dict[str, Any]] | None = None,
    goodput: Goodput | None = None,
    modified: float | None = None,
    step_times: list[dict[str, Any]] | None = None,
    health: list[dict[str, Any]] | None = None,
    evaluations: list[dict[str, Any]] | None = None,
    files: dict[str, Any] | None = None,
) -> RunView:
    """The view of a run from its records (what ``load_run`` read, or records a test or a Deck has)."""
    meta, checkpoints, step_times = meta or {}, checkpoints or [], step_times or []
    evaluations = evaluations or []
    if not health:  # a run from before health.jsonl: its refused steps carry the event
        health = [m["health"] for m in metrics if "health" in m]
    applied = [m for m in metrics if "skipped" not in m]
    memory = [m["peak_memory_mib"] for m in metrics if isinstance(m.get("peak_memory_mib"), (int, float))]
    flops = next((m for m in reversed(metrics) if m.get("peak_flops_source")), {})
    return RunView(
        id=run_id,
        uri=uri,
        steps_done=max((m["step"] for m in metrics), default=checkpoints[-1]["step"] if checkpoints else 0),
        steps_planned=meta.get("train", {}).get("steps"),
        checkpoints=checkpoints,
        final_loss=final_loss(metrics),
        final_loss_steps=min(FINAL_LOSS_STEPS, len(applied)),
        first_loss=metrics[0]["loss"] if metrics else None,
        tokens_per_s=_median([m.get("tokens_per_s") for m in metrics]),
        mfu=_median([m["mfu"] for m in metrics if m.get("mfu") is not None]),
        data_wait_fraction=_median([m.get("data_wait_fraction") for m in metrics]),
        peak_memory_mib=max(memory) if memory else None,
        peak_flops=flops.get("peak_flops"),
        peak_flops_source=flops.get("peak_flops_source"),
        skipped_steps=len(metrics) - len(applied),
        goodput=goodput,
        layout_history=layouts_of(meta),
        dataset=meta.get("dataset"),
        name=meta.get("name") or "",
        config={"model": meta.get("model"), "train": meta.get("train")},
        meta=meta,
        modified=modified,
        breakdown=breakdown(metrics),
        ranks=ranks(step_times),
        stragglers=stragglers(metrics),
        health=health,
        evaluations=evaluations,
        loss=loss_history(metrics, evaluations, (meta.get("train") or {}).get("val_batches")),
        files=files or {},
        metrics=metrics,
        step_times=step_times,
    )


def _median(values: list[float]) -> float | None:
    """The median step's figure (the higher of the two middle ones): one step's own value, as the card's
    ``tokens_per_second`` and ``mfu`` are (``training.runlog``), so the summary, the card and the run's view agree."""
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return statistics.median_high(values) if values else None


def final_loss(metrics: list[dict]) -> float | None:
    """Mean loss of the last ``FINAL_LOSS_STEPS`` steps whose update was applied (a skipped step's loss
    may be NaN: it says nothing about where training is)."""
    accepted = [m["loss"] for m in metrics if "skipped" not in m and isinstance(m.get("loss"), (int, float))]
    last = [v for v in accepted[-FINAL_LOSS_STEPS:] if math.isfinite(v)]
    return sum(last) / len(last) if last else None


def layout_short(span: dict) -> str:
    """A layout span's layout in a few characters: 'TP2 PP1 DP1', with ' distopt' or ' fsdp'."""
    layout = span["layout"]
    tp, pp, world = layout["tensor_parallel"], layout["pipeline_parallel"], layout["world_size"]
    text = f"TP{tp} PP{pp} DP{world // (tp * pp)}"
    return text + (" distopt" if layout.get("distributed_optimizer") else "") + (" fsdp" if layout.get("fsdp") else "")


def layouts_of(meta: dict) -> list[dict]:
    """The meta.json's layout history; a checkpoint older than the history names only its own layout."""
    if "layouts" in meta:
        return list(meta["layouts"])
    if "layout" in meta:
        return [{"first_step": 1, "last_step": meta.get("step", 0), "layout": meta["layout"]}]
    return []


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


HELDOUT_KEYS = ("heldout_loss", "val_loss")
"""A step record's held-out loss: ``heldout_loss``, or ``val_loss`` in the records of runs from before it was named."""


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def loss_history(metrics: list[dict[str, Any]], evaluations: list[dict[str, Any]], val_batches: object = None) -> LossHistory:
    """The loss per step (steps whose update was skipped are left out: their loss may be NaN), the training's
    held-out points (step, loss) and the committed ``evaluations``' (step, val_loss), each series on its own: a
    held-out point reads a few batches, an evaluation many, so the two are not one curve. ``val_batches``: the
    run's ``train.val_batches``, the held-out batch count of records that do not carry ``heldout_batches``."""
    records = [m for m in metrics if "skipped" not in m and isinstance(m.get("loss"), (int, float))]
    heldout, batches = {}, None
    for m in records:
        key = next((k for k in HELDOUT_KEYS if _number(m.get(k))), None)
        if key is not None:
            heldout[int(m["step"])] = float(m[key])
            batches = _count(m.get("heldout_batches")) or batches
    evaluated = [e for e in evaluations if e.get("step") is not None and _number(e.get("val_loss"))]
    latest = max(evaluated, key=lambda e: int(e["step"]), default={})
    return LossHistory(
        steps=[int(m["step"]) for m in records],
        loss=[float(m["loss"]) for m in records],
        heldout=sorted(heldout.items()),
        evaluation=sorted({int(e["step"]): float(e["val_loss"]) for e in evaluated}.items()),
        heldout_batches=batches or (_count(val_batches) if heldout else None),
        evaluation_batches=_count(latest.get("batches")),
        evaluation_tokens=_count(latest.get("tokens_evaluated")),
    )
