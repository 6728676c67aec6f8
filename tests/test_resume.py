"""Exact resume: real two-rank training SIGKILLed mid-run, resumed, and resharded on resume."""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

import pytest
import torch

from data_prep.manifest import load_manifest
from storage import open_store
from tests.helpers import checkpoint_state, fresh_copy, kill_group, losses, start_training, tiny_model
from training.checkpointing import checkpoint
from training.config import ParallelConfig, TrainConfig
from training.launch import launch
from training.train import run_id, train

MODEL = tiny_model()
# Checkpoints at 3, 6 and 8, all kept; a seed of its own, so no other test shares the run id.
STEPS = TrainConfig(
    steps=8, micro_batch_size=2, global_batch_size=8, warmup_steps=2, lr=3e-3, checkpoint_every=3, keep_checkpoints=3, seed=4321
)
TP2 = ParallelConfig(tensor_parallel=2)


@pytest.fixture(scope="module")
def reference(tiny_dataset, tmp_path_factory):
    """The uninterrupted run at TP=2."""
    return launch(train, 2, fresh_copy(tiny_dataset, tmp_path_factory.mktemp("reference")), MODEL, TP2, STEPS)


@pytest.mark.slow
def test_sigkill_mid_training_then_resume_ends_bitwise_identical(tiny_dataset, reference, tmp_path):
    dataset = fresh_copy(tiny_dataset, tmp_path / "store")
    store = open_store(dataset.store)
    run = f"runs/{run_id(dataset, MODEL, STEPS)}"
    assert run == reference.run
    job = start_training(tmp_path, 2, dataset, MODEL, TP2, STEPS)
    try:
        deadline = time.monotonic() + 240
        while not checkpoint.committed_steps(store, run) and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert checkpoint.committed_steps(store, run), (tmp_path / "train.log").read_text()[-3000:]
    finally:
        kill_group(job)
    killed_at = checkpoint.committed_steps(store, run)
    assert STEPS.steps not in killed_at, "the job finished before the kill: nothing was interrupted"

    resumed = launch(train, 2, dataset, MODEL, TP2, STEPS)
    assert resumed.prefix == reference.prefix
    mine = checkpoint_state(dataset.store, resumed.prefix, tmp_path)
    theirs = checkpoint_state(reference.store, reference.prefix, tmp_path)
    assert mine["meta"]["loader"] == theirs["meta"]["loader"]
    assert mine["meta"]["optimizer_step"] == theirs["meta"]["optimizer_step"] == STEPS.steps
    assert mine["tensors"].keys() == theirs["tensors"].keys()
    assert any(k.startswith("optimizer.state.exp_avg_sq.") for k in mine["tensors"])
    diff = max((mine["tensors"][k] - theirs["tensors"][k]).abs().max().item() for k in mine["tensors"])
    print(f"killed after committed steps {killed_at}; max abs diff of weights and moments: {diff}")
    for key, tensor in mine["tensors"].items():
        assert torch.equal(tensor, theirs["tensors"][key]), key
    assert losses(resumed) == losses(reference)  # the metrics up to the checkpoint came back with it


def checkpoint_only(reference, step: int, root: Path):
    """A store holding the dataset and the reference run as if it had stopped after ``step``."""
    dataset = fresh_copy(reference.dataset, root)
    shutil.copytree(Path(reference.store) / reference.run, root / reference.run)
    store = open_store(dataset.store)
    for later in checkpoint.committed_steps(store, reference.run):
        if later > step:
            store.delete_prefix(checkpoint.checkpoint_prefix(reference.run, later))
    return dataset


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2], ids=["tp1", "tp1-dp2"])
def test_tensor_parallel_checkpoint_resumes_resharded(reference, tmp_path, nproc):
    saved = checkpoint_state(reference.store, checkpoint.checkpoint_prefix(reference.run, 3), tmp_path)
    # The moments are stored whole (not per rank), shaped like their parameters: they reshard too.
    for key, tensor in saved["tensors"].items():
        if key.startswith("optimizer.state.exp_avg."):
            assert tensor.shape == saved["tensors"][key.removeprefix("optimizer.state.exp_avg.")].shape
    layout = {"world_size": 2, "tensor_parallel": 2, "pipeline_parallel": 1, "distributed_optimizer": False, "fsdp": False}
    assert saved["meta"]["layout"] == layout

    dataset = checkpoint_only(reference, 3, tmp_path / "store")
    resumed = launch(train, nproc, dataset, MODEL, ParallelConfig(tensor_parallel=1), STEPS)
    # Steps 4-8 continue the TP=2 curve: same weights, moments, step count and data order.
    assert losses(resumed)[3:] == pytest.approx(losses(reference)[3:], abs=1e-5)
    assert open_store(dataset.store).get_json(f"{resumed.prefix}/meta.json")["layout"]["world_size"] == nproc


@pytest.fixture(scope="module")
def blend(tiny_dataset, tmp_path_factory):
    """A mixture of two tiny datasets (3 : 1) sharing one tokenizer, blended in a store of its own."""
    from data_prep.blend_dataset import Part, commit_blend
    from data_prep.prepare import prepare_dataset
    from tests.helpers import tiny_data, tiny_tokenizer

    first = fresh_copy(tiny_dataset, tmp_path_factory.mktemp("blend"))
    store = open_store(first.store)
    second = prepare_dataset(tiny_data(max_documents=24), tiny_tokenizer(), store, tokenizer_key=f"{first.prefix}/tokenizer.json")
    return commit_blend(store, [Part("a", first, 3.0, 4.0), Part("b", second, 1.0, 4.0)])


@pytest.mark.slow
def test_a_mixture_killed_after_a_checkpoint_resumes_at_another_data_parallel_size_on_the_same_batches(blend, tmp_path):
    """The blend's order is a function of the global position: a run stopped after step 3 (its store as a kill
    leaves it) and resumed at DP=2 trains steps 4-8 on the TP=2 run's global batches, and records the same
    samples of each component."""
    reference = launch(train, 2, blend, MODEL, TP2, STEPS)
    root = tmp_path / "store"
    shutil.copytree(Path(blend.store) / "datasets", root / "datasets")
    shutil.copytree(Path(blend.store) / reference.run, root / reference.run)
    store = open_store(str(root))
    for later in checkpoint.committed_steps(store, reference.run):
        if later > 3:
            store.delete_prefix(checkpoint.checkpoint_prefix(reference.run, later))
    resumed = launch(train, 2, dataclasses.replace(blend, store=str(root)), MODEL, ParallelConfig(tensor_parallel=1), STEPS)
    assert store.get_json(f"{resumed.prefix}/meta.json")["layout"]["world_size"] == 2  # data-parallel 2 now
    assert losses(resumed)[3:] == pytest.approx(losses(reference)[3:], abs=1e-5)
    theirs = open_store(reference.store).get_json(f"{reference.prefix}/meta.json")["loader"]
    mine = store.get_json(f"{resumed.prefix}/meta.json")["loader"]
    assert mine == theirs and theirs["format"] == "blend-v1"
    samples = theirs["component_samples"]
    assert sum(samples.values()) == STEPS.steps * STEPS.global_batch_size and samples == {"a": 48, "b": 16}
    assert resumed.summary["tokens_trained.a"] == 48 * load_manifest(open_store(blend.store), blend)["seq_len"]
