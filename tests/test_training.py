"""Real multi-process training (gloo, two ranks) of a tiny megatron-core GPT."""

import dataclasses
import math
import shutil
from pathlib import Path

import pytest

from common.errors import ConfigError
from storage import open_store
from tests.helpers import fresh_copy, losses, tiny_model
from training import checkpoint
from training.config import EvalConfig, ParallelConfig, TrainConfig
from training.evaluate import evaluate
from training.launch import launch
from training.model import build_gpt
from training.train import train

MODEL = tiny_model()
STEPS = TrainConfig(steps=8, micro_batch_size=4, global_batch_size=8, warmup_steps=2, lr=3e-3, checkpoint_every=4)


@pytest.fixture(scope="module")
def tp2_run(tiny_dataset):
    return launch(train, 2, tiny_dataset, MODEL, ParallelConfig(tensor_parallel=2), STEPS)


def test_tensor_parallel_training_learns_and_commits(tp2_run):
    curve = losses(tp2_run)
    assert len(curve) == STEPS.steps
    assert curve[-1] < curve[0] - 0.3, curve
    store = open_store(tp2_run.store)
    assert checkpoint.committed_steps(store, tp2_run.run) == [4, 8]
    assert tp2_run.prefix == checkpoint.checkpoint_prefix(tp2_run.run, 8)
    assert tp2_run.summary["world_size"] == 2


@pytest.mark.parametrize(
    "nproc,parallel",
    [
        (1, ParallelConfig(tensor_parallel=1)),
        (2, ParallelConfig(tensor_parallel=1)),
        (2, ParallelConfig(tensor_parallel=2, sequence_parallel=True)),
    ],
    ids=["single-process", "data-parallel-2", "tensor+sequence-parallel-2"],
)
def test_parallel_layouts_match_the_tensor_parallel_curve(tiny_dataset, tp2_run, tmp_path, nproc, parallel):
    # Same initial weights and global batches whatever the layout: only float noise differs.
    ref = launch(train, nproc, fresh_copy(tiny_dataset, tmp_path / "store"), MODEL, parallel, STEPS)
    assert losses(ref) == pytest.approx(losses(tp2_run), abs=1e-5)


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_activation_recompute_keeps_the_curve(tiny_dataset, tp2_run, tmp_path, recompute):
    # Recomputed activations are the same numbers: the curve must not move.
    steps = dataclasses.replace(STEPS, recompute=recompute)
    ref = launch(train, 2, fresh_copy(tiny_dataset, tmp_path / "store"), MODEL, ParallelConfig(tensor_parallel=2), steps)
    assert losses(ref) == pytest.approx(losses(tp2_run), abs=1e-5)


def test_recompute_setting_is_checked():
    with pytest.raises(ConfigError, match="train.recompute must be one of"):
        build_gpt(MODEL, 128, 16, tensor_parallel=1, recompute="everything")


def test_rerun_with_same_inputs_resumes_from_latest_checkpoint(tiny_dataset, tp2_run, tmp_path):
    dataset = fresh_copy(tiny_dataset, tmp_path / "store")
    store = open_store(dataset.store)
    shutil.copytree(Path(tp2_run.store) / tp2_run.run, Path(dataset.store) / tp2_run.run)
    store.delete_prefix(checkpoint.checkpoint_prefix(tp2_run.run, 8))  # as if it crashed after step 4
    ref = launch(train, 2, dataset, MODEL, ParallelConfig(tensor_parallel=2), STEPS)
    assert checkpoint.committed_steps(store, ref.run) == [4, 8]
    assert losses(ref) == pytest.approx(losses(tp2_run), abs=1e-5)


def test_evaluation_loads_tp2_checkpoint_at_tp1(tp2_run):
    report = evaluate(tp2_run, MODEL, EvalConfig(max_batches=2, batch_size=4, sample_tokens=4, prompt="def "))
    assert math.isfinite(report.val_loss) and report.val_loss < math.log(384)
    assert report.perplexity == pytest.approx(math.exp(report.val_loss))
    assert report.sample.startswith("def ") and report.tokens_evaluated == 2 * 4 * 32
    stats = open_store(tp2_run.store).get_json(f"{tp2_run.dataset.prefix}/manifest.json")["stats"]
    assert report.bits_per_byte == pytest.approx(report.val_loss / math.log(2) * stats["val_doc_tokens"] / stats["val_bytes"])
    assert 0 < report.bits_per_byte < 8
    again = evaluate(tp2_run, MODEL, EvalConfig(max_batches=1, batch_size=4, sample_tokens=4, prompt="def "))
    assert report.sampled.startswith("def ") and again.sampled == report.sampled  # seeded
    store = open_store(tp2_run.store)
    assert store.is_committed(report.outputs) and again.outputs != report.outputs
    results = store.get_json(f"{report.outputs}/results.json")
    assert results["val_loss"] == report.val_loss and results["step"] == tp2_run.step and results["sample"] == report.sample
    exported = {key.rsplit("/", 1)[1] for key in store.list(f"{report.outputs}/hf")}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= exported


def test_a_twin_evaluating_after_its_twin_registered_gets_the_same_version(tp2_run, tmp_path):
    """Two identical executions: the one that waited for the run's lease evaluates once the other has
    registered this checkpoint and moved the gate alias to it. Its evaluation must be the other's (same
    outputs, same baseline), or it registers a second version of the same model."""
    from common.contracts import alias_key, checkpoint_prefix, model_prefix
    from registry.registry import register

    shutil.copytree(tp2_run.store, tmp_path / "store")
    store_uri = str(tmp_path / "store")
    final = dataclasses.replace(tp2_run, store=store_uri, dataset=dataclasses.replace(tp2_run.dataset, store=store_uri))
    earlier = dataclasses.replace(final, step=4, prefix=checkpoint_prefix(final.run, 4))
    store = open_store(store_uri)
    cfg = EvalConfig(max_batches=1, batch_size=4, sample_tokens=2, prompt="def ", lm_eval_tasks=[])
    config = {"model": dataclasses.asdict(MODEL), "evaluation": dataclasses.asdict(cfg)}  # comparable models
    gate = {"config": config, "gate_alias": "production", "gate_tolerance": 100.0}  # every candidate passes

    old = register(store, "gpt", evaluate(earlier, MODEL, cfg), **gate)
    first = evaluate(final, MODEL, cfg, model_prefix("gpt", old.version))
    registered = register(store, "gpt", first, **gate)
    holder = model_prefix("gpt", registered.version)
    assert store.get_json(alias_key("gpt", "production"))["version"] == registered.version

    twin = evaluate(final, MODEL, cfg, holder)  # the gate holder is this very checkpoint
    assert twin.baseline == first.baseline == model_prefix("gpt", old.version) and twin.outputs == first.outputs
    assert twin.baseline_bits_per_byte == first.baseline_bits_per_byte
    assert register(store, "gpt", twin, **gate) == registered

    other = evaluate(earlier, MODEL, cfg, holder)  # another checkpoint compares with the holder as ever
    assert other.baseline == holder and other.outputs != first.outputs
