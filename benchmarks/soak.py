"""Soak: SIGKILLs and S3 outages in every stage of the pipeline, each followed by a rerun, checked.

    python benchmarks/soak.py [--seed 18] [--per-stage 2] [--outages 2] [--work DIR] [--keep]

One SeaweedFS S3 server (``storage.s3server.S3Server``) holds the store ``s3://soak/store``.
An uninterrupted reference run of a small pipeline (``soak_config``) records what a run must
produce: the dataset version, the final checkpoint's tensors (weights and AdamW moments,
``training.checkpointing.snapshot``), the card's metrics, and the timeline of its stages as seen in the
store. Then each trial

1. resets the store and flytekit's local cache (a private ``HOME``) to the state just before
   its stage: empty for prepare and validate; for the later stages, the reference's store
   objects and cache entries of the stages before it (the cache key of a task is its inputs
   and code version, and those refs point into the same store URI, so a trial of ``train``
   starts exactly where a fresh execution would be when train begins);
2. runs ``pretrain run --config soak.yaml`` (its own session) and, at a seeded random point of
   the trial's stage, SIGKILLs the whole process group, or stops the S3 server for a few
   seconds and starts it again (same data folder and port) while objects are being uploaded;
3. reruns the same command to completion with the same ``HOME``, as a Flyte retry would
   (cached stages hit);
4. checks: exactly one committed registry version (no twins); every committed prefix whole
   (dataset shards against the manifest, validation outputs, every checkpoint against its
   ``digests.json``, evaluation outputs, the registry entry and its checkpoint copy), so no
   partial prefix is visible as complete; the dataset version, the final checkpoint's and the
   registered copy's tensors (``torch.equal``, every key, same key sets), the per-step losses
   (each step once, none lost, none doubled) and the card's metrics (timing ones excluded)
   identical to the reference's.

Where a kill lands is read from the store at the moment of the kill (which stage had not
committed yet), and ``kills_by_stage`` counts those; ``checkpoint`` is a kill inside a
checkpoint commit (some of a step's files uploaded, no ``_COMMITTED``), ``train`` one inside
a step. The last line of stdout is one JSON object (see docs/soak.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
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
from storage import COMMIT_MARKER, open_store  # noqa: E402
from storage.s3server import S3Server  # noqa: E402

BUCKET = "soak"
STORE_PREFIX = "store"
MODEL = "gpt-soak"
STEPS = 24
STAGES = ("prepare", "validate", "train", "checkpoint", "evaluate", "register")
CACHED_TASKS = ("prepare_data", "validate_data", "train_model", "evaluate_model", "register_model")
# Where each stage's trial starts: the cached tasks (and their store objects) that precede it.
STARTS = {"prepare": 0, "validate": 0, "train": 2, "checkpoint": 2, "evaluate": 3, "register": 4}
POLL_S = 0.05


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
            "checkpoint_every": 8,
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

    def client(self):
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

    def keys(self) -> set[str]:
        found: set[str] = set()
        client = self.client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{STORE_PREFIX}/"):
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


def stage_of(keys: set[str]) -> Position:
    """Where a pipeline stands, from one listing of the store."""

    def marker(depth: int, head: str, tail: str = "") -> bool:
        return any(k.startswith(head) and k.endswith(f"{tail}/{COMMIT_MARKER}") and k.count("/") == depth for k in keys)

    if not marker(2, "datasets/"):
        return Position("prepare", sum(k.startswith("datasets/") for k in keys))
    if not marker(3, "datasets/", "/validation"):
        return Position("validate", sum("/validation/" in k for k in keys))
    files: dict[int, int] = {}
    committed: set[int] = set()
    for k in keys:
        parts = k.split("/")
        if len(parts) >= 5 and parts[0] == "runs" and parts[2] == "checkpoints" and parts[3].startswith("step-"):
            step = int(parts[3].removeprefix("step-"))
            files[step] = files.get(step, 0) + 1
            if len(parts) == 5 and parts[4] == COMMIT_MARKER:
                committed.add(step)
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
    landed: str = ""  # where it landed, from the store at that moment
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


CHECKPOINT_EVERY = 8
CHECKPOINTS = [s for s in range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY)]


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
        }

    def start(self, home: Path, tag: str) -> tuple[subprocess.Popen, Path]:
        log = self.work / "logs" / f"{tag}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
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

    def kill(self, proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)

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
        """An uninterrupted run; records the timeline of its stages in the store (seconds after start)."""
        self.view.wipe()
        began = time.monotonic()
        proc, log = self.start(self.reference_home, "reference")
        while proc.poll() is None:
            try:
                stage = stage_of(self.view.keys()).stage
            except Exception:  # noqa: BLE001 - a poll that failed is retried
                stage = ""
            if stage and stage not in self.timeline:
                self.timeline[stage] = round(time.monotonic() - began, 2)
            time.sleep(0.1)
        self.timeline["done"] = round(time.monotonic() - began, 2)
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

    def aim(self, trial: Trial) -> Aim:
        """A seeded random point of the trial's stage."""
        rng, target = self.rng, trial.stage
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

    def run_trial(self, trial: Trial) -> Trial:
        tag = f"trial-{trial.number:02d}-{trial.stage}-{trial.fault}"
        home = self.work / "homes" / tag
        self.restore(trial.stage, home)
        aim = self.aim(trial)
        if trial.fault == "outage" and trial.stage == "prepare":
            aim = Aim("encode:", "prepare", objects=1, tight=True)  # while objects are uploaded
        began = time.monotonic()
        proc, log = self.start(home, f"{tag}-faulted")
        fired = False
        while proc.poll() is None and not fired:
            text = log.read_text(errors="replace")
            try:
                where = stage_of(self.view.keys())
            except Exception:  # noqa: BLE001 - a poll that failed is retried
                continue
            elapsed = time.monotonic() - began
            if aim.due(where, text, elapsed):
                fired = True
                trial.fault_at_s = round(elapsed, 2)
                if trial.fault == "kill":
                    self.kill(proc)
                    where = stage_of(self.view.keys())  # where it stopped: nothing moves after the kill
                    trial.landed, trial.detail = where.stage, where.describe()
                else:
                    self.server.stop()
                    trial.landed, trial.detail = where.stage, where.describe()
                    trial.outage_s = round(self.rng.uniform(2.0, 6.0), 2)
                    time.sleep(trial.outage_s)
                    self.server.start()
            elif not aim.tight_now(where, text):
                time.sleep(POLL_S)
        if trial.fault == "outage" or not fired:
            try:
                proc.wait(timeout=600)
            except subprocess.TimeoutExpired:
                self.kill(proc)
                trial.detail += "; hung after the outage: killed after 600 s"
        trial.faulted_rc = proc.returncode
        if not fired:
            trial.landed, trial.detail = "missed", f"the run ended (exit {proc.returncode}) before the fault was due"
        trial.orphan_commands = self.orphans(f"{tag}-faulted")
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
        else:
            trial.checks = {"rerun_tail": text[-1500:]}
        checks = trial.checks
        trial.recovered = rc == 0 and all(
            checks.get(k) for k in ("dataset_equal", "bitwise_equal", "steps_once", "losses_equal", "metrics_equal")
        )
        shutil.rmtree(self.work / "tmp", ignore_errors=True)
        return trial


def schedule(per_stage: int, outages: int, rng: random.Random) -> list[Trial]:
    plan = [(stage, "kill") for stage in STAGES for _ in range(per_stage)]
    targets = ["checkpoint", "register", "prepare", "evaluate"]
    plan += [(targets[i % len(targets)], "outage") for i in range(outages)]
    rng.shuffle(plan)
    return [Trial(number=i + 1, stage=stage, fault=fault) for i, (stage, fault) in enumerate(plan)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--per-stage", type=int, default=2, help="kills aimed at each stage (6 stages)")
    parser.add_argument("--outages", type=int, default=2, help="S3 server stops during uploads")
    parser.add_argument("--work", type=Path, default=None, help="working folder (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the working folder (logs, S3 data)")
    args = parser.parse_args()
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
    try:
        soak.server.start()
        os.environ.update(soak.server.env())  # the soak's own reads of the store (the same after a restart)
        soak.run_reference()
        print(
            f"reference: {soak.timeline['done']:.0f} s, dataset {soak.reference.dataset_version}, "
            f"timeline {soak.timeline}, {len(soak.reference.tensors)} tensors",
            flush=True,
        )
        for trial in schedule(args.per_stage, args.outages, soak.rng):
            soak.run_trial(trial)
            trials.append(trial)
            print(
                f"trial {trial.number:2d}: {trial.fault} aimed at {trial.stage}, landed in {trial.landed} "
                f"({trial.detail}) at {trial.fault_at_s} s; faulted exit {trial.faulted_rc}; rerun exit {trial.rerun_rc} "
                f"in {trial.rerun_s} s; recovered {trial.recovered}; twins {trial.twins}; partial {len(trial.partial)}"
                + (f"; {json.dumps({k: v for k, v in trial.checks.items() if v is not True})}" if not trial.recovered else ""),
                flush=True,
            )
    finally:
        soak.close()
        report = {"timeline": soak.timeline, "trials": [asdict(t) for t in trials]}
        (work / "soak-report.json").write_text(json.dumps(report, indent=2, default=str))
        if not args.keep:
            shutil.rmtree(work / "s3", ignore_errors=True)
            shutil.rmtree(work / "homes", ignore_errors=True)

    kills = [t for t in trials if t.fault == "kill" and t.landed not in ("missed", "done")]
    by_stage = {stage: sum(t.landed == stage for t in kills) for stage in STAGES}
    summary = {
        "kills": len(kills),
        "kills_by_stage": by_stage,
        "outages": sum(t.fault == "outage" and t.landed != "missed" for t in trials),
        "recovered": sum(t.recovered for t in trials),
        "trials": len(trials),
        "missed": sum(t.landed in ("missed", "done") for t in trials),
        "bitwise_equal": bool(trials) and all(t.checks.get("bitwise_equal") for t in trials),
        "twins": sum(t.twins for t in trials),
        "partial_visible": sum(len(t.partial) for t in trials),
        "orphans": sum(t.orphans for t in trials),
        "dataset_version": soak.reference.dataset_version,
        "tensors_compared": len(soak.reference.tensors),
        "seconds": round(time.monotonic() - began, 1),
        "machine": machine(),
        "seed": args.seed,
        "report": str(work / "soak-report.json"),
    }
    print(json.dumps(summary))
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
