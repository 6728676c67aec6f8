"""Soak: SIGKILLs and S3 outages in every stage of the pipeline, each followed by a rerun, checked.

    python benchmarks/soak.py [--seed 18] [--per-stage 2] [--outages 2] [--work DIR] [--keep]

One SeaweedFS S3 server (``storage.s3server.S3Server``) holds the store ``s3://soak/store``.
Every pipeline writes its stage markers (``common.stages``: a line ``<name> <time>`` as each
stage's work begins) to a file of its own (``$PRETRAIN_STAGE_MARKERS``). An uninterrupted
reference run of a small pipeline (``soak_config``) records what a run must produce: the dataset
version, the final checkpoint's tensors (weights and AdamW moments,
``training.checkpointing.snapshot``), the card's metrics, its training goodput
(``runs.ledger``), its markers, and the timeline of its stages as seen in the store
(when each stage and each checkpoint committed). Then each trial

1. resets the store and flytekit's local cache (a private ``HOME``) to the state just before
   its stage: empty for prepare and validate; for the later stages, the reference's store
   objects and cache entries of the stages before it (the cache key of a task is its inputs
   and code version, and those refs point into the same store URI, so a trial of ``train``
   starts exactly where a fresh execution would be when train begins);
2. runs ``pretrain run --config soak.yaml`` (its own session), waits until its marker file shows
   the trial's stage started (for train, checkpoint and checkpoint-upload: the chosen step or
   save), and SIGKILLs the whole process group a seeded random delay later, inside that stage's
   window as the reference ran it; or stops the S3 server for a few seconds and starts it again
   (same data folder and port) while objects are being uploaded;
3. reruns the same command to completion with the same ``HOME``, as a Flyte retry would
   (cached stages hit);
4. checks: exactly one committed registry version (no twins); every committed prefix whole
   (dataset shards against the manifest, validation outputs, every checkpoint against its
   ``digests.json``, evaluation outputs, the registry entry and its checkpoint copy), so no
   partial prefix is visible as complete; the dataset version, the final checkpoint's and the
   registered copy's tensors (``torch.equal``, every key, same key sets), the per-step losses
   (each step once, none lost, none doubled) and the card's metrics (timing ones excluded)
   identical to the reference's; and reads the run's goodput over its attempts.

Where a kill landed is the stage the run's last marker before it names (``kill_stage``; the
store says what a marker cannot: whether an asynchronous upload had committed), and
``kills_by_stage`` counts those; the store's own view (``stage_of``) is kept beside as a
cross-check (``store_disagrees``). The last line of stdout is one JSON object (see docs/soak.md).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from common.contracts import CARD, ENTRY_CHECKPOINT, MANIFEST, TOKENIZER  # noqa: E402
from common.stages import ENV as MARKERS_ENV  # noqa: E402
from common.stages import Marker, read_markers  # noqa: E402
from storage import COMMIT_MARKER, open_store  # noqa: E402
from storage.s3server import S3Server  # noqa: E402

BUCKET = "soak"
STORE_PREFIX = "store"
MODEL = "gpt-soak"
STEPS = 24
STAGES = ("prepare", "validate", "train", "checkpoint", "checkpoint-upload", "evaluate", "register")
CACHED_TASKS = ("prepare_data", "validate_data", "train_model", "evaluate_model", "register_model")
# Where each stage's trial starts: the cached tasks (and their store objects) that precede it.
STARTS = {"prepare": 0, "validate": 0, "train": 2, "checkpoint": 2, "checkpoint-upload": 2, "evaluate": 3, "register": 4}
POLL_S = 0.05
MARKER_POLL_S = 0.01  # the marker file is local: reading it costs microseconds
CHECKPOINT_EVERY = 8
LOCAL_CHECKPOINT_EVERY = 0  # train.local_checkpoint_every: checkpoints the node keeps between the store's (0 = none)
CHECKPOINTS = [s for s in range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY)]
# The stage a marker says is running: its own name, but a step's is the train stage's (common.stages).
MARKER_STAGES = {"train-step": "train"}
# Where the store may stand when a kill landed in a stage (a cross-check of the markers' word).
STORE_AGREES = {
    "prepare": {"prepare"},
    "validate": {"validate"},
    "train": {"train", "checkpoint"},
    "checkpoint": {"train", "checkpoint"},
    "checkpoint-upload": {"train", "checkpoint"},
    "evaluate": {"evaluate"},
    "register": {"register"},
}
GOODPUT_STAGES = ("train", "checkpoint", "checkpoint-upload")  # kills whose run's goodput is compared
GOODPUT_GOAL = 0.9  # goodput under kills / the reference's (kills of the whole task)
RANK_GOAL = 0.93  # the same, for a rank killed and restarted inside the job, in every stage
RESTART_GOAL_S = 5.0  # what a rank kill may add to the run's start-up and recovery
RESTART_PARTS = ("infrastructure_recovery", "startup", "checkpoint_restore", "compile")
"""The goodput ledger's parts that a restart adds to (runs.ledger): a kill's restart is the run's seconds of these
less the reference run's."""


def soak_config(corpus: Path) -> dict[str, Any]:
    """A pipeline that runs in well under a minute on two cores: TP 2 as the demo, 24 steps,
    a checkpoint every 8 (three commits, two kept), a tiny evaluation."""
    return {
        "store": f"s3://{BUCKET}/{STORE_PREFIX}",
        "data": {"sources": [str(corpus)], "seq_len": 64, "sequences_per_sample": 16, "samples_per_shard": 8, "workers": 2},
        "tokenizer": {"vocab_size": 1024},
        "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4},
        "parallel": {"tensor_parallel": 2},
        "train": {
            "steps": STEPS,
            "micro_batch_size": 4,
            "global_batch_size": 8,
            "warmup_steps": 4,
            "checkpoint_every": CHECKPOINT_EVERY,
            "local_checkpoint_every": LOCAL_CHECKPOINT_EVERY,
            "keep_checkpoints": 2,
            "log_every": 1,
        },
        "evaluation": {"max_batches": 2, "batch_size": 4, "sample_tokens": 8},
        "registry": {"model_name": MODEL},
    }


def write_corpus(folder: Path, seed: int = 18, documents: int = 300) -> Path:
    """``documents`` distinct generated text files (~1 KB each), the same for a given seed."""
    syllables = ["ka", "lo", "mi", "ren", "tu", "sa", "vo", "ne", "pi", "dor", "ex", "quo", "lin", "ba", "te", "ru"]
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(documents):
        words = " ".join("".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(150))
        (folder / f"doc{i:04d}.txt").write_text(f"Document {i}. {words}.\n")
    return folder


def pin_code(dest: Path) -> Path:
    """A copy of the working tree's files (tracked and untracked, not ignored) at ``dest``: the
    pipelines run from it, so that an edit of the tree during the soak neither changes their
    code versions (and run ids) between a fault and its rerun nor mixes two versions of a stage."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True
    )
    for name in filter(None, listing.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model or "unknown", "cores": os.cpu_count()}


# ----------------------------------------------------------------------------------------------
# The store as the soak sees it: one listing per poll, and where a pipeline stands in it


@dataclass
class StoreView:
    """The bucket's objects under the store's prefix, listed directly (one request per poll)."""

    server: S3Server
    _clients: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def client(self):
        """One client per endpoint (a restarted server keeps its port): polls in a tight loop make none."""
        if self.server.endpoint not in self._clients:
            self._clients[self.server.endpoint] = self._new_client()
        return self._clients[self.server.endpoint]

    def _new_client(self):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.server.endpoint,
            aws_access_key_id=self.server.access_key,
            aws_secret_access_key=self.server.secret_key,
            region_name="us-east-1",
            config=Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5),
        )

    def keys(self, under: str = "") -> set[str]:
        """The store's keys (those under ``under``, e.g. ``runs/``), relative to the store."""
        found: set[str] = set()
        client = self.client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{STORE_PREFIX}/{under}"):
            found.update(o["Key"][len(STORE_PREFIX) + 1 :] for o in page.get("Contents", []))
        return found

    def wipe(self) -> None:
        client = self.client()
        while keys := sorted(f"{STORE_PREFIX}/{k}" for k in self.keys()):
            for i in range(0, len(keys), 500):
                client.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys[i : i + 500]]})


@dataclass(frozen=True)
class Position:
    """Where a pipeline stands in the store: the first stage not committed yet, the objects its
    prefix holds so far, and (in training) the step of a checkpoint being uploaded."""

    stage: str
    objects: int = 0
    step: int = 0  # a checkpoint uploading (stage "checkpoint"), else the latest committed one

    def describe(self) -> str:
        if self.stage == "checkpoint":
            return f"step {self.step}: {self.objects} files uploaded, no {COMMIT_MARKER}"
        if self.stage == "train":
            return f"latest committed checkpoint: step {self.step}"
        return f"{self.objects} objects of its prefix written" if self.stage != "done" else ""


def checkpoint_files(keys: set[str]) -> dict[int, int]:
    """How many objects each checkpoint step's prefix holds (``runs/<id>/checkpoints/step-N/...``)."""
    files: dict[int, int] = {}
    for k in keys:
        parts = k.split("/")
        if len(parts) >= 5 and parts[0] == "runs" and parts[2] == "checkpoints" and parts[3].startswith("step-"):
            step = int(parts[3].removeprefix("step-"))
            files[step] = files.get(step, 0) + 1
    return files


def committed_steps(keys: set[str]) -> set[int]:
    """The checkpoint steps whose commit marker is in the store (pruned ones are gone)."""
    found: set[int] = set()
    for k in keys:
        parts = k.split("/")
        if len(parts) == 5 and parts[0] == "runs" and parts[2] == "checkpoints" and parts[4] == COMMIT_MARKER:
            found.add(int(parts[3].removeprefix("step-")))
    return found


def stage_of(keys: set[str]) -> Position:
    """Where a pipeline stands, from one listing of the store."""

    def marker(depth: int, head: str, tail: str = "") -> bool:
        return any(k.startswith(head) and k.endswith(f"{tail}/{COMMIT_MARKER}") and k.count("/") == depth for k in keys)

    if not marker(2, "datasets/"):
        return Position("prepare", sum(k.startswith("datasets/") for k in keys))
    if not marker(3, "datasets/", "/validation"):
        return Position("validate", sum("/validation/" in k for k in keys))
    files = checkpoint_files(keys)
    committed = committed_steps(keys)
    latest = max(committed, default=0)
    if latest < STEPS:
        uploading = [s for s in files if s not in committed and s > latest]  # not a pruned older one
        if uploading:
            return Position("checkpoint", files[min(uploading)], min(uploading))
        return Position("train", 0, latest)
    evaluations = [k for k in keys if k.startswith("runs/") and k.split("/")[2] == "eval"]  # runs/<id>/eval/<key>/...
    if not any(k.count("/") == 4 and k.endswith(f"/{COMMIT_MARKER}") for k in evaluations):
        return Position("evaluate", len(evaluations))
    entry = [k for k in keys if k.startswith(f"models/{MODEL}/") and k.split("/")[2].isdigit()]
    if not any(k.endswith(f"/{COMMIT_MARKER}") and k.count("/") == 3 for k in entry):
        return Position("register", len(entry))
    return Position("done")


# ----------------------------------------------------------------------------------------------
# Stage markers (common.stages): where a kill is aimed, and where it landed


def save_step(save: int) -> int:
    """The step of a run's ``save``-th checkpoint save (1-based) in a run that started from scratch, as
    every faulted train trial and the reference do."""
    return CHECKPOINTS[min(max(save, 1), len(CHECKPOINTS)) - 1]


def upload_open(markers: list[Marker], committed: set[int]) -> bool:
    """Whether the latest asynchronous upload was still running: a ``checkpoint-upload`` marker was
    written and its save's commit marker is not in the store (``committed``: committed steps there)."""
    uploads = sum(m.name == "checkpoint-upload" for m in markers)
    return uploads > 0 and max(committed, default=0) < save_step(uploads)


def kill_stage(markers: list[Marker], committed: set[int], store_stage: str = "", at: float | None = None) -> str:
    """The stage a kill at ``at`` (time.time(); None: after every marker) landed in, from the run's markers:
    the one its last marker before ``at`` names ("start-up" before any: the CLI importing, the tasks
    before prepare), with what a marker cannot say read from the store (``committed``: the committed
    checkpoint steps right after the kill, ``store_stage``: ``stage_of`` then):

    - ``checkpoint-upload`` when an asynchronous upload was running (``upload_open``) and the last
      marker is a step's, the train task's or the upload's own; once that save committed, ``train``;
    - ``checkpoint`` (the synchronous part of a save) until that save commits, ``train`` after it
      (a run that marks no step after its save is back in its steps all the same);
    - a run that writes no ``checkpoint`` marker (no marker inside training yet): a kill in ``train``
      while the store shows a save's files without its commit marker is in ``checkpoint``."""
    seen = [m for m in markers if at is None or m.at <= at]
    if not seen:
        return "start-up"
    stage = MARKER_STAGES.get(seen[-1].name, seen[-1].name)
    if stage in ("train", "checkpoint-upload") and upload_open(seen, committed):
        return "checkpoint-upload"
    if stage == "checkpoint-upload":
        return "train"
    if stage == "checkpoint":
        saves = sum(m.name == "checkpoint" for m in seen)
        return "train" if max(committed, default=0) >= save_step(saves) else "checkpoint"
    if stage == "train" and store_stage == "checkpoint" and not any(m.name == "checkpoint" for m in seen):
        return "checkpoint"
    return stage


def nth(markers: list[Marker], name: str, occurrence: int) -> int | None:
    """The index in ``markers`` of the ``occurrence``-th (1-based) marker named ``name``, or None."""
    hits = [i for i, m in enumerate(markers) if m.name == name]
    return hits[occurrence - 1] if 0 < occurrence <= len(hits) else None


def window(markers: list[Marker], index: int, end: float | None = None, bounded: bool = True) -> float:
    """How long the stage that ``markers[index]`` opened ran, in seconds: until the next marker (when
    ``bounded``) or ``end`` (when the store showed its commit), whichever came first; 0 when neither is known."""
    ends = [end] if end is not None else []
    if bounded and index + 1 < len(markers):
        ends.append(markers[index + 1].at)
    return max(min(ends) - markers[index].at, 0.0) if ends else 0.0


def plain_steps(markers: list[Marker]) -> list[int]:
    """The occurrences (1-based) of ``train-step`` markers followed by another step's: steps with no save."""
    steps = [i for i, m in enumerate(markers) if m.name == "train-step"]
    return [n for n, i in enumerate(steps, 1) if i + 1 < len(markers) and markers[i + 1].name == "train-step"]


@dataclass
class MarkerAim:
    """A kill ``delays[0]`` seconds after the ``occurrences[0]``-th marker named ``name`` was written (by its
    own time). When that marker's window closes before the kill is due (``closed``: a step or save quicker
    than in the reference), the aim moves on to the next occurrence and its delay, while there is one."""

    name: str
    occurrences: list[int]
    delays: list[float]
    until_commit: bool = False  # the window ends at its save's commit only (an asynchronous upload: steps go on)

    def fire_at(self, markers: list[Marker]) -> float | None:
        """When the kill is due (time.time()), once the marker is there; None before."""
        index = nth(markers, self.name, self.occurrences[0])
        return None if index is None else markers[index].at + self.delays[0]

    def closed(self, markers: list[Marker], committed: set[int]) -> bool:
        """Whether the aimed occurrence's window is over: a save's once it committed (``committed``: the
        store's committed steps), any other's (and a save's synchronous part) once a later marker is there."""
        index = nth(markers, self.name, self.occurrences[0])
        if index is None:
            return False
        if self.name in ("checkpoint", "checkpoint-upload") and max(committed, default=0) >= save_step(self.occurrences[0]):
            return True
        return not self.until_commit and index + 1 < len(markers)

    def move_on(self) -> bool:
        """Aim at the next occurrence; False (and the aim unchanged) when there is none."""
        if len(self.occurrences) < 2:
            return False
        del self.occurrences[0], self.delays[0]
        return True

    def describe(self) -> str:
        nexts = self.occurrences[1:]
        shown = ", #".join(map(str, nexts[:5])) + (f" and {len(nexts) - 5} more" if len(nexts) > 5 else "")
        later = f" (then #{shown} if it closes first)" if nexts else ""
        return f"{self.delays[0]:.2f} s after {self.name} marker #{self.occurrences[0]}{later}"


def goodput_summary(reference: float | None, under_kills: list[float], note: str = "") -> dict[str, Any]:
    """The JSON line's goodput keys: the reference run's training goodput, the median and min over the
    kill trials' runs, their ratio to the reference (``ratios``, ``spread`` of the per-trial ratio) and
    the goal (≥ GOODPUT_GOAL); nulls, with ``goodput_note`` saying why, when a figure is missing."""
    ratios = [g / reference for g in under_kills] if reference and under_kills else []
    median = statistics.median(under_kills) if under_kills else None
    kills = None
    if median is not None:
        kills = {"median": round(median, 4), "min": round(min(under_kills), 4), "trials": len(under_kills)}
    ratio = round(median / reference, 3) if ratios and median is not None and reference else None
    out: dict[str, Any] = {
        "goodput_reference": round(reference, 4) if reference is not None else None,
        "goodput_under_kills": kills,
        "ratios": {"goodput_vs_reference": ratio},
        "spread": {"goodput_vs_reference": [round(min(ratios), 3), round(max(ratios), 3)] if ratios else None},
        "goal": {"goodput_vs_reference": f">= {GOODPUT_GOAL}", "met": None if ratio is None else ratio >= GOODPUT_GOAL},
    }
    if ratio is None:
        out["goodput_note"] = note or (f"no kill landed in {' / '.join(GOODPUT_STAGES)}" if reference else "no reference goodput")
    return out


def lost_per_kill(trials: list[Any], reference_parts: dict[str, float] | None = None) -> dict[str, Any]:
    """What one kill in training cost its run, the median over ``trials`` (those with a goodput): the restart (the
    run's seconds of ``RESTART_PARTS`` less the reference run's: the failure to the next attempt's start, and that
    attempt's start-up, checkpoint restore and compiling) and the steps trained again (``wasted_progress``), in
    seconds, and of the restart the soak's own share (its checks between a task kill and the rerun's start, which a
    Flyte retry's scheduling replaces; none for a rank kill)."""
    parts = [t.goodput_detail["parts"] for t in trials if t.goodput_detail]
    gaps = [t.harness_gap_s for t in trials if t.goodput_detail and t.harness_gap_s is not None and t.kind == "task"]
    if not parts:
        return {"lost_per_kill_s": None}
    median = statistics.median
    base = sum((reference_parts or {}).get(p, 0.0) for p in RESTART_PARTS)
    return {
        "lost_per_kill_s": {
            "restart": round(median(sum(p.get(k, 0.0) for k in RESTART_PARTS) - base for p in parts), 2),
            "wasted_progress": round(median(p.get("wasted_progress", 0.0) for p in parts), 2),
            "of_which_soak_gap": round(median(gaps), 2) if gaps else None,
        }
    }


def kind_summary(trials: list[Any], reference: float | None, reference_parts: dict[str, float] | None) -> dict[str, Any]:
    """Kills of one kind (rank or task) in training: per stage they landed in and over all, the trials, the median
    of goodput under the kill over the reference's (with its spread) and what a kill cost (``lost_per_kill``)."""

    def figures(group: list[Any]) -> dict[str, Any]:
        ratios = sorted(t.goodput / reference for t in group if t.goodput is not None) if reference else []
        return {
            "trials": len(group),
            "goodput_vs_reference": round(statistics.median(ratios), 3) if ratios else None,
            "spread": [round(ratios[0], 3), round(ratios[-1], 3)] if ratios else None,
            **lost_per_kill(group, reference_parts),
        }

    stages = {stage: figures([t for t in trials if t.landed == stage]) for stage in GOODPUT_STAGES}
    return {**figures([t for t in trials if t.landed in GOODPUT_STAGES]), "by_stage": stages}


def rank_goal(rank: dict[str, Any], min_trials: int = 1) -> dict[str, Any]:
    """The rank kills' goal: in every stage, at least ``min_trials`` kills landed, goodput under a kill ≥ RANK_GOAL
    of the reference's (median) and a restart ≤ RESTART_GOAL_S (median); None where no rank kill landed."""
    stages = [v for v in rank["by_stage"].values() if v["trials"]]
    met = None
    if stages:
        met = all(
            v["trials"] >= min_trials
            and v["goodput_vs_reference"] is not None
            and v["goodput_vs_reference"] >= RANK_GOAL
            and (v["lost_per_kill_s"] or {}).get("restart", float("inf")) <= RESTART_GOAL_S
            for v in stages
        ) and len(stages) == len(GOODPUT_STAGES)
    return {
        "goodput_vs_reference": f">= {RANK_GOAL} in every stage",
        "restart_s": f"<= {RESTART_GOAL_S}",
        "trials_per_stage": f">= {min_trials}",
        "met": met,
    }


def short_stage(trials: list[Trial], stages: tuple[str, ...], rank_kills: int) -> str | None:
    """The first training stage among ``stages`` where fewer than ``rank_kills`` kills of one rank landed (a kill
    aimed at a save's short window may land in the steps after it), or None: where a top-up trial aims."""
    for stage in GOODPUT_STAGES:
        if stage in stages and sum(t.kind == "rank" and t.landed == stage for t in trials) < rank_kills:
            return stage
    return None


def goodput_of(store, run: str) -> tuple[dict[str, Any] | None, str]:
    """The training goodput of ``run`` (``runs/<id>``) over all its attempts (``runs.ledger``), as
    ``Goodput.to_dict()`` with its ``fraction``; or None and why not (the module absent, nothing recorded)."""
    try:
        from runs.ledger import load_goodput
    except ImportError as e:
        return None, f"runs.ledger cannot be imported ({e})"
    try:
        found = load_goodput(store, run)
    except Exception as e:  # noqa: BLE001 - a figure missing must not stop the soak's checks
        return None, f"load_goodput({run}) failed: {type(e).__name__}: {str(e)[:200]}"
    if found is None or found.fraction is None:
        return None, f"no goodput recorded for {run}" + ("" if found is None else " (no wall time)")
    return {**found.to_dict(), "fraction": found.fraction}, ""


# ----------------------------------------------------------------------------------------------
# Checks of a finished store against the reference


def whole_prefixes(store) -> list[str]:
    """Problems with committed prefixes that are not whole (empty: every committed prefix is)."""
    import hashlib

    from training.checkpointing.checkpoint import CheckpointIntegrityError, fetch

    problems: list[str] = []
    keys = set(store.list("datasets/")) | set(store.list("runs/")) | set(store.list("models/"))
    markers = sorted(k[: -len(COMMIT_MARKER) - 1] for k in keys if k.endswith(f"/{COMMIT_MARKER}"))
    for prefix in markers:
        inside = {k[len(prefix) + 1 :] for k in keys if k.startswith(f"{prefix}/")}
        parts = prefix.split("/")
        try:
            if parts[0] == "datasets" and len(parts) == 2:
                manifest = store.get_json(f"{prefix}/{MANIFEST}")
                for split in manifest["splits"].values():
                    for shard in split["shards"]:
                        data = store.get_bytes(f"{prefix}/{shard['name']}")
                        if hashlib.sha256(data).hexdigest() != shard["sha256"]:
                            problems.append(f"{prefix}: shard {shard['name']} does not match the manifest")
                if TOKENIZER not in inside:
                    problems.append(f"{prefix}: no {TOKENIZER}")
            elif parts[0] == "datasets" and parts[-1] == "validation":
                missing = {"result.json", "suite.json", "report.html"} - inside
                if missing:
                    problems.append(f"{prefix}: missing {sorted(missing)}")
            elif parts[0] == "runs" and len(parts) == 4 and parts[2] == "checkpoints":
                with tempfile.TemporaryDirectory(prefix="soak-verify-") as tmp:
                    fetch(store, prefix, Path(tmp) / "c")
            elif parts[0] == "runs" and len(parts) == 4 and parts[2] == "eval":
                if "results.json" not in inside or not any(k.startswith("hf/") for k in inside):
                    problems.append(f"{prefix}: evaluation outputs incomplete ({sorted(inside)[:6]})")
            elif parts[0] == "models" and len(parts) == 3:
                missing = {CARD, "card.md", TOKENIZER, "evaluation.json"} - inside
                if missing:
                    problems.append(f"{prefix}: missing {sorted(missing)}")
                with tempfile.TemporaryDirectory(prefix="soak-verify-") as tmp:
                    fetch(store, f"{prefix}/{ENTRY_CHECKPOINT}", Path(tmp) / "c", committed_at=prefix)
            else:
                problems.append(f"{prefix}: a committed prefix the soak does not know")
        except (CheckpointIntegrityError, FileNotFoundError, KeyError, ValueError) as e:
            problems.append(f"{prefix}: {type(e).__name__}: {str(e)[:300]}")
    return problems


@dataclass
class Outcome:
    """What a finished store holds, as the checks compare it."""

    dataset_version: str = ""
    run: str = ""
    final_checkpoint: str = ""
    versions: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, Any] = field(default_factory=dict, repr=False)
    entry_tensors: dict[str, Any] = field(default_factory=dict, repr=False)


def read_outcome(store) -> Outcome:
    from common.contracts import committed_steps
    from training.checkpointing.snapshot import checkpoint_tensors, comparable_metrics

    out = Outcome()
    root = f"models/{MODEL}"
    out.versions = sorted(int(c) for c in store.children(root) if c.isdigit() and store.is_committed(f"{root}/{c}"))
    if not out.versions:
        return out
    entry = f"{root}/{out.versions[0]}"
    card = store.get_json(f"{entry}/{CARD}")
    out.dataset_version = card["lineage"]["dataset_version"]
    out.run = card["lineage"]["training_run"]
    out.final_checkpoint = f"{out.run}/checkpoints/step-{committed_steps(store, out.run)[-1]:07d}"
    out.metrics = comparable_metrics(card["metrics"])
    records = [json.loads(line) for line in store.get_bytes(f"{out.run}/metrics.jsonl").decode().splitlines()]
    out.steps = [r["step"] for r in records]
    out.losses = [r["loss"] for r in records]
    out.tensors = checkpoint_tensors(store, out.final_checkpoint)
    out.entry_tensors = checkpoint_tensors(store, f"{entry}/{ENTRY_CHECKPOINT}", committed_at=entry)
    return out


def compare(reference: Outcome, got: Outcome) -> dict[str, Any]:
    from training.checkpointing.snapshot import differences

    tensor_diffs = differences(reference.tensors, got.tensors) if got.tensors else ["no final checkpoint"]
    entry_diffs = differences(reference.tensors, got.entry_tensors) if got.entry_tensors else ["no registered copy"]
    return {
        "versions": got.versions,
        "dataset_equal": got.dataset_version == reference.dataset_version,
        "bitwise_equal": not tensor_diffs and not entry_diffs,
        "tensor_differences": (tensor_diffs + entry_diffs)[:5],
        "tensors_compared": len(got.tensors),
        "steps_once": got.steps == list(range(1, STEPS + 1)),
        "losses_equal": got.losses == reference.losses,
        "metrics_equal": got.metrics == reference.metrics,
    }


# ----------------------------------------------------------------------------------------------
# Pipelines, faults and trials


@dataclass
class Trial:
    number: int
    stage: str  # where the fault is aimed
    fault: str  # "kill" | "outage"
    kind: str = "task"  # a kill's: "task" (the whole `pretrain run`, recovered by a rerun) or "rank" (one rank's process)
    rank: int | None = None  # a rank kill's rank (0: the marker writer, else another rank of the job)
    recovered_in_job: bool | None = None  # a rank kill's: the faulted run itself finished (its ranks restarted in place)
    aim: str = ""  # how: the marker and delay, or the store/log event of a fallback
    landed: str = ""  # where it landed: a kill's from the run's markers (kill_stage), an outage's from the store
    store_stage: str = ""  # where the store stood right after a kill (stage_of): the cross-check
    detail: str = ""
    fault_at_s: float = 0.0  # seconds after the faulted run started
    outage_s: float = 0.0
    faulted_rc: int | None = None
    rerun_rc: int | None = None
    rerun_s: float = 0.0
    checks: dict[str, Any] = field(default_factory=dict)
    twins: int = 0
    partial: list[str] = field(default_factory=list)
    recovered: bool = False
    orphans: int = 0
    orphan_commands: list[str] = field(default_factory=list)
    goodput: float | None = None  # the run's training goodput after its rerun (runs.ledger)
    goodput_detail: dict[str, Any] | None = None  # Goodput.to_dict(), or None with goodput_note
    goodput_note: str = ""
    harness_gap_s: float | None = None  # from the fault to the rerun's start: the soak's checks, not the pipeline's


@dataclass
class Aim:
    """When a fault fires: once ``after`` has appeared in the run's output (at once if empty) and
    the store shows ``stage`` under way, ``delay`` seconds later, or as soon as the stage's prefix
    holds ``objects`` objects. ``steps``: the checkpoints a checkpoint fault may hit, in order (a
    commit that was quicker than the poll moves on to the next). ``tight``: poll without pause
    once armed (upload windows are a fraction of a second)."""

    after: str
    stage: str
    delay: float = 0.0
    objects: int = 0
    steps: list[int] = field(default_factory=list)
    tight: bool = False
    armed_at: float | None = None

    def describe(self) -> str:
        if self.steps:
            point = f"checkpoint step {self.steps[0]} or later, {self.objects} files uploaded"
        else:
            point = f"{self.objects} objects of its prefix written" if self.objects else f"{self.delay:.2f} s in"
        return f"by the store: {self.stage}, {point}" + (f", after {self.after.strip()!r} in the log" if self.after else "")

    def armed(self, log_text: str) -> bool:
        if self.steps:  # from the step's line on: its checkpoint save follows it
            return f"step {self.steps[0]:>5}/{STEPS}" in log_text
        return not self.after or self.after in log_text

    def tight_now(self, where: Position, log_text: str) -> bool:
        return self.tight and self.armed(log_text) and (bool(self.steps) or where.stage == self.stage)

    def due(self, where: Position, log_text: str, now: float) -> bool:
        if not self.armed(log_text):
            return False
        if self.steps:
            while self.steps and where.step >= self.steps[0] and where.stage in ("train", "checkpoint", "evaluate"):
                if where.stage == "checkpoint" and where.step == self.steps[0]:
                    break
                self.steps.pop(0)  # this checkpoint committed before a poll saw it uploading
            return (
                bool(self.steps) and where.stage == "checkpoint" and where.step == self.steps[0] and where.objects >= self.objects
            )
        if where.stage != self.stage:
            return False
        if self.objects:
            return where.objects >= self.objects
        if self.armed_at is None:
            self.armed_at = now
        return now - self.armed_at >= self.delay


class Soak:
    def __init__(self, work: Path, seed: int) -> None:
        self.work = work
        self.rng = random.Random(seed)
        self.server = S3Server(data_dir=work / "s3", bucket=BUCKET)
        self.view = StoreView(self.server)
        self.config = work / "soak.yaml"
        self.procs: list[subprocess.Popen] = []
        self.timeline: dict[str, float] = {}
        self.reference = Outcome()
        self.reference_objects: dict[str, bytes] = {}
        self.reference_home = work / "reference-home"
        self.reference_markers: list[Marker] = []
        self.seen: dict[str, float] = {}  # the reference: when the store first showed each stage (time.time())
        self.commits: dict[int, float] = {}  # the reference: when each checkpoint step's commit marker appeared
        self.reference_goodput: dict[str, Any] | None = None
        self.goodput_note = ""
        self.fallbacks: dict[str, str] = {}  # stages aimed without markers (the code writes none there): why
        self.skipped: dict[str, str] = {}  # stages no kill can be aimed at in this code: why
        self.code = pin_code(work / "code")

    # -- processes ----------------------------------------------------------------------------
    def env(self, home: Path, tag: str) -> dict[str, str]:
        tmp = self.work / "tmp" / tag
        tmp.mkdir(parents=True, exist_ok=True)
        return {
            **os.environ,
            **self.server.env(),
            "HOME": str(home),
            "TMPDIR": str(tmp),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(self.code),  # ahead of the editable install: the pinned copy runs
            "PRETRAIN_LOG_DIR": str(self.work / "logs"),
            "SOAK_TAG": tag,  # finds any process of this pipeline that left its group
            MARKERS_ENV: str(self.markers(tag)),  # every process of the pipeline writes its stage markers there
        }

    def markers(self, tag: str) -> Path:
        return self.work / "markers" / f"{tag}.txt"

    def start(self, home: Path, tag: str) -> tuple[subprocess.Popen, Path]:
        log = self.work / "logs" / f"{tag}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.markers(tag).parent.mkdir(parents=True, exist_ok=True)
        self.markers(tag).unlink(missing_ok=True)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(Path(sys.executable).parent / "pretrain"), "run", "--config", str(self.config)],
                cwd=self.code,
                env=self.env(home, tag),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc, log

    def kill(self, proc: subprocess.Popen) -> float:
        """SIGKILL the process group; returns when the signal was sent (time.time()), after waiting for the leader."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        sent = time.time()
        proc.wait(timeout=60)
        return sent

    def orphans(self, tag: str, grace_s: float = 10.0) -> list[str]:
        """Processes of pipeline ``tag`` still alive ``grace_s`` after it ended or its group was killed
        (a SIGKILLed process in the middle of a write can take a moment to go): killed, and returned
        as 'pid pgid status: command line'."""
        import psutil

        tagged = []
        for p in psutil.process_iter(["pid"]):
            try:
                if p.pid != os.getpid() and p.environ().get("SOAK_TAG") == tag:
                    tagged.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        _, alive = psutil.wait_procs(tagged, timeout=grace_s) if tagged else ([], [])
        found = []
        for p in alive:
            try:
                found.append(f"{p.pid} {os.getpgid(p.pid)} {p.status()}: {' '.join(p.cmdline())[:300]}")
                p.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ProcessLookupError):
                continue
        return found

    def run_to_end(self, home: Path, tag: str, timeout: float = 900) -> tuple[int, float, str]:
        began = time.monotonic()
        proc, log = self.start(home, tag)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(proc)
            rc = -9
        return rc, time.monotonic() - began, log.read_text(errors="replace")

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                self.kill(proc)
        self.server.stop()

    # -- the reference ---------------------------------------------------------------------------
    def run_reference(self) -> None:
        """An uninterrupted run; records its stage markers, the timeline of its stages in the store (seconds
        after start; and by the clock, ``seen``) and when each checkpoint's commit marker appeared (``commits``)."""
        self.view.wipe()
        began = time.monotonic()
        proc, log = self.start(self.reference_home, "reference")
        while proc.poll() is None:
            try:
                keys = self.view.keys()
            except Exception:  # noqa: BLE001 - a poll that failed is retried
                keys = None
            now = time.time()
            if keys is not None:
                stage = stage_of(keys).stage
                if stage not in self.timeline:
                    self.timeline[stage] = round(time.monotonic() - began, 2)
                    self.seen[stage] = now
                for step in committed_steps(keys):
                    self.commits.setdefault(step, now)
            # Saves' commits bound the checkpoint windows: seen within a few hundredths of a second.
            time.sleep(0.02 if self.timeline.get("train") and "evaluate" not in self.timeline else 0.1)
        self.timeline["done"] = round(time.monotonic() - began, 2)
        self.seen.setdefault("done", time.time())
        self.reference_markers = read_markers(self.markers("reference"))
        if proc.returncode != 0:
            raise RuntimeError(f"the reference run failed (exit {proc.returncode}):\n{log.read_text()[-3000:]}")
        store = open_store(f"s3://{BUCKET}/{STORE_PREFIX}")
        problems = whole_prefixes(store)
        if problems:
            raise RuntimeError(f"the reference run left prefixes that are not whole: {problems}")
        self.reference = read_outcome(store)
        if len(self.reference.versions) != 1:
            raise RuntimeError(f"the reference run registered versions {self.reference.versions}")
        for key in self.view.keys():
            self.reference_objects[key] = store.get_bytes(key)
        names = {m.name for m in self.reference_markers}
        missing = [n for n in ("prepare", "validate", "train", "evaluate", "register") if n not in names]
        if missing:
            raise RuntimeError(f"the reference run wrote no stage marker {missing} ({self.markers('reference')})")
        if not plain_steps(self.reference_markers):
            self.fallbacks["train"] = "no train-step markers: aimed 0-0.3 s after a step's line in the log"
        if "checkpoint" not in names:
            self.fallbacks["checkpoint"] = "no checkpoint markers: aimed at a save's upload seen in the store"
        if "checkpoint-upload" not in names:
            self.skipped["checkpoint-upload"] = (
                "the reference run wrote no checkpoint-upload marker: its saves upload synchronously, "
                "so there is no asynchronous upload to kill"
            )
        self.reference_goodput, self.goodput_note = goodput_of(store, self.reference.run)

    # -- a trial's starting state ----------------------------------------------------------------
    def restore(self, stage: str, home: Path) -> None:
        """The store and flytekit cache as they were when ``stage`` began in the reference run."""
        self.view.wipe()
        done = CACHED_TASKS[: STARTS[stage]]
        home.mkdir(parents=True)
        if not done:
            return
        run = self.reference.run

        def belongs(key: str) -> bool:
            if key.startswith("datasets/"):
                return True
            if key.startswith(f"{run}/"):
                return "train_model" in done and ("/eval/" not in key or "evaluate_model" in done)
            return False

        store = open_store(f"s3://{BUCKET}/{STORE_PREFIX}")
        keys = sorted((k for k in self.reference_objects if belongs(k)), key=lambda k: (k.endswith(COMMIT_MARKER), k))
        for key in keys:  # markers last: nothing looks complete before its files are there
            store.put_bytes(key, self.reference_objects[key])
        shutil.copytree(self.reference_home / ".flyte", home / ".flyte")
        from diskcache import Cache

        with Cache(str(home / ".flyte" / "local-cache")) as cache:
            for key in list(cache.iterkeys()):
                task = key.rsplit("-", 2)[0].rsplit(".", 1)[-1]
                if task in CACHED_TASKS and task not in done:
                    cache.delete(key)

    # -- faults ----------------------------------------------------------------------------------
    def _span(self, stage: str) -> float:
        """How long ``stage`` lasted in the reference run, in seconds (from the store's timeline)."""
        order = ["prepare", "validate", "train", "evaluate", "register", "done"]
        nxt = order[order.index(stage) + 1]
        return max(self.timeline.get(nxt, 0.0) - self.timeline.get(stage, 0.0), 0.5)

    def aim(self, trial: Trial) -> MarkerAim | Aim:
        """A seeded random point of the trial's stage: a kill's by the run's markers (``marker_aim``), an
        outage's by the store (``store_aim``: it must meet an upload), but in evaluate (no upload to meet)."""
        if trial.fault == "outage" and trial.stage != "evaluate":
            return self.store_aim(trial.stage)
        return self.marker_aim(trial.stage)

    def marker_aim(self, target: str) -> MarkerAim | Aim:
        """A seeded random delay after the marker that opens ``target``, inside that stage's window in the
        reference: 5-85 % of it. The window ends at the next marker or when the store showed the stage's
        commit, whichever came first; an asynchronous upload's ends at its save's commit only (steps go on
        meanwhile). Steps and saves: a drawn one, then (if its window closes before the kill is due) the
        later ones, each at the same fraction of its own window. A stage this code marks nothing inside
        (``fallbacks``) is aimed as before markers (``store_aim``)."""
        rng, markers = self.rng, self.reference_markers
        if target in self.fallbacks:
            return self.store_aim(target)
        fraction = rng.uniform(0.05, 0.85)

        def spans(name: str, occurrences: list[int], end: dict[int, float] | None = None) -> list[float]:
            found = []
            for occurrence in occurrences:
                index = nth(markers, name, occurrence)
                assert index is not None
                until = end.get(save_step(occurrence)) if end is not None else None
                found.append(fraction * window(markers, index, until, bounded=name != "checkpoint-upload"))
            return found

        if target == "train":  # inside a step with no save
            steps = plain_steps(markers)
            later = steps[steps.index(rng.choice(steps)) :]
            return MarkerAim("train-step", later, spans("train-step", later))
        if target in ("checkpoint", "checkpoint-upload"):
            saves = [k for k in range(1, sum(m.name == target for m in markers) + 1) if save_step(k) in self.commits]
            if not saves:
                raise RuntimeError(f"the reference run's {target} markers match no committed checkpoint")
            later = saves[saves.index(rng.choice(saves)) :]
            return MarkerAim(target, later, spans(target, later, self.commits), until_commit=target == "checkpoint-upload")
        index = nth(markers, target, 1)
        assert index is not None
        ends = {"prepare": "validate", "validate": "train", "evaluate": "register", "register": "done"}
        return MarkerAim(target, [1], [fraction * window(markers, index, self.seen.get(ends[target]))])

    def store_aim(self, target: str) -> Aim:
        """A seeded random point of ``target`` as the store and the run's output show it (outages, and the
        kills of a stage with no markers inside it)."""
        rng = self.rng
        if target == "prepare":
            if rng.random() < 0.5:  # while the shards are uploaded: after some of the dataset's objects
                return Aim("encode:", "prepare", objects=rng.randint(1, 4), tight=True)
            return Aim("scan:", "prepare", delay=rng.uniform(0.0, 0.8))  # while the shards are encoded and written
        if target == "train":
            step = rng.choice([s for s in range(1, STEPS) if s % CHECKPOINT_EVERY])
            return Aim(f"step {step:>5}/{STEPS}", "train", delay=rng.uniform(0.0, 0.3))
        if target == "checkpoint":  # after some of a checkpoint's files are uploaded, before its marker
            first = rng.choice(CHECKPOINTS)
            return Aim("", "checkpoint", objects=rng.randint(1, 6), steps=[s for s in CHECKPOINTS if s >= first], tight=True)
        if target == "register" and rng.random() < 0.7:  # mid-copy: the entry partly written
            return Aim("", "register", objects=rng.randint(2, 12), tight=True)
        return Aim("", target, delay=rng.uniform(0.05, 0.85) * self._span(target))

    def place_kill(self, trial: Trial, proc: subprocess.Popen, tag: str, began: float) -> None:
        """Kill the run now and record where it landed: by its markers (``kill_stage``), the store's word beside."""
        trial.fault_at_s = round(time.monotonic() - began, 2)
        sent = self.kill(proc)
        if proc.returncode != -signal.SIGKILL:
            trial.landed, trial.detail = "missed", f"the run ended (exit {proc.returncode}) before the kill"
            return
        self.record_landing(trial, tag, sent)

    def record_landing(self, trial: Trial, tag: str, sent: float, killed: str = "") -> None:
        """Where a kill sent at ``sent`` (time.time()) landed: by the run's markers (``kill_stage``), with the store's
        word beside (listed once: nothing of the killed process moves after the kill). ``killed``: which process,
        for the detail."""
        markers = read_markers(self.markers(tag))
        try:
            keys: set[str] | None = self.view.keys()
        except Exception as e:  # noqa: BLE001 - the cross-check is lost, not the trial
            keys, trial.detail = None, f"store not listed ({type(e).__name__}); "
        where = stage_of(keys) if keys is not None else Position("unknown")
        trial.landed = kill_stage(markers, committed_steps(keys or set()), where.stage, at=sent)
        trial.store_stage = where.stage
        last = [m for m in markers if m.at <= sent]
        said = f"last marker {last[-1].name} {sent - last[-1].at:.2f} s before" if last else "no marker yet"
        trial.detail += killed + f"{said}; store: {where.stage}" + (f" ({where.describe()})" if where.describe() else "")

    def place_rank_kill(self, trial: Trial, proc: subprocess.Popen, tag: str, began: float) -> None:
        """SIGKILL one rank's process now (a node's fault: the job restarts its ranks in place), and record where it
        landed by the markers. Rank 0 wrote the markers (its pid is in them); another rank is a sibling of it, forked
        by the same fork server. The rank is drawn (seeded)."""
        import psutil

        markers = read_markers(self.markers(tag))
        writer = next((m.pid for m in reversed(markers) if m.pid), 0)
        trial.fault_at_s = round(time.monotonic() - began, 2)
        try:
            others = sorted(p.pid for p in psutil.Process(writer).parent().children() if p.pid != writer)
        except (psutil.Error, AttributeError, ValueError):
            others = []
        trial.rank = self.rng.choice([0] + ([1] if others else []))
        target = writer if trial.rank == 0 else others[0]
        try:
            os.kill(target, signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            trial.landed, trial.detail = "missed", f"rank {trial.rank} (pid {target}) was gone before the kill"
            return
        self.record_landing(trial, tag, time.time(), f"rank {trial.rank} (pid {target}); ")

    def wait_for(self, aim: MarkerAim, proc: subprocess.Popen, tag: str) -> bool:
        """Wait for the aim's marker (the marker file, read every MARKER_POLL_S), then until its time plus
        the delay, moving on while the aimed window closes first (an upload's commit: one listing of
        ``runs/`` per poll): True when due, False when the run ended first."""
        path = self.markers(tag)
        while proc.poll() is None:
            markers = read_markers(path)
            due = aim.fire_at(markers)
            if due is not None and time.time() < due:
                committed: set[int] = set()
                if aim.until_commit:
                    try:
                        committed = committed_steps(self.view.keys("runs/"))
                    except Exception:  # noqa: BLE001 - a poll that failed is retried
                        pass
                if aim.closed(markers, committed) and aim.move_on():
                    continue
            if due is not None and time.time() >= due:
                return True
            time.sleep(MARKER_POLL_S if due is None else min(max(due - time.time(), 0.0), MARKER_POLL_S))
        return False

    def fire_by_store(self, trial: Trial, proc: subprocess.Popen, log: Path, aim: Aim, tag: str, began: float) -> bool:
        """Poll the store and the run's output until ``aim`` is due, then kill (placed by the markers) or
        stop S3 for a few seconds; False when the run ended first."""
        while proc.poll() is None:
            text = log.read_text(errors="replace")
            try:
                where = stage_of(self.view.keys())
            except Exception:  # noqa: BLE001 - a poll that failed is retried
                continue
            if aim.due(where, text, time.monotonic() - began):
                if trial.fault == "kill":
                    self.place_kill(trial, proc, tag, began)
                else:
                    trial.fault_at_s = round(time.monotonic() - began, 2)
                    trial.landed, trial.detail = where.stage, where.describe()
                    self.outage(trial)
                return True
            if not aim.tight_now(where, text):
                time.sleep(POLL_S)
        return False

    def outage(self, trial: Trial) -> None:
        """S3 stopped for 2-6 s (seeded), then started again on the same data folder and port."""
        self.server.stop()
        trial.outage_s = round(self.rng.uniform(2.0, 6.0), 2)
        time.sleep(trial.outage_s)
        self.server.start()

    def run_trial(self, trial: Trial) -> Trial:
        tag = f"trial-{trial.number:02d}-{trial.stage}-{trial.kind if trial.fault == 'kill' else trial.fault}"
        home = self.work / "homes" / tag
        self.restore(trial.stage, home)
        aim = self.aim(trial)
        if trial.fault == "outage" and trial.stage == "prepare":
            aim = Aim("encode:", "prepare", objects=1, tight=True)  # while objects are uploaded
        trial.aim = aim.describe()
        began = time.monotonic()
        proc, log = self.start(home, f"{tag}-faulted")
        if isinstance(aim, MarkerAim):
            fired = self.wait_for(aim, proc, f"{tag}-faulted")
            trial.aim += f"; fired {aim.describe()}"
            if fired and trial.fault == "kill" and trial.kind == "rank":
                self.place_rank_kill(trial, proc, f"{tag}-faulted", began)
            elif fired and trial.fault == "kill":
                self.place_kill(trial, proc, f"{tag}-faulted", began)
            elif fired:  # an outage in evaluate: where by the markers, the store may not answer
                trial.fault_at_s = round(time.monotonic() - began, 2)
                trial.landed = kill_stage(read_markers(self.markers(f"{tag}-faulted")), set())
                trial.detail = f"S3 stopped after the {trial.landed} marker"
                self.outage(trial)
        else:
            fired = self.fire_by_store(trial, proc, log, aim, f"{tag}-faulted", began)
        if trial.fault == "outage" or not fired or trial.kind == "rank":
            try:
                proc.wait(timeout=1800)
            except subprocess.TimeoutExpired:
                self.kill(proc)
                trial.detail += f"; hung after the {trial.fault}: killed after 1800 s"
        trial.faulted_rc = proc.returncode
        if not fired:
            trial.landed, trial.detail = "missed", f"the run ended (exit {proc.returncode}) before the fault was due"
        trial.orphan_commands = self.orphans(f"{tag}-faulted")
        if fired and trial.kind == "task":  # the soak's own time between the fault and the rerun (checks, waits)
            trial.harness_gap_s = round(time.monotonic() - began - trial.fault_at_s, 2)
        if trial.kind == "rank" and fired:
            trial.recovered_in_job = proc.returncode == 0
        if trial.recovered_in_job:  # the job restarted its ranks and finished: no rerun
            rc, text = 0, self.markers(f"{tag}-faulted").read_text(errors="replace")
        else:
            rc, seconds, text = self.run_to_end(home, f"{tag}-rerun")
            trial.rerun_rc, trial.rerun_s = rc, round(seconds, 1)
            trial.orphan_commands += self.orphans(f"{tag}-rerun")
        trial.orphans = len(trial.orphan_commands)
        store = open_store(f"s3://{BUCKET}/{STORE_PREFIX}")
        trial.partial = whole_prefixes(store)
        if rc == 0:
            got = read_outcome(store)
            trial.checks = compare(self.reference, got)
            trial.twins = max(len(got.versions) - 1, 0)
            # The run's goodput over its attempts, the killed one and the rerun.
            trial.goodput_detail, trial.goodput_note = goodput_of(store, got.run)
            trial.goodput = trial.goodput_detail["fraction"] if trial.goodput_detail else None
        else:
            trial.checks = {"rerun_tail": text[-1500:]}
        checks = trial.checks
        trial.recovered = rc == 0 and all(
            checks.get(k) for k in ("dataset_equal", "bitwise_equal", "steps_once", "losses_equal", "metrics_equal")
        )
        shutil.rmtree(self.work / "tmp", ignore_errors=True)
        return trial


def trial_line(trial: Trial) -> str:
    """One trial's line on stdout: what was aimed where, where it landed, how it recovered, its run's goodput."""
    goodput = f"{trial.goodput:.4f}" if trial.goodput is not None else f"null ({trial.goodput_note})"
    return (
        f"trial {trial.number:2d}: {trial.kind + ' ' if trial.fault == 'kill' else ''}{trial.fault} aimed at "
        f"{trial.stage} ({trial.aim}), landed in {trial.landed} "
        f"({trial.detail}) at {trial.fault_at_s} s; faulted exit {trial.faulted_rc}; rerun exit {trial.rerun_rc} "
        f"in {trial.rerun_s} s; in the job {trial.recovered_in_job}; recovered {trial.recovered}; twins {trial.twins}; "
        f"partial {len(trial.partial)}; "
        f"goodput {goodput}"
        + (f"; {json.dumps({k: v for k, v in trial.checks.items() if v is not True})}" if not trial.recovered else "")
    )


def schedule(
    per_stage: int, outages: int, rng: random.Random, stages: tuple[str, ...] = STAGES, rank_kills: int = 0
) -> list[Trial]:
    """The trials in a seeded order: ``per_stage`` kills of the whole task aimed at each stage, ``rank_kills`` kills
    of one rank aimed at each training stage among ``stages``, and ``outages``."""
    plan = [(stage, "kill", "task") for stage in stages for _ in range(per_stage)]
    plan += [(stage, "kill", "rank") for stage in stages if stage in GOODPUT_STAGES for _ in range(rank_kills)]
    targets = ["checkpoint", "register", "prepare", "evaluate"]
    plan += [(targets[i % len(targets)], "outage", "task") for i in range(outages)]
    rng.shuffle(plan)
    return [Trial(number=i + 1, stage=stage, fault=fault, kind=kind) for i, (stage, fault, kind) in enumerate(plan)]


def main() -> int:
    global STEPS, CHECKPOINT_EVERY, CHECKPOINTS, LOCAL_CHECKPOINT_EVERY  # the run's shape, read by the aims and checks
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--per-stage", type=int, default=2, help=f"kills aimed at each stage ({len(STAGES)} stages)")
    parser.add_argument("--outages", type=int, default=2, help="S3 server stops during uploads")
    parser.add_argument("--work", type=Path, default=None, help="working folder (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the working folder (logs, S3 data)")
    parser.add_argument("--stages", default=",".join(STAGES), help="the stages to fault, comma-separated (default: all)")
    parser.add_argument(
        "--steps", type=int, default=STEPS, help="training steps (default 24; more: a run long enough to weigh a restart)"
    )
    parser.add_argument("--checkpoint-every", type=int, default=CHECKPOINT_EVERY, help="steps between checkpoints (default 8)")
    parser.add_argument(
        "--local-checkpoint-every",
        type=int,
        default=LOCAL_CHECKPOINT_EVERY,
        help="steps between the checkpoints each node keeps between the store's (train.local_checkpoint_every; default 0: none)",
    )
    parser.add_argument(
        "--rank-kills", type=int, default=0, help="kills of one rank aimed at each training stage (restarted inside the job)"
    )
    parser.add_argument(
        "--top-ups",
        type=int,
        default=0,
        help="rank kills aimed again at a stage where fewer than --rank-kills landed, at most this many (default 0)",
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the last line's JSON object to this file")
    args = parser.parse_args()
    chosen = tuple(args.stages.split(","))
    if unknown := [stage for stage in chosen if stage not in STAGES]:
        parser.error(f"--stages: {unknown} are not stages ({', '.join(STAGES)})")
    if args.checkpoint_every < 1 or args.steps < 2 * args.checkpoint_every:
        parser.error("--steps must be at least twice --checkpoint-every (a kill needs a save before it and after it)")
    if args.local_checkpoint_every < 0:
        parser.error("--local-checkpoint-every must be >= 0 (0 = none)")
    STEPS, CHECKPOINT_EVERY, LOCAL_CHECKPOINT_EVERY = args.steps, args.checkpoint_every, args.local_checkpoint_every
    CHECKPOINTS = list(range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY))
    # Ctrl-C and a plain kill both unwind through the finally below, which stops every process started.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    began = time.monotonic()
    work = (args.work or Path(tempfile.mkdtemp(prefix="pretrain-soak-"))).absolute()
    work.mkdir(parents=True, exist_ok=True)
    soak = Soak(work, args.seed)
    corpus = write_corpus(work / "corpus")
    soak.config.write_text(yaml.safe_dump(soak_config(corpus)))
    trials: list[Trial] = []
    planned: list[Trial] = []
    try:
        soak.server.start()
        os.environ.update(soak.server.env())  # the soak's own reads of the store (the same after a restart)
        soak.run_reference()
        reference_goodput = soak.reference_goodput["fraction"] if soak.reference_goodput else None
        print(
            f"reference: {soak.timeline['done']:.0f} s, dataset {soak.reference.dataset_version}, "
            f"timeline {soak.timeline}, {len(soak.reference.tensors)} tensors, "
            f"markers {dict(collections.Counter(m.name for m in soak.reference_markers))}, "
            f"goodput {reference_goodput if reference_goodput is not None else 'null: ' + soak.goodput_note}",
            flush=True,
        )
        for stage, why in soak.fallbacks.items():
            print(f"{stage}: kills aimed without markers: {why}", flush=True)
        for stage, why in soak.skipped.items():
            print(f"{stage}: skipped: {why}", flush=True)
        stages = tuple(s for s in chosen if s not in soak.skipped)
        planned = schedule(args.per_stage, args.outages, soak.rng, stages, args.rank_kills)
        for trial in planned:
            soak.run_trial(trial)
            trials.append(trial)
            print(trial_line(trial), flush=True)
        # Top-ups: a rank kill aimed again at a stage where fewer than --rank-kills landed, at most --top-ups times.
        while len(trials) - len(planned) < args.top_ups and (stage := short_stage(trials, stages, args.rank_kills)):
            trial = Trial(number=len(trials) + 1, stage=stage, fault="kill", kind="rank")
            soak.run_trial(trial)
            trials.append(trial)
            print(trial_line(trial) + " (a top-up)", flush=True)
    finally:
        soak.close()
        report = {
            "timeline": soak.timeline,
            "reference_markers": [asdict(m) for m in soak.reference_markers],
            "reference_seen": soak.seen,
            "reference_commits": soak.commits,
            "reference_goodput": soak.reference_goodput,
            "goodput_note": soak.goodput_note,
            "fallbacks": soak.fallbacks,
            "skipped": soak.skipped,
            "trials": [asdict(t) for t in trials],
        }
        (work / "soak-report.json").write_text(json.dumps(report, indent=2, default=str))
        if not args.keep:
            shutil.rmtree(work / "s3", ignore_errors=True)
            shutil.rmtree(work / "homes", ignore_errors=True)

    stages = tuple(s for s in chosen if s not in soak.skipped)
    kills = [t for t in trials if t.fault == "kill" and t.landed in stages]
    by_stage = {stage: sum(t.landed == stage for t in kills) for stage in stages}
    task_kills = [t for t in kills if t.kind == "task"]
    under_kills = [t.goodput for t in task_kills if t.landed in GOODPUT_STAGES and t.goodput is not None]
    goodput_note = soak.goodput_note or next((t.goodput_note for t in kills if t.landed in GOODPUT_STAGES and t.goodput_note), "")
    reference_goodput = soak.reference_goodput["fraction"] if soak.reference_goodput else None
    reference_parts = soak.reference_goodput["parts"] if soak.reference_goodput else None
    summary = {
        "kills": len(kills),
        "kills_by_stage": by_stage,
        "skipped": soak.skipped,
        "store_disagrees": sum(t.store_stage not in STORE_AGREES[t.landed] for t in kills),
        "outages": sum(t.fault == "outage" and t.landed != "missed" for t in trials),
        "recovered": sum(t.recovered for t in trials),
        "trials": len(trials),
        "missed": sum(t.landed not in stages if t.fault == "kill" else t.landed == "missed" for t in trials),
        "bitwise_equal": bool(trials) and all(t.checks.get("bitwise_equal") for t in trials),
        "twins": sum(t.twins for t in trials),
        "partial_visible": sum(len(t.partial) for t in trials),
        "orphans": sum(t.orphans for t in trials),
        "dataset_version": soak.reference.dataset_version,
        "tensors_compared": len(soak.reference.tensors),
        **goodput_summary(reference_goodput, under_kills, goodput_note),
        **lost_per_kill([t for t in task_kills if t.landed in GOODPUT_STAGES], reference_parts),
        "seconds": round(time.monotonic() - began, 1),
        "machine": machine(),
        "seed": args.seed,
        "report": str(work / "soak-report.json"),
    }
    rank_kills = [t for t in kills if t.kind == "rank"]
    if rank_kills:  # the headline: kills of one rank, restarted inside the job
        rank = kind_summary(rank_kills, reference_goodput, reference_parts)
        summary["task_kills"] = kind_summary(task_kills, reference_goodput, reference_parts)
        summary["rank_kills"] = rank
        summary["recovered_in_job"] = sum(bool(t.recovered_in_job) for t in rank_kills)
        summary["ratios"] = {"goodput_vs_reference": rank["goodput_vs_reference"]}
        summary["spread"] = {"goodput_vs_reference": rank["spread"]}
        summary["goal"] = rank_goal(rank, args.rank_kills)
        summary["top_ups"] = sum(t.number > len(planned) for t in trials)
    print(json.dumps(summary))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    goal = (
        summary["kills"] >= 10
        and all(by_stage.values())
        and summary["recovered"] == len(trials)
        and summary["bitwise_equal"]
        and summary["twins"] == 0
        and summary["partial_visible"] == 0
    )
    return 0 if goal else 1


if __name__ == "__main__":
    sys.exit(main())
