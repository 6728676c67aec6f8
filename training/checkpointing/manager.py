"""The run's checkpoints as the training loop sees them: resume, start from a base model, save on cadence.

The manager holds the run's lease (``runs.lease``): rank 0 takes it before looking for
checkpoints (an identical execution may still commit one), and every save first checks that it was
not taken over, so that nothing is written by a job that lost the run. It keeps the history of the
layouts that trained the run's steps and writes it, with the configs and the loader's position, into
each checkpoint's meta.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

import torch.distributed as dist

from common.contracts import (
    ENTRY_CHECKPOINT,
    Layout,
    LayoutSpan,
    ModelCard,
    card_key,
    checkpoint_prefix,
    describe_layouts,
    extend_layouts,
)
from common.errors import ConfigError
from runs.lease import LeaseLost, RunLease
from storage import Store
from training.checkpointing import checkpoint, local_copy
from training.checkpointing.saving import PendingSave, start_save
from training.config import ModelConfig, ParallelConfig, TrainConfig, cooldown_point
from training.cooldown import trained_config
from training.data import LoaderStateError, StreamingLoader
from training.distributed import checkpoint_group
from training.observe.timing import StepTimer
from training.observe.watchdog import Progress
from training.runlog import RunLog
from training.schedule import decay_start, schedule_change


class CheckpointManager:
    """One run's checkpoints on every rank (every method is collective)."""

    def __init__(
        self,
        store: Store,
        run: str,
        step,
        loader: StreamingLoader,
        meta: dict,
        parallel: ParallelConfig,
        cfg: TrainConfig,
        progress: Progress,
    ) -> None:
        """``step`` is the TrainStep (its model and optimizer); ``meta`` what every checkpoint's meta.json
        says of the run besides its steps (configs, dataset version)."""
        self.store, self.run, self.step, self.loader, self.meta = store, run, step, loader, meta
        self.cfg, self.progress, self.timeout_s = cfg, progress, parallel.checkpoint_timeout_s
        self.rank = dist.get_rank()
        tp, pp = parallel.tensor_parallel, parallel.pipeline_parallel
        self.layout = Layout(dist.get_world_size(), tp, pp, parallel.distributed_optimizer, parallel.fsdp)
        self.history: list[LayoutSpan] = []
        """The layouts that trained steps 1..start."""
        self.resumed_step = 0
        self.prefix = ""
        """The key prefix of the run's latest committed checkpoint ('' while there is none)."""
        self.lease: RunLease | None = None
        self.pending: PendingSave | None = None
        """The save completing in the background (``train.async_checkpoints``), if any."""
        self.node_copy: Path | None = None
        """The folder resumed from when it was a checkpoint this node saved only (``train.local_checkpoint_every``)."""
        self.node_saves = cfg.local_checkpoint_every > 0 and cfg.keep_local_checkpoints > 0 and local_copy.single_node()
        """Whether checkpoints are also saved to this node only between the store's (one node: it has every rank's files)."""

    def start(
        self, cleanup: ExitStack, base_model: str, log: RunLog, on_leased: Callable[[RunLease | None], None] | None = None
    ) -> int:
        """Take the run's lease (released by ``cleanup``), then resume from the run's latest checkpoint
        with ``log`` as it kept it, or start from ``base_model`` (a registry entry's key prefix; '' for a
        fresh initialisation): the step to continue after. ``on_leased`` hears rank 0's lease (None on the
        other ranks) once it is taken."""
        self.take_lease(cleanup)  # before the resume lookup: the holder may still commit
        if on_leased is not None:  # the goodput ledger: the attempt's place in the run's order, before the resume
            on_leased(self.lease)
        start = self.resume()
        if start:
            log.restore(self.prefix, start, self.node_copy)
        elif self.cfg.cooldown_from:
            start = self.cool_down(log)
        elif base_model:
            self.init_from(base_model)
        return start

    def take_lease(self, cleanup: ExitStack) -> None:
        """Rank 0 takes the run's lease, waiting while an identical execution holds it (polling; every
        rank hears each outcome by broadcast, so no collective waits for long); released by ``cleanup``."""
        lease = RunLease(self.store, self.run) if self.rank == 0 else None
        self.progress.enter("waiting for the run's lease", 0)  # as long as the identical execution takes
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
                raise RuntimeError(f"run {self.run}: taking its lease failed on rank 0: {outcome[0]}")
            if lease is not None:
                time.sleep(lease.poll_s)
        if lease is not None:
            lease.start_refreshing()
            cleanup.callback(lease.release)
        self.lease = lease

    def check_lease(self) -> None:
        """LeaseLost on every rank if rank 0's lease was taken over (before writing)."""
        lost = [self.lease.lost if self.lease is not None else None]
        dist.broadcast_object_list(lost, src=0, group=checkpoint_group())
        if lost[0]:
            raise LeaseLost(lost[0])

    def resume(self) -> int:
        """Load the run's latest checkpoint, if any (weights, optimizer state where it can come back, RNG states,
        the loader's position): the step to continue after (0: none). The latest is the store's newest committed
        one, or a newer one this node saved only (``local_copy.newer_copy``: rank 0 judges, every rank hears)."""
        done = checkpoint.committed_steps(self.store, self.run)
        newest = done[-1] if done else 0
        found = [None]
        if self.rank == 0 and self.cfg.keep_local_checkpoints > 0:
            found = [local_copy.newer_copy(self.store.uri, self.run, newest, checkpoint.verify)]
        dist.broadcast_object_list(found, src=0, group=checkpoint_group())
        self.resumed_step, self.node_copy = found[0] or (newest, None)
        if not self.resumed_step:
            return 0
        self.prefix = checkpoint_prefix(self.run, newest) if newest else ""
        self.progress.enter(f"resume from step {self.resumed_step}", self.timeout_s)
        model, optimizer, layout = self.step.model, self.step.optimizer, asdict(self.layout)
        at = checkpoint_prefix(self.run, self.resumed_step)
        resumed = checkpoint.load(self.store, at, model, optimizer, layout, self.run, self.resumed_step, self.node_copy)
        self.loader.check_resume(resumed["loader"], self.resumed_step)
        self._check_schedule(resumed, self.run)
        self.history = layouts_of(resumed)
        if self.rank == 0:
            restored = checkpoint.restores_optimizer(resumed, optimizer, layout)
            print(resume_note(self.run, self.resumed_step, self.cfg.steps, self.history, self.layout, restored), flush=True)
        return self.resumed_step

    def cool_down(self, log: RunLog) -> int:
        """Start this run from the checkpoint ``train.cooldown_from`` names, as a resume of it would (weights,
        optimizer state, RNG, data position, the run log up to it): the step to continue after. The trainer
        pinned and checked it (``training.cooldown.plan_steps``); the schedule is checked again on its meta."""
        run_id, start = cooldown_point(self.cfg.cooldown_from)
        source = f"runs/{run_id}"
        prefix = checkpoint_prefix(source, start)
        self.progress.enter(f"cooldown from {prefix}", self.timeout_s)
        model, optimizer, layout = self.step.model, self.step.optimizer, asdict(self.layout)
        resumed = checkpoint.load(self.store, prefix, model, optimizer, layout)
        try:
            self.loader.check_resume(resumed["loader"], start)
        except LoaderStateError as e:
            raise ConfigError(
                f"train.cooldown_from={self.cfg.cooldown_from}: a cooldown continues its run's data order, on the "
                f"same dataset and batch ({e}); prepare the run's own data (dataset {resumed['dataset']})"
            ) from e
        self._check_schedule(resumed, source)
        self.history, self.resumed_step = layouts_of(resumed), start
        log.restore(prefix, start)
        if self.rank == 0:
            steps = f"steps {start + 1}-{self.cfg.steps}"
            print(f"cooling down {source} from step {start}: {steps} decay to min_lr in {self.run}", flush=True)
        return start

    def _check_schedule(self, meta: dict, run: str) -> None:
        """Refuse to continue the checkpoint of ``meta`` (of ``run``) under a schedule that would have trained its
        steps at other learning rates: a WSD run extended after its decay began, or a shortened one."""
        step, trained = meta["step"], trained_config(meta)
        changed = schedule_change(trained, self.cfg, step)
        if changed:
            raise ConfigError(
                f"run {run} trained steps 1-{step} with train.steps={trained.steps}, lr_schedule {trained.lr_schedule}; "
                f"this config's learning rate differs from step {changed}, so it cannot continue them: a WSD run can be "
                f"extended only before its decay (it began after step {decay_start(trained)}); cool down from a kept "
                f"stable-phase checkpoint instead (train.cooldown_from: {run.removeprefix('runs/')}@STEP) or change train.seed"
            )

    def init_from(self, base_model: str) -> None:
        """Initialise the weights from the registry entry under key prefix ``base_model`` (continued
        pretraining), after checking that its model config continues into this one."""
        card = ModelCard.from_dict(self.store.get_json(card_key(base_model)))
        problem = card.continuation_problem(self.meta["model"], asdict(ModelConfig()))
        if problem:
            raise ConfigError(problem)
        checkpoint.load_weights(self.store, f"{base_model}/{ENTRY_CHECKPOINT}", self.step.model, committed_at=base_model)
        if self.rank == 0:
            print(f"initialised {self.run} from {self.store.url(base_model)}", flush=True)

    def maybe_save(self, step: int, files: Callable[[], dict[str, bytes]], timer: StepTimer) -> str:
        """Save after ``step`` if it is due, with ``files()`` (the callbacks' state): to the store every
        ``train.checkpoint_every`` steps and at the last ("store"), else to this node only every
        ``train.local_checkpoint_every`` ("node"); "" when none is due. The step's checkpoint phase times what the
        step loop waits for: the previous save where it is still completing, and this one's snapshot (the whole
        save with ``train.async_checkpoints`` off). A save that failed in the background raises here, at the next step."""
        if self.pending is not None and self.pending.done():
            self.wait()
        if step % self.cfg.checkpoint_every == 0 or step == self.cfg.steps:
            kind = "store"
        elif self.node_saves and step % self.cfg.local_checkpoint_every == 0:
            kind = "node"
        else:
            return ""
        with timer.phase("checkpoint"):
            self.save(step, files(), node_only=kind == "node")
        return kind

    def wait(self) -> None:
        """Wait for the save completing in the background, if any (this rank's side): its prefix is the
        run's latest committed checkpoint (a save to this node only leaves it as it was)."""
        if self.pending is None:
            return
        self.progress.enter(f"checkpoint save at step {self.pending.step}, completing", self.timeout_s)
        self.prefix = self.pending.wait() or self.prefix
        self.pending = None

    def finish(self) -> list[LayoutSpan]:
        """After the last step: the last save committed, the lease checked; the layouts that trained the run's steps."""
        self.wait()
        self.check_lease()
        if not self.prefix:
            raise ConfigError(f"train.steps={self.cfg.steps} leaves nothing to train")
        if self.rank == 0:  # a finished run restarts no more: its copies on this node go (local_copy)
            local_copy.discard(self.store.uri, self.run)
        return self.layouts(self.cfg.steps)

    def save(self, step: int, files: dict[str, bytes], node_only: bool = False) -> None:
        """Save the checkpoint of ``step`` with ``files`` (rank 0's: the run log's copies), after the previous
        save completed (two never overlap): committed on return, or completing in the background; ``node_only``:
        kept on this node's disk only (``start_save``)."""
        self.wait()
        meta = {
            "step": step,
            "layout": asdict(self.layout),
            "layouts": [asdict(span) for span in self.layouts(step)],
            **self.meta,
            "loader": self.loader.state_dict(step),
        }
        self.progress.enter(f"checkpoint save at step {step}", self.timeout_s)
        self.progress.at(step, "checkpoint")
        self.check_lease()  # nothing written by a job that lost the run to an identical one
        self.loader.wait_idle()  # the checkpoint writer forks: not while a read is in flight
        model, optimizer = self.step.model, self.step.optimizer
        keep, background, every = self.cfg.keep_checkpoints, self.cfg.async_checkpoints, self.cfg.keep_every
        keep_local = self.cfg.keep_local_checkpoints
        self.pending = start_save(
            self.store, self.run, step, model, optimizer, meta, keep, files, background, every, keep_local, node_only
        )
        if not background:
            self.wait()

    def layouts(self, last_step: int) -> list[LayoutSpan]:
        """The layouts that trained steps 1..``last_step``: the history, then this call's."""
        return extend_layouts(self.history, self.resumed_step + 1, last_step, self.layout)


def layouts_of(meta: dict) -> list[LayoutSpan]:
    """The layouts that trained a checkpoint's steps. A checkpoint saved before meta.json kept
    the history names only the layout that saved it: it stands for all its steps."""
    if "layouts" in meta:
        return [LayoutSpan.from_dict(span) for span in meta["layouts"]]
    return [LayoutSpan(1, meta["step"], Layout(**meta["layout"]))]


def resume_note(run: str, start: int, steps: int, history: list[LayoutSpan], layout: Layout, optimizer_restored: bool) -> str:
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
