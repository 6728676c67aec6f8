"""The training loop. ``train`` runs on every rank; all ranks return the same record.

Launch it under torchrun, a Flyte ``Elastic`` task, or ``training.launch.spawn``: it
reads RANK/WORLD_SIZE/MASTER_* from the environment. The run id is a hash of the dataset
version, the configs and the training code, identical on every rank without any
communication; a restarted task with the same inputs therefore finds its own
checkpoints and resumes from the latest committed one.

Two identical executions at once share that run prefix too: rank 0 holds the run's lease
(``training.runs.lease``) while the job trains, and an identical job waits for it before it looks
for checkpoints, then resumes from what the first committed (its final checkpoint: nothing to
train, the same CheckpointRef).
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict

import torch
import torch.distributed as dist

from common.codeversion import code_version
from common.contracts import (
    ENTRY_CHECKPOINT,
    METRICS,
    STEP_TIMES,
    CheckpointRef,
    DatasetRef,
    Layout,
    LayoutSpan,
    ModelCard,
    card_key,
    checkpoint_prefix,
    describe_layouts,
    extend_layouts,
    health_key,
    metrics_key,
    run_prefix,
    step_times_key,
)
from common.errors import ConfigError
from common.hashing import config_hash
from storage import open_store
from training.checkpointing import checkpoint
from training.config import ModelConfig, ParallelConfig, TrainConfig
from training.data import StreamingLoader
from training.distributed import checkpoint_group, init_distributed, shutdown_distributed
from training.model.step import build_step, micro_batches
from training.observe.diagnostics import write_diagnostics
from training.observe.health import BadLossError, LossHealth
from training.observe.metrics import StepMetrics
from training.observe.profiling import WindowProfiler
from training.observe.stragglers import StragglerMonitor
from training.observe.timing import StepTimer, phase_key
from training.observe.watchdog import Progress, Watchdog, explain
from training.runs.lease import LeaseLost, RunLease


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


def run_id(dataset: DatasetRef, model: ModelConfig, train_cfg: TrainConfig, base_model: str = "") -> str:
    return config_hash(dataset.version, model, train_cfg.identity(), base_model, code_version("training.train"))


def train(
    dataset: DatasetRef,
    model_cfg: ModelConfig,
    parallel: ParallelConfig,
    cfg: TrainConfig,
    base_model: str = "",
    on_record: Callable[[dict], None] | None = None,
) -> CheckpointRef:
    """Train on every rank; catches and labels a rank's error so that it is never lost.

    ``base_model`` is a registry entry's key prefix (``models/<name>/<version>``) whose
    weights start the run (continued pretraining); empty means a fresh initialisation.
    ``on_record`` (rank 0 only) hears each step's metrics record once it is final (after the
    step's checkpoint save, if any); it must return at once (e.g. queue it: ``tracking.sender``).
    """
    rank = int(os.environ.get("RANK", "0"))
    progress = Progress()
    watchdog = Watchdog(progress, rank).start()
    try:
        with ExitStack() as cleanup:  # the run's lease, released however training ends
            return _train(dataset, model_cfg, parallel, cfg, base_model, progress, cleanup, on_record)
    except Exception as e:
        print(f"[rank {rank}] training failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        failure = explain(e, rank, progress, parallel.collective_timeout_s)
        if failure is None:
            raise
        print(f"[rank {rank}] {failure}", file=sys.stderr, flush=True)
        raise failure from e
    finally:
        watchdog.stop()
        shutdown_distributed()


def _layouts_of(meta: dict) -> list[LayoutSpan]:
    """The layouts that trained a checkpoint's steps. A checkpoint saved before meta.json kept
    the history names only the layout that saved it: it stands for all its steps."""
    if "layouts" in meta:
        return [LayoutSpan.from_dict(span) for span in meta["layouts"]]
    return [LayoutSpan(1, meta["step"], Layout(**meta["layout"]))]


def _resume_note(run: str, start: int, steps: int, history: list[LayoutSpan], layout: Layout, optimizer_restored: bool) -> str:
    """What resuming ``run`` at ``start`` means, in plain words, for the log."""
    before = history[0].layout.describe() if len(history) == 1 else describe_layouts(history)
    if start >= steps:
        theirs = "" if history[-1].layout == layout else f", not this call's ({layout.describe()})"
        return (
            f"run {run} already finished {start} steps ({before}): nothing to train; reusing its checkpoint. "
            f"Its weights, tokens/s and layout are that run's{theirs}."
        )
    if history[-1].layout != layout:
        carried = "weights and optimizer state carry over"
        if not optimizer_restored:
            carried = "weights carry over, the optimizer starts afresh"
        return (
            f"run {run} has steps 1-{start} trained by another layout ({before}): resuming from step {start}, "
            f"training steps {start + 1}-{steps} with {layout.describe()}; the {carried}."
        )
    return f"resumed {run} from step {start}"


def _jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def _saved_lines(store, prefix: str, name: str, start: int) -> list[dict]:
    """A checkpoint's copy of a JSONL file, its records up to step ``start``."""
    key = f"{prefix}/{name}"
    if not store.exists(key):
        return []
    return [r for r in map(json.loads, store.get_bytes(key).decode().splitlines()) if r["step"] <= start]


def _step_line(record: dict, steps: int) -> str:
    line = (
        f"step {record['step']:>5}/{steps} | loss {record['loss']:.4f} | lr {record['lr']:.2e} | "
        f"grad_norm {record['grad_norm']:.3f} | {record['tokens_per_s']:,.0f} tok/s"
    )
    if record.get("mfu") is not None:
        line += f" | MFU {record['mfu']:.1%}"
    line += f" | data {record['data_wait_fraction']:.0%}"
    if "slowest_rank" in record:  # a straggler exchange ended with this step
        line += f" | slowest rank {record['slowest_rank']} ({record['slowest_ratio']:.2f}× the others)"
    if "skipped" in record:
        line += " | SKIPPED (bad loss)"
    return line


def _take_lease(store, run: str, rank: int, progress: Progress) -> RunLease | None:
    """Collective: rank 0 takes the run's lease, waiting while an identical execution holds it
    (polling; every rank hears each outcome by broadcast, so no collective waits for long).
    Returns rank 0's lease, refreshing (None on the other ranks)."""
    lease = RunLease(store, run) if rank == 0 else None
    progress.enter("waiting for the run's lease", 0)  # as long as the identical execution takes
    while True:
        outcome: list = [None]
        if lease is not None:
            try:
                outcome = ["held" if lease.try_acquire() else "waiting"]
            except Exception as e:  # noqa: BLE001 - the other ranks must hear of it, not hang
                outcome = [f"{type(e).__name__}: {e}"]
        dist.broadcast_object_list(outcome, src=0, group=checkpoint_group())
        if outcome[0] == "held":
            break
        if outcome[0] != "waiting":
            raise RuntimeError(f"run {run}: taking its lease failed on rank 0: {outcome[0]}")
        if lease is not None:
            time.sleep(lease.poll_s)
    if lease is not None:
        lease.start_refreshing()
    return lease


def _check_lease(lease: RunLease | None) -> None:
    """Collective: LeaseLost on every rank if rank 0's lease was taken over (before writing)."""
    lost = [lease.lost if lease is not None else None]
    dist.broadcast_object_list(lost, src=0, group=checkpoint_group())
    if lost[0]:
        raise LeaseLost(lost[0])


def _train(
    dataset: DatasetRef,
    model_cfg: ModelConfig,
    parallel: ParallelConfig,
    cfg: TrainConfig,
    base_model: str,
    progress: Progress,
    cleanup: ExitStack,
    on_record: Callable[[dict], None] | None = None,
) -> CheckpointRef:
    from megatron.core import parallel_state as ps

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    init_distributed(parallel, cfg.seed)
    rank = dist.get_rank()
    dp_size, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    micro_batches(cfg, dp_size)  # fail on an impossible batch split before loading anything

    loader, manifest = StreamingLoader.for_split(
        dataset, "train", cfg.global_batch_size, cfg.seed, window_shards=cfg.shuffle_window_shards
    )
    seq_len = manifest["seq_len"]
    trainer = build_step(model_cfg, parallel, cfg, manifest["vocab_size"], seq_len)
    model, optimizer = trainer.model, trainer.optimizer
    params = [p for p in model.parameters() if p.requires_grad]

    store = open_store(dataset.store)
    run = run_prefix(run_id(dataset, model_cfg, cfg, base_model))
    progress.world_size = dist.get_world_size()
    progress.diagnose = lambda reason: write_diagnostics(store, run, rank, reason)
    layout = Layout(dist.get_world_size(), parallel.tensor_parallel, parallel.pipeline_parallel, parallel.distributed_optimizer)
    history: list[LayoutSpan] = []  # the layouts that trained steps 1..start
    metrics: list[dict] = []
    step_times: list[dict] = []  # every rank's breakdown, gathered at each straggler exchange (rank 0)
    start = 0
    lease = _take_lease(store, run, rank, progress)  # before the resume lookup: the holder may still commit
    if lease is not None:
        cleanup.callback(lease.release)
    done = checkpoint.committed_steps(store, run)
    if done:
        start = done[-1]
        progress.enter(f"resume from step {start}", parallel.checkpoint_timeout_s)
        resumed = checkpoint.load(store, checkpoint_prefix(run, start), model, optimizer, asdict(layout))
        loader.check_resume(resumed["loader"], start)
        history = _layouts_of(resumed)
        # The checkpoint's own copies: the run's files may predate a crash right after the commit.
        metrics = _saved_lines(store, checkpoint_prefix(run, start), METRICS, start)
        # A checkpoint's copy of its own step's record lacks the save's time; the run's file has it once published.
        published = {r["step"]: r for r in _saved_lines(store, run, METRICS, start)}
        metrics = [published[r["step"]] if published.get(r["step"], {}).get("loss") == r["loss"] else r for r in metrics]
        step_times = _saved_lines(store, checkpoint_prefix(run, start), STEP_TIMES, start)
        if rank == 0:
            restored = checkpoint.restores_optimizer(resumed, optimizer, asdict(layout))
            print(_resume_note(run, start, cfg.steps, history, layout, restored), flush=True)
    elif base_model:
        problem = ModelCard.from_dict(store.get_json(card_key(base_model))).continuation_problem(asdict(model_cfg))
        if problem:
            raise ConfigError(problem)
        checkpoint.load_weights(store, f"{base_model}/{ENTRY_CHECKPOINT}", model, committed_at=base_model)
        if rank == 0:
            print(f"initialised {run} from {store.url(base_model)}", flush=True)

    n_params = trainer.num_parameters()
    tokens_per_step = cfg.global_batch_size * seq_len
    meter = StepMetrics.for_training(model_cfg, cfg, seq_len, dist.get_world_size(), params[0], store, run, rank == 0)
    timer = StepTimer(params[0].device, on_phase=progress.at)
    health = LossHealth.restore(cfg, metrics)
    stragglers = StragglerMonitor(cfg, params[0].device)
    profiler = WindowProfiler(cfg, store, run, rank, params[0].device)

    def save(step: int) -> str:
        meta = {
            "step": step,
            "layout": asdict(layout),
            "layouts": [asdict(span) for span in extend_layouts(history, start + 1, step, layout)],
            "model": asdict(model_cfg),
            "train": asdict(cfg),
            "dataset": dataset.version,
            "loader": loader.state_dict(step),
        }
        progress.enter(f"checkpoint save at step {step}", parallel.checkpoint_timeout_s)
        progress.at(step, "checkpoint")
        _check_lease(lease)  # nothing written by a job that lost the run to an identical one
        loader.wait_idle()  # the checkpoint writer forks: not while a read is in flight
        files = {METRICS: _jsonl(metrics), STEP_TIMES: _jsonl(step_times)}
        prefix = checkpoint.save(store, run, step, model, optimizer, meta, cfg.keep_checkpoints, files)
        if rank == 0:
            _publish(store, run, metrics, step_times, health.events)
        return prefix

    prefix = checkpoint_prefix(run, start) if done else ""
    for step in range(start, cfg.steps):
        progress.enter(f"step {step + 1}", parallel.stall_timeout_s)
        profiler.before_step(step + 1)
        timer.start(step + 1)
        with timer.phase("data"):
            lr = lr_at(step, cfg)
            batch = loader.batch(step, dp_rank, dp_size)
        origin = functools.partial(loader.origin, step)
        try:
            result = trainer.step(batch.tokens, lr, timer, functools.partial(health.judge, step + 1, origin=origin))
        except BadLossError:
            # Every rank refused the same loss. The event (the batch's shards and rows) is stored before any
            # rank exits: the launcher stops the others as soon as one fails.
            if rank == 0:
                _publish(store, run, metrics, step_times, health.events)
            dist.barrier()
            raise
        dt = timer.elapsed()
        breakdown = timer.breakdown(dt)
        record = {"step": step + 1, "loss": result.loss, "lr": lr, "grad_norm": result.grad_norm}
        record["tokens_per_s"] = tokens_per_step / dt
        if not result.applied:
            record["skipped"] = True
            record["health"] = health.events[-1]
        record |= breakdown
        stragglers.record(step + 1, dt, breakdown)
        if stragglers.due(step + 1, last=step + 1 == cfg.steps):
            progress.at(step + 1, "straggler exchange")
            summary, lines = stragglers.exchange()
            record |= summary
            if rank == 0:
                step_times.extend(lines)
                if "straggler_warning" in summary:
                    print(f"WARNING: {summary['straggler_warning']}", file=sys.stderr, flush=True)
        record |= meter.measure(record, dt, batch.wait_s)
        metrics.append(record)
        profiler.after_step(step + 1)
        if rank == 0 and ((step + 1) % cfg.log_every == 0 or step == start or step + 1 == cfg.steps or not result.applied):
            print(_step_line(record, cfg.steps), flush=True)
        saving = (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps
        if saving:
            with timer.phase("checkpoint"):
                prefix = save(step + 1)
            # The step is its training and its save (the checkpoint's own copy of the record lacks the save).
            record[phase_key("checkpoint")] = timer.seconds["checkpoint"]
            record["step_time_s"] = dt + timer.seconds["checkpoint"]
        meter.log(record)
        if on_record is not None and rank == 0:
            on_record(record)
        if saving:
            meter.upload()  # rank 0: the event files, with this step's final record
    profiler.finish(cfg.steps)
    _check_lease(lease)
    if rank == 0 and metrics:
        _publish(store, run, metrics, step_times, health.events)
    meter.close()
    if not prefix:
        raise ConfigError(f"train.steps={cfg.steps} leaves nothing to train")

    layouts = extend_layouts(history, start + 1, cfg.steps, layout)
    applied = [m for m in metrics if "skipped" not in m]  # a skipped step's loss may be NaN
    last = applied[-10:] or [{"loss": float("nan"), "tokens_per_s": 0.0}]
    # Throughput is that of the layout that trained the last steps (this call's only if it trained them).
    final = [m for m in metrics if m["step"] >= layouts[-1].first_step]
    summary = {
        "final_train_loss": sum(m["loss"] for m in last) / len(last),
        "first_train_loss": applied[0]["loss"] if applied else float("nan"),
        "tokens_per_second": sorted(m["tokens_per_s"] for m in final)[len(final) // 2] if final else 0.0,
        "parameters": float(n_params),
        "tokens_trained": float(cfg.steps * tokens_per_step),
        "world_size": float(layouts[-1].layout.world_size),
    }
    if health.skipped:
        summary["skipped_steps"] = float(health.skipped)
    mfus = sorted(m["mfu"] for m in final if m.get("mfu") is not None)
    if mfus:  # unknown GPUs have no peak to compare with
        summary["mfu"] = mfus[len(mfus) // 2]
    return CheckpointRef(
        store=store.uri,
        run=run,
        prefix=prefix,
        step=cfg.steps,
        dataset=dataset,
        base_model=base_model,
        summary=summary,
        layouts=layouts,
    )


def _publish(store, run: str, metrics: list[dict], step_times: list[dict], events: list[dict]) -> None:
    """The run's current metrics, per-rank step times and health events (rank 0)."""
    store.put_bytes(metrics_key(run), _jsonl(metrics))
    store.put_bytes(step_times_key(run), _jsonl(step_times))
    store.put_bytes(health_key(run), _jsonl(events))
