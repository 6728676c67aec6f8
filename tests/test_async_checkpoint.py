"""Asynchronous checkpoints (``training.checkpointing.saving``), in a world of one rank: the checkpoint is
the state at the snapshot, whatever the step loop does to the live tensors while it completes; nothing is
committed before the upload ends, and a failure there commits nothing and surfaces at the next wait; the
manager never lets two saves overlap and waits for the last one."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from common.contracts import checkpoint_prefix, committed_steps
from storage import open_store
from storage.local import LocalStore
from tests.helpers import tiny_model
from training.checkpointing import checkpoint, saving
from training.checkpointing.manager import CheckpointManager
from training.config import ParallelConfig, TrainConfig
from training.data import StreamingLoader
from training.distributed import init_distributed, shutdown_distributed
from training.model.step import build_step
from training.observe.timing import StepTimer
from training.observe.watchdog import Progress

MODEL = tiny_model()
TP1 = ParallelConfig(tensor_parallel=1)
CFG = TrainConfig(steps=2, micro_batch_size=2, global_batch_size=4, warmup_steps=1, checkpoint_every=1, seed=4242)
RUN = "runs/async-checkpoint-test"


@pytest.fixture
def trainer():
    """A tiny model and its AdamW, with moments, in a world of one (torn down after the test)."""
    init_distributed(TP1, CFG.seed, standalone=True)
    try:
        step = build_step(MODEL, TP1, CFG, 384, 32)
        checkpoint._init_adam_state(step.optimizer)
        for p in checkpoint._optimizer_params(step.optimizer):  # moments unlike their initial zeros
            step.optimizer.state[p]["exp_avg"].normal_()
        yield step
    finally:
        shutdown_distributed()


@pytest.fixture
def gate(monkeypatch):
    """Uploads wait until the test sets the event (or fail with ``gate.error`` set)."""
    opened = threading.Event()
    opened.error = None  # type: ignore[attr-defined]
    upload = LocalStore.upload_dir

    def gated(self, local_dir, prefix, **kwargs):
        if not opened.wait(timeout=60):
            raise TimeoutError("the test never opened the upload gate")
        if opened.error is not None:  # type: ignore[attr-defined]
            raise opened.error  # type: ignore[attr-defined]
        return upload(self, local_dir, prefix, **kwargs)

    monkeypatch.setattr(LocalStore, "upload_dir", gated)
    return opened


def state_of(step) -> dict[str, torch.Tensor]:
    """Every parameter and AdamW moment, copied."""
    out = {f"param.{name}": p.detach().clone() for name, p in step.model.named_parameters()}
    for i, p in enumerate(checkpoint._optimizer_params(step.optimizer)):
        for key in ("exp_avg", "exp_avg_sq"):
            out[f"{key}.{i}"] = step.optimizer.state[p][key].clone()
    return out


def test_the_checkpoint_is_the_state_at_the_snapshot_and_counts_only_once_uploaded(trainer, gate, tmp_path: Path):
    store = open_store(str(tmp_path / "store"))
    before = state_of(trainer)
    pending = saving.start_save(store, RUN, 1, trainer.model, trainer.optimizer, {"step": 1}, keep=2, background=True)
    prefix = checkpoint_prefix(RUN, 1)
    # The step loop goes on: the optimizer updates the live tensors in place while the save completes.
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(1.0)
        for p in checkpoint._optimizer_params(trainer.optimizer):
            trainer.optimizer.state[p]["exp_avg"].mul_(-3.0)
    assert not pending.done() and not store.is_committed(prefix)  # the upload is held at the gate
    assert store.list(prefix) == []  # and nothing of it is in the store yet
    gate.set()
    assert pending.wait() == prefix and store.is_committed(prefix)
    assert committed_steps(store, RUN) == [1]

    # Load it into the mutated model: every tensor is back to its value at the snapshot, exactly.
    checkpoint.load(store, prefix, trainer.model, trainer.optimizer, {"world_size": 1})
    after = state_of(trainer)
    assert after.keys() == before.keys()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert not changed, f"the checkpoint holds the live tensors' later values for {changed[:5]}"


def test_a_save_failing_in_the_background_commits_nothing_and_raises_at_the_wait(trainer, gate, tmp_path: Path):
    store = open_store(str(tmp_path / "store"))
    pending = saving.start_save(store, RUN, 1, trainer.model, trainer.optimizer, {"step": 1}, keep=2, background=True)
    gate.error = OSError("No space left on device")  # type: ignore[attr-defined]
    gate.set()
    with pytest.raises(OSError, match="No space left on device") as raised:  # its own type: a full store stays one
        pending.wait()
    assert raised.value.__notes__ == [f"raised in the background save of the checkpoint of step 1 ({checkpoint_prefix(RUN, 1)})"]
    assert committed_steps(store, RUN) == [] and not store.is_committed(checkpoint_prefix(RUN, 1))


def test_the_manager_never_overlaps_two_saves_and_waits_for_the_last(trainer, gate, tiny_dataset, tmp_path: Path, monkeypatch):
    store = open_store(tiny_dataset.store)
    loader, _ = StreamingLoader.for_split(tiny_dataset, "train", CFG.global_batch_size, CFG.seed)
    manager = CheckpointManager(store, RUN + "-manager", trainer, loader, {}, TP1, CFG, Progress())
    run = manager.run
    seen: list[tuple[str, list[int]]] = []  # each save's snapshot starts: which steps were committed then
    monkeypatch.setattr(saving, "mark_stage", lambda name: seen.append((name, committed_steps(store, run))))
    timer = StepTimer(torch.device("cpu"))
    try:
        timer.start(1)
        assert manager.maybe_save(1, dict, timer)  # returns with step 1 completing in the background
        assert manager.pending is not None and not store.is_committed(checkpoint_prefix(run, 1))
        threading.Timer(0.5, gate.set).start()  # the upload of step 1 ends while step 2's save waits for it
        timer.start(2)
        assert manager.maybe_save(2, dict, timer)
        assert timer.seconds["checkpoint"] >= 0.3  # the step loop's stall: the wait for the previous save
        layouts = manager.finish()  # waits for step 2's save
        assert committed_steps(store, run) == [1, 2] and manager.prefix == checkpoint_prefix(run, 2)
        assert layouts[-1].last_step == 2
    finally:
        gate.set()
        loader.close()
    snapshots = [steps for name, steps in seen if name == "checkpoint"]
    assert snapshots == [[], [1]], f"a save's snapshot began while the previous one was uncommitted: {seen}"
