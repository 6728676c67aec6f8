"""Restarts inside the job (training/restarts.py) and the node's local copies of checkpoints
(training/checkpointing/local_copy.py): a real two-rank run that also saves to its node only between the store's
checkpoints, whose rank 1 is SIGKILLed mid-run, restarts its ranks in place, resumes from the node's newer
checkpoint without a download and ends with the weights of an uninterrupted run that saved none; a failure that
repeats at the same step is not restarted a second time; a local copy that is not the committed checkpoint, or a
node's own checkpoint whose files changed, is not used."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from common.contracts import committed_steps
from runs.ledger import read_attempts
from storage import open_store
from tests.helpers import checkpoint_state, fresh_copy, tiny_model, train_with_fault
from training.checkpointing import local_copy
from training.checkpointing.checkpoint import verify
from training.config import ParallelConfig, TrainConfig
from training.launch import launch
from training.observe.failures import Failure, JobFailed
from training.restarts import restart_refusal
from training.train import train

pytestmark = pytest.mark.slow

MODEL = tiny_model()
KILL_STEP = 7
"""Rank 1 is killed fetching step 7's batch: after the store's save at 4 and the node's at 6, from which it resumes."""
CFG = TrainConfig(
    steps=8,
    micro_batch_size=4,
    global_batch_size=8,
    warmup_steps=2,
    lr=3e-3,
    checkpoint_every=4,
    local_checkpoint_every=3,  # the node's own at 3 (superseded by the store's at 4) and 6
    seed=4141,  # a run id of its own
    async_checkpoints=False,  # each save is complete before the next step: the resume point is known
)
PARALLEL = ParallelConfig(tensor_parallel=1, collective_timeout_s=300)


def _failure(where: str, user_error: bool = False) -> Failure:
    return Failure(time=0.0, rank=1, where=where, error="ValueError: boom", user_error=user_error)


def test_a_restart_is_refused_for_a_users_error_and_for_the_same_place_twice():
    assert restart_refusal(None, None) == ""  # killed outright: nothing recorded, a restart may help
    assert restart_refusal(None, _failure("step 6 (data)")) == ""
    assert restart_refusal(_failure("step 6 (data)"), None) == ""
    assert restart_refusal(_failure("step 6 (data)"), _failure("step 9 (data)")) == ""
    assert "again" in restart_refusal(_failure("step 6 (data)"), _failure("step 6 (data)"))
    assert "to fix" in restart_refusal(_failure("step 2 (data)", user_error=True), None)


@contextmanager
def output_to(path: Path) -> Iterator[None]:
    """This process's standard output and error go to ``path``: file descriptors 1 and 2 (which the ranks inherit),
    and ``sys.stdout``/``sys.stderr`` (the launcher's own lines; pytest captures them apart)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    try:
        with open(path, "a") as text, redirect_stdout(text), redirect_stderr(text):
            yield
    finally:
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


@pytest.fixture(scope="module")
def killed_and_reference(tiny_dataset, tmp_path_factory):
    """The run whose rank 1 was killed at step 6 (its ranks restarted in place), with what its launcher and ranks
    printed, and the same run uninterrupted in a store of its own."""
    root = tmp_path_factory.mktemp("restarts")
    killed = fresh_copy(tiny_dataset, root / "killed")
    reference = fresh_copy(tiny_dataset, root / "reference")
    with output_to(root / "killed.log"):
        ref = launch(train_with_fault, 2, "kill", KILL_STEP, 1, {0}, killed, MODEL, PARALLEL, CFG, max_restarts=2)
    uninterrupted = dataclasses.replace(CFG, local_checkpoint_every=0)  # the same run id: it saves no node checkpoints
    return ref, (root / "killed.log").read_text(), launch(train, 2, reference, MODEL, PARALLEL, uninterrupted), root


def test_a_killed_rank_restarts_the_ranks_in_place_from_the_nodes_checkpoint(killed_and_reference):
    ref, log, reference, root = killed_and_reference
    assert ref.step == CFG.steps and ref.run == reference.run
    assert "restarting the ranks in place (1 of 2): rank 1 died (signal SIGKILL)" in log, log[-3000:]
    said = "resuming from this node's checkpoint of step 6 (saved here only, digests checked): nothing downloaded"
    assert said in log and "resumed runs/" in log, log[-3000:]
    store = open_store(ref.store)
    assert committed_steps(store, ref.run) == [4, 8]  # the node's checkpoints were never uploaded
    # Two attempts in the run's ledger: the killed one, which knew its productive seconds up to the node's save at 6
    # (so the restart re-trains nothing before it), and the restart from 6; every step's record once.
    attempts = read_attempts(store, ref.run)
    assert [a["resumed_step"] for a in attempts] == [0, 6], attempts
    assert {3, 4, 6} <= set(attempts[0]["productive_at_step"]), attempts[0]
    text = store.get_bytes(f"{ref.run}/metrics.jsonl", "log").decode()
    assert [json.loads(line)["step"] for line in text.splitlines()] == list(range(1, CFG.steps + 1))
    # Every weight and optimizer moment equals the uninterrupted run's, bit for bit.
    (root / "ours").mkdir(exist_ok=True)
    (root / "theirs").mkdir(exist_ok=True)
    ours = checkpoint_state(ref.store, ref.prefix, root / "ours")["tensors"]
    theirs = checkpoint_state(reference.store, reference.prefix, root / "theirs")["tensors"]
    assert ours.keys() == theirs.keys() and len(ours) > 4
    assert all(ours[k].equal(theirs[k]) for k in ours), [k for k in ours if not ours[k].equal(theirs[k])]
    # The node kept its newest checkpoint while the run trained; the finished run's copies are gone.
    assert not local_copy.run_folder(ref.store, ref.run).exists()


def test_a_failure_at_the_same_step_twice_is_not_restarted_again(tiny_dataset, tmp_path, capfd):
    dataset = fresh_copy(tiny_dataset, tmp_path)
    with pytest.raises(JobFailed, match=f"boom at step {KILL_STEP}"):
        launch(train_with_fault, 2, "raise", KILL_STEP, 1, {0, 1, 2, 3}, dataset, MODEL, PARALLEL, CFG, max_restarts=3)
    err = capfd.readouterr().err
    assert err.count("restarting the ranks in place") == 1, err[-3000:]
    assert f"not restarting the ranks: rank 1 failed first, during step {KILL_STEP}" in err
    assert "again: a restart would meet it a third time" in err


def test_a_local_copy_that_is_not_the_committed_checkpoint_is_not_used(killed_and_reference, tmp_path):
    ref = killed_and_reference[0]
    store = open_store(ref.store)
    # The folder a save uploads from, kept as the node's copy after its commit, with its committed digests.
    saved = tmp_path / "save"
    shutil.copytree(Path(ref.store) / ref.prefix, saved, ignore=shutil.ignore_patterns("_COMMITTED", "digests.json"))
    digests = store.get_json(f"{ref.prefix}/digests.json")
    local_copy.keep(ref.store, ref.run, ref.step, saved, digests["files"], digests["format"], 1)
    folder = local_copy.usable(store, ref.prefix, ref.step, ref.run, verify)
    assert folder == local_copy.copy_folder(ref.store, ref.run, ref.step) and not saved.exists()  # moved, not copied
    victim = next(p for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "digests.json")
    victim.write_bytes(victim.read_bytes() + b"!")
    assert local_copy.usable(store, ref.prefix, ref.step, ref.run, verify) is None
    assert not folder.exists()  # removed: the next resume downloads
    # The same files as a checkpoint this node saved only, newer than the store's newest: used while its files hash
    # to its own digests; the newest such copy first; one that changed is removed and the next newest is used.
    for step in (ref.step + 1, ref.step + 2):
        saved = tmp_path / f"save-{step}"
        shutil.copytree(Path(ref.store) / ref.prefix, saved, ignore=shutil.ignore_patterns("_COMMITTED", "digests.json"))
        local_copy.keep(ref.store, ref.run, step, saved, digests["files"], digests["format"], 2)
    newest = local_copy.copy_folder(ref.store, ref.run, ref.step + 2)
    assert local_copy.newer_copy(ref.store, ref.run, ref.step, verify) == (ref.step + 2, newest)
    assert local_copy.newer_copy(ref.store, ref.run, ref.step + 2, verify) is None  # not newer than the store's
    victim = next(p for p in sorted(newest.rglob("*")) if p.is_file() and p.name != "digests.json")
    victim.write_bytes(victim.read_bytes() + b"!")
    older = local_copy.copy_folder(ref.store, ref.run, ref.step + 1)
    assert local_copy.newer_copy(ref.store, ref.run, ref.step, verify) == (ref.step + 1, older)
    assert not newest.exists()
    local_copy.discard(ref.store, ref.run)
