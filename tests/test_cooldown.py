"""A WSD run cooled down from a stable-phase checkpoint, and extended (issue 48): real training, one rank.

One module-scoped story (each training costs seconds): the uninterrupted reference decays after step 9 of
12; a longer WSD run keeps its step-9 checkpoint (``keep_every``) while training on; a cooldown from it
must give the reference's weights and optimizer moments bit for bit, and name where it came from; the long
run cannot be extended once decaying, and extends without touching its earlier steps while still stable.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from common.contracts import checkpoint_prefix, committed_steps
from storage import open_store
from tests.helpers import checkpoint_state, fresh_copy, losses, records, tiny_model
from training.config import ParallelConfig, TrainConfig
from training.launch import launch
from training.train import train

pytestmark = pytest.mark.slow

MODEL = tiny_model()
ONE = ParallelConfig(tensor_parallel=1)
# The reference: 12 steps, the last 3 decaying (after step 9). A seed of its own: no other test's run id.
REFERENCE = TrainConfig(
    steps=12,
    micro_batch_size=4,
    global_batch_size=8,
    warmup_steps=2,
    lr=3e-3,
    min_lr=3e-4,
    lr_schedule="wsd",
    decay_fraction=0.25,
    checkpoint_every=100,
    seed=4848,
    val_every=0,
    async_checkpoints=False,
)
# The same run planned longer: stable through step 12, so step 9 is a stable-phase checkpoint it keeps.
LONG = dataclasses.replace(REFERENCE, steps=16, checkpoint_every=9, keep_checkpoints=1, keep_every=9)
COOLDOWN = dataclasses.replace(REFERENCE, steps=0)


@pytest.fixture(scope="module")
def story(tiny_dataset, tmp_path_factory):
    root = tmp_path_factory.mktemp("cooldown")
    reference = launch(train, 1, fresh_copy(tiny_dataset, root / "reference"), MODEL, ONE, REFERENCE)
    dataset = fresh_copy(tiny_dataset, root / "long")
    long = launch(train, 1, dataset, MODEL, ONE, LONG)
    kept = committed_steps(open_store(dataset.store), long.run)
    cooldown_cfg = dataclasses.replace(COOLDOWN, cooldown_from=f"{long.run.removeprefix('runs/')}@9", cooldown_steps=3)
    cooled = launch(train, 1, dataset, MODEL, ONE, cooldown_cfg)
    return {"root": root, "reference": reference, "long": long, "kept": kept, "cooled": cooled, "dataset": dataset}


def test_a_cooldown_from_a_stable_checkpoint_trains_what_the_uninterrupted_run_did(story, tmp_path):
    reference, long, cooled = story["reference"], story["long"], story["cooled"]
    assert story["kept"] == [9, 16]  # keep_checkpoints=1 would have deleted step 9: keep_every=9 kept it
    assert cooled.run not in (long.run, reference.run)  # a run of its own
    assert cooled.step == 12 and cooled.cooled_from == checkpoint_prefix(long.run, 9)
    mine = checkpoint_state(cooled.store, cooled.prefix, tmp_path)
    theirs = checkpoint_state(reference.store, reference.prefix, tmp_path)
    assert mine["meta"]["loader"] == theirs["meta"]["loader"]
    assert mine["tensors"].keys() == theirs["tensors"].keys()
    assert any(k.startswith("optimizer.state.exp_avg_sq.") for k in mine["tensors"])
    for key, tensor in mine["tensors"].items():
        assert torch.equal(tensor, theirs["tensors"][key]), key
    # Its log: the long run's steps 1-9 (restored with the checkpoint), then its own decaying ones.
    assert losses(cooled) == losses(reference)
    lrs = [r["lr"] for r in records(cooled)]
    assert lrs == [r["lr"] for r in records(reference)]
    assert lrs[8] == REFERENCE.lr and lrs[-1] == pytest.approx(REFERENCE.min_lr) and lrs[9] > lrs[10] > lrs[11]
    assert cooled.summary["steps_trained"] == 12


def test_a_wsd_run_is_extended_only_while_stable_and_keeps_its_trained_steps(story):
    dataset, long = story["dataset"], story["long"]
    store = open_store(dataset.store)
    longer = dataclasses.replace(LONG, steps=20)
    # Its latest checkpoint (16) trained steps 13-16 decaying: a longer plan would have trained them at lr.
    with pytest.raises(Exception, match="cannot continue them") as refused:
        launch(train, 1, dataset, MODEL, ONE, longer)
    assert "cooldown_from" in str(refused.value)
    assert committed_steps(store, long.run) == [9, 16]  # nothing written

    # As if it had stopped after step 9 (stable under both plans): it continues to step 20.
    nine = checkpoint_prefix(long.run, 9)
    before = {key: store.get_bytes(key) for key in store.list(nine)}
    metrics_before = records(long)[:9]
    store.delete_prefix(checkpoint_prefix(long.run, 16))
    extended = launch(train, 1, dataset, MODEL, ONE, longer)
    assert extended.run == long.run and extended.step == 20
    assert {key: store.get_bytes(key) for key in store.list(nine)} == before  # step 9's bytes untouched
    after = records(extended)
    assert [r["step"] for r in after] == list(range(1, 21)) and after[:9] == metrics_before
    assert [r["lr"] for r in after[9:15]] == [LONG.lr] * 6  # stable until the new decay (5 steps), after step 15
    assert after[15]["lr"] < LONG.lr
    assert after[-1]["lr"] == pytest.approx(LONG.min_lr)
