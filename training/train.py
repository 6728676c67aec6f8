"""The training loop. ``train`` runs on every rank; all ranks return the same record.

``Trainer`` is the loop: setup → resume → steps → finish, on one screen. What happens around a step
belongs to components built from their own config, each owning its cadence and state: the checkpoint
manager (``training.checkpointing.manager``: resume, start from a base model, save, the run's lease),
the run log (``training.runlog``: metrics, step times, health events) and the step callbacks
(``training.callbacks``: loss health, validation loss, stragglers, metrics, profiler, step lines, the
MLflow sender, the goodput ledger: ``runs.ledger``).

Launch it under torchrun, a Flyte ``Elastic`` task, or ``training.launch.spawn``: it
reads RANK/WORLD_SIZE/MASTER_* from the environment. The run id is a hash of the dataset
version, the configs and the training code, identical on every rank without any
communication; a restarted task with the same inputs therefore finds its own
checkpoints and resumes from the latest committed one.

Two identical executions at once share that run prefix too: rank 0 holds the run's lease
(``runs.lease``) while the job trains, and an identical job waits for it before it looks
for checkpoints, then resumes from what the first committed (its final checkpoint: nothing to
train, the same CheckpointRef).
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict

import torch
import torch.distributed as dist

from common.codeversion import code_version
from common.contracts import CheckpointRef, DatasetRef, run_prefix
from common.hashing import config_hash
from common.stages import mark_stage
from data_prep.blend import overread_components
from storage import open_store
from training.blend import BlendedLoader, open_loader
from training.callbacks import Callbacks, OnRecord
from training.checkpointing.manager import CheckpointManager
from training.config import ModelConfig, ParallelConfig, Precision, TrainConfig
from training.cooldown import pinned_checkpoint, plan_steps
from training.data import Reading, StreamingLoader
from training.distributed import init_distributed, shutdown_distributed
from training.model.fp8 import refuse_without_hardware
from training.model.step import StepResult, build_step, micro_batches
from training.observe.diagnostics import write_diagnostics
from training.observe.goodput import GoodputCallback
from training.observe.health import BadLossError, LossHealth
from training.observe.metrics import StepMetrics, non_embedding_params
from training.observe.profiling import WindowProfiler
from training.observe.step_lines import StepLines, startup_line
from training.observe.stragglers import StragglerMonitor
from training.observe.timing import StepTimer, compile_seconds, phase_key
from training.observe.watchdog import Progress, Watchdog, explain
from training.runlog import RunLog
from training.schedule import lr_at
from training.termination import exit_on_sigterm
from training.validator import Validator


def run_id(dataset: DatasetRef, model: ModelConfig, train_cfg: TrainConfig, base_model: str = "") -> str:
    return config_hash(dataset.version, model, train_cfg.identity(), base_model, code_version("training.train"))


def train(
    dataset: DatasetRef,
    model_cfg: ModelConfig,
    parallel: ParallelConfig,
    cfg: TrainConfig,
    base_model: str = "",
    on_record: Callable[[dict], None] | None = None,
    name: str = "",
) -> CheckpointRef:
    """Train on every rank; catches and labels a rank's error so that it is never lost.

    ``base_model`` is a registry entry's key prefix (``models/<name>/<version>``) whose
    weights start the run (continued pretraining); empty means a fresh initialisation.
    ``on_record`` (rank 0 only) hears each step's metrics record once it is final (after the
    step's checkpoint save, if any); it must return at once (e.g. queue it: ``tracking.sender``).
    ``name`` is the run's name for people (``common.run_names``), recorded in its checkpoints' meta: not part
    of the run's identity (an identical run under another name is the same run: its latest save's name shows).
    """
    rank = int(os.environ.get("RANK", "0"))
    progress = Progress()
    # Stopped by the launcher (a peer failed) or by Kubernetes: unwind, so no store write leaves its temporary file.
    with exit_on_sigterm():
        watchdog = Watchdog(progress, rank).start()
        try:
            with ExitStack() as cleanup:  # the run's lease, released however training ends
                trainer = Trainer(dataset, model_cfg, parallel, cfg, base_model, progress, name)
                return trainer.run(cleanup, on_record)
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


class Trainer:
    """One training call on this rank: setup → resume → steps → finish."""

    def __init__(
        self,
        dataset: DatasetRef,
        model_cfg: ModelConfig,
        parallel: ParallelConfig,
        cfg: TrainConfig,
        base_model: str,
        progress: Progress,
        name: str = "",
    ) -> None:
        """Setup: the process groups, the loader, the model and optimizer, the run's store, log and checkpoints."""
        from megatron.core import parallel_state as ps

        self.parallel = parallel
        self.model_cfg = model_cfg
        self.base_model = base_model
        self.progress = progress
        self.dataset = dataset
        if cfg.precision == Precision.FP8:  # before anything starts: the launch could not see this node's GPUs
            refuse_without_hardware(f"rank {os.environ.get('RANK', '0')} on {socket.gethostname()}")
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        init_distributed(parallel, cfg.seed)
        self.rank0 = dist.get_rank() == 0
        self.dp_size, self.dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
        micro_batches(cfg, self.dp_size)  # fail on an impossible batch split before loading anything
        reading = Reading.of_job()  # collective: one rank per model-parallel group reads, once per node
        self.loader, manifest = open_loader(  # a mixture's blends its components' loaders
            dataset, "train", cfg.global_batch_size, cfg.seed, window_shards=cfg.shuffle_window_shards, reading=reading
        )
        self.seq_len = manifest["seq_len"]
        # The steps in effect: a token budget converted, a cooldown pinned to its checkpoint (the workflow's
        # plan_training did both before anything ran; a direct call gets the same).
        self.store = open_store(dataset.store)
        self.cfg = cfg = plan_steps(self.store, cfg, self.seq_len)
        self.run_prefix = run_prefix(run_id(dataset, model_cfg, cfg, base_model))
        self.val_loader = None  # the validation split's, for the Validator (none when the split is empty or it is off)
        if cfg.val_every > 0 and manifest["splits"].get("val", {}).get("shards"):
            self.val_loader, _ = StreamingLoader.for_split(
                dataset, "val", cfg.global_batch_size, cfg.seed, window_shards=cfg.shuffle_window_shards, reading=reading
            )
        self.tokens_per_step = cfg.global_batch_size * self.seq_len
        self.step = build_step(model_cfg, parallel, cfg, manifest["vocab_size"], self.seq_len, manifest.get("eod_id"))
        progress.world_size = dist.get_world_size()
        progress.diagnose = functools.partial(write_diagnostics, self.store, self.run_prefix, dist.get_rank())
        self.log = RunLog(self.store, self.run_prefix, self.rank0)
        meta = {"model": asdict(model_cfg), "train": asdict(cfg), "dataset": dataset.version, "name": name}
        if isinstance(self.loader, BlendedLoader):  # what `runs show` and `runs compare` say of a mixture
            meta |= {"mixture": {m["name"]: m["weight"] for m in manifest["mixture"]}, "seq_len": self.seq_len}
            if self.rank0:
                for line in overread_components(manifest["mixture"], self.loader.samples_per_component(cfg.steps)):
                    print(f"WARNING: {line}", file=sys.stderr, flush=True)
        self.checkpoints = CheckpointManager(self.store, self.run_prefix, self.step, self.loader, meta, parallel, cfg, progress)
        self.goodput = GoodputCallback.for_rank(self.store, self.run_prefix, self.rank0)  # this attempt's goodput ledger

    def run(self, cleanup: ExitStack, on_record: Callable[[dict], None] | None = None) -> CheckpointRef:
        """Resume → steps ``start + 1``..``train.steps`` → finish: the last checkpoint. ``cleanup`` releases
        the run's lease however training ends; ``on_record`` (rank 0) hears each final step record."""
        cleanup.callback(self.goodput.end)  # the attempt's end, however it ends (after the lease's release)
        self.goodput.restore_begins()  # the lease's wait is start-up, the resume after it checkpoint_restore
        # Rank 0's lease: when, and its sequence (the attempts' order), told as soon as it is taken.
        start = self.checkpoints.start(cleanup, self.base_model, self.log, on_leased=self.goodput.leased)
        self.goodput.restored()
        self.goodput.resumed(start)
        self._observe(on_record)
        for step in range(start + 1, self.cfg.steps + 1):
            self._train_step(step)
        return self._finish()

    def _train_step(self, step: int) -> None:
        if self.rank0:
            mark_stage("train-step")  # where a soak's kill lands (common.stages; nothing unless it is on)
        self.progress.enter(f"step {step}", self.parallel.stall_timeout_s)
        self.callbacks.before_step(step)
        self.timer.start(step)
        with self.timer.phase("data"):
            lr = lr_at(step - 1, self.cfg)
            batch = self.loader.batch(step - 1, self.dp_rank, self.dp_size)
        result = self._forward_backward(step, batch.tokens, lr)
        seconds = self.timer.elapsed()
        record = {"step": step, "loss": result.loss, "lr": lr, "grad_norm": result.grad_norm}
        record |= {"tokens_per_s": self.tokens_per_step / seconds, "step_time_s": seconds, "data_wait_s": batch.wait_s}
        record |= self.timer.breakdown(seconds)
        self.callbacks.after_step(record)
        saved = self.checkpoints.maybe_save(step, self.callbacks.state_dict, self.timer)
        if saved:  # the step is its training and its save (the checkpoint's own copy of the record lacks the save)
            record[phase_key("checkpoint")] = self.timer.seconds["checkpoint"]
            record["step_time_s"] = seconds + self.timer.seconds["checkpoint"]
        self.callbacks.on_record(record)
        if saved == "store":
            self.callbacks.on_save(step)
        elif saved == "node":  # nothing published; the ledger learns the steps a restart here would not train again
            self.goodput.on_save(step)

    def _forward_backward(self, step: int, tokens: torch.Tensor, lr: float) -> StepResult:
        accept = functools.partial(self.health.judge, step, origin=functools.partial(self.loader.origin, step - 1))
        try:
            return self.step.step(tokens, lr, self.timer, accept)
        except BadLossError:
            # Every rank refused the same loss. The event (the batch's shards and rows) is stored, and the save
            # still completing in the background committed (the steps before this one count), before any rank
            # exits: the launcher stops the others as soon as one fails. Only here, where every rank fails
            # alike: after another error a peer may be gone, and the save's collectives would wait for it.
            self.log.publish()
            self.checkpoints.wait()
            dist.barrier()
            raise

    def _observe(self, on_record: Callable[[dict], None] | None) -> None:
        """The step callbacks, in the order in which they add to a step's record; the run log keeps it."""
        cfg, param, rank = self.cfg, next(p for p in self.step.model.parameters() if p.requires_grad), dist.get_rank()
        world = dist.get_world_size()
        self.timer = StepTimer(param.device, on_phase=self.progress.at)
        self.health = LossHealth.restore(cfg, self.log.metrics)
        self.log.events = self.health.events
        meter = StepMetrics.for_training(self.model_cfg, cfg, self.seq_len, world, param, self.store, self.run_prefix, self.rank0)
        parameters = self.step.num_parameters()  # a collective: every rank calls it
        if self.rank0:  # the seconds before the first step say what they are building
            n, device = non_embedding_params(self.model_cfg), f"{param.device.type}, {str(param.dtype).removeprefix('torch.')}"
            print(startup_line(parameters, n, meter.flops_per_token, self.tokens_per_step, world, device), flush=True)
        callbacks = [
            self.health,
            Validator(cfg, self.step, self.val_loader, self.dp_rank, self.dp_size),
            StragglerMonitor(cfg, param.device, self.progress, self.log.add_step_times, self.rank0),
            meter,
            self.log,
            WindowProfiler(cfg, self.store, self.run_prefix, rank, param.device),
            *([StepLines(cfg.steps, cfg.log_every)] if self.rank0 else []),
            *([OnRecord(on_record)] if on_record is not None and self.rank0 else []),
            self.goodput,  # last: a step ends once every other callback heard it, a save once the run log published
        ]
        self.callbacks = Callbacks(callbacks)

    def _component_tokens(self) -> dict[str, float]:
        """A mixture's tokens trained on each component (``tokens_trained.<name>``); {} for one dataset."""
        if not isinstance(self.loader, BlendedLoader):
            return {}
        samples = self.loader.samples_per_component(self.cfg.steps)
        return {f"tokens_trained.{name}": float(n * self.seq_len) for name, n in samples.items()}

    def _finish(self) -> CheckpointRef:
        """After the last step: the traces and event files, the run's files, and what the run made."""
        self.callbacks.close()
        layouts = self.checkpoints.finish()
        if self.log.metrics:
            self.log.publish()
        sizes = {
            "parameters": float(self.step.num_parameters()),
            "steps_trained": float(self.cfg.steps),
            "tokens_trained": float(self.cfg.steps * self.tokens_per_step),
            **self._component_tokens(),
            "world_size": float(layouts[-1].layout.world_size),
            # Apart from the step times: the first step of a compiled process includes it.
            "compile_s": compile_seconds(),
        }
        return CheckpointRef(
            store=self.store.uri,
            run=self.run_prefix,
            prefix=self.checkpoints.prefix,
            step=self.cfg.steps,
            dataset=self.dataset,
            base_model=self.base_model,
            summary=self.log.summary(layouts, self.health.skipped, sizes),
            layouts=layouts,
            cooled_from=pinned_checkpoint(self.cfg),
        )
