"""Real multi-process training (gloo, two ranks) of a tiny megatron-core GPT.

The layout tests train the same model on the same global batches under every parallel layout and
compare with the TP=2 run three things a scale bug moves: the loss curve, the per-step gradient
norm (before clipping) and the final weights (each checkpoint loaded whole at TP=1). Losses alone
are not enough: AdamW with global-norm clipping hides a uniform gradient-scale error (with every
step clipped, a data-parallel sum instead of a mean moved the 8-step curve by 9.5e-7 and the
weights by 2.6e-6, while the gradient norm doubled). Each run also proves its layout from what its
ranks built (``train_recording_layout``): the layout recorded in the run's summary is made from
the settings and stays right when a setting is silently ignored. Layouts also recompute
activations (selective, full) and overlap megatron's collectives with compute, which must not move
anything either. Every layout but the single process trains with document masking (``train.document_masking``:
its block-diagonal mask, restarted positions and masked loss through TP, SP, PP, DP, FSDP, recompute and
compiled layers) against a masked TP=2 run; the single process, unmasked, against the plain TP=2 run.
"""

import dataclasses
import math
import shutil
from pathlib import Path

import pytest

from common.contracts import Layout, LayoutSpan
from common.errors import ConfigError
from evaluation.config import EvalConfig
from evaluation.evaluate import evaluate
from evaluation.tensorboard_log import event_file
from storage import open_store
from tests.helpers import (
    distinct_corpus,
    final_weights,
    fresh_copy,
    layout_facts,
    losses,
    records,
    tiny_data,
    tiny_model,
    tiny_tokenizer,
    train_recording_layout,
)
from training.checkpointing import checkpoint, snapshot
from training.config import ParallelConfig, TrainConfig
from training.launch import launch
from training.model.gpt import build_gpt
from training.train import train

# Qwen3-shaped: a norm on every query and key head (a replicated weight each TP rank holds part of the gradient
# of, summed over TP) and a head size of its own, so every layout checks them too.
MODEL = tiny_model(qk_norm=True, head_dim=32)
# val_every=4: the held-out loss at steps 4 and 8 (training.validator), compared across layouts too.
STEPS = TrainConfig(steps=8, micro_batch_size=4, global_batch_size=8, warmup_steps=2, lr=3e-3, checkpoint_every=4, val_every=4)


@pytest.fixture(scope="module")
def tp2_facts(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tp2-facts")


@pytest.fixture(scope="module")
def tp2_run(tiny_dataset, tp2_facts):
    return launch(train_recording_layout, 2, str(tp2_facts), tiny_dataset, MODEL, ParallelConfig(tensor_parallel=2), STEPS)


@pytest.fixture(scope="module")
def tp2_weights(tp2_run):
    return final_weights(tp2_run, MODEL)


MASKED = dataclasses.replace(STEPS, document_masking=True, checkpoint_every=STEPS.steps)


@pytest.fixture(scope="module")
def short_docs_dataset(tmp_path_factory):
    """Documents of about 30 tokens: two rows in three hold a boundary (the tiny dataset's long documents,
    53 rows in 23,988), so that document masking changes what trains. Prepared in 0.3 s."""
    from data_prep.prepare import prepare_dataset

    root = tmp_path_factory.mktemp("short-docs")
    corpus = distinct_corpus(root / "corpus", n=300, words_per_doc=24)
    return prepare_dataset(tiny_data(sources=[str(corpus)], max_documents=0), tiny_tokenizer(), open_store(str(root / "store")))


@pytest.fixture(scope="module")
def masked_tp2_run(short_docs_dataset, tmp_path_factory):
    """The TP=2 run with document masking: the masked layouts' reference."""
    dataset = fresh_copy(short_docs_dataset, tmp_path_factory.mktemp("masked-tp2"))
    return launch(train, 2, dataset, MODEL, ParallelConfig(tensor_parallel=2), MASKED)


@pytest.fixture(scope="module")
def masked_tp2_weights(masked_tp2_run):
    return final_weights(masked_tp2_run, MODEL)


def adam_moments(ref) -> dict:
    """The AdamW moments of a run's final checkpoint, each whole (as a TP=1 process reads them): ``{key: tensor}``."""
    tensors = snapshot.checkpoint_tensors(open_store(ref.store), ref.prefix)
    return {key: t for key, t in tensors.items() if key.startswith(checkpoint.OPTIMIZER_PREFIX)}


@pytest.mark.slow
def test_tensor_parallel_training_learns_and_commits(tp2_run, tp2_facts):
    curve = losses(tp2_run)
    assert len(curve) == STEPS.steps
    assert curve[-1] < curve[0] - 0.3, curve
    store = open_store(tp2_run.store)
    assert checkpoint.committed_steps(store, tp2_run.run) == [4, 8]
    assert tp2_run.prefix == checkpoint.checkpoint_prefix(tp2_run.run, 8)
    assert tp2_run.summary["world_size"] == 2
    facts = layout_facts(tp2_facts)
    assert [layout_summary(f) for f in facts] == [built(tp=2)] * 2 and [f["recompute"] for f in facts] == [None] * 2
    assert all(math.isfinite(n) and n > 0 for n in grad_norms(tp2_run))
    held_out = heldout_losses(tp2_run)
    assert list(held_out) == [4, 8] and all(math.isfinite(v) and v > 0 for v in held_out.values()), held_out
    assert held_out[8] < held_out[4], held_out  # the model learned something that carries to unseen rows
    assert all(r["val_time_s"] > 0 for r in records(tp2_run) if "heldout_loss" in r)


@pytest.mark.slow
def test_document_masking_changes_what_the_short_documents_train(short_docs_dataset, masked_tp2_run, tmp_path):
    # The masked layouts' comparison means something only if masking changes the training (layout noise: 1e-6).
    unmasked = dataclasses.replace(MASKED, document_masking=False)
    plain_run = launch(train, 1, fresh_copy(short_docs_dataset, tmp_path), MODEL, ParallelConfig(tensor_parallel=1), unmasked)
    masked, plain = losses(masked_tp2_run), losses(plain_run)
    assert len(masked) == len(plain) == STEPS.steps
    assert max(abs(a - b) for a, b in zip(masked, plain, strict=True)) > 1e-3, (masked, plain)
    assert masked[-1] < masked[0] - 0.3, masked  # and it learns


# Tolerances. Float noise between layouts measured (8 steps): losses <= 9.5e-7, gradient norms
# <= 8.6e-7 relative, weights <= 1.2e-5. A doubled data-parallel reduction moved the gradient norms
# by 100%; the sequence-parallel norm weights' reduction done twice moved them by 0.77% (its losses
# by 6.2e-6 and weights by 1.4e-5, inside those tolerances): the gradient norm is the sharp check.
LOSS_TOL = 1e-5
GRAD_NORM_RTOL = 1e-4
WEIGHT_TOL = 1e-4
MOMENT_RTOL = 1e-3  # of each AdamW moment tensor's largest element: FSDP's differ from TP=2's by 4.7e-5
SEQ = 32  # the tiny dataset's seq_len


def built(step: str = "LocalStep", tp: int = 1, pp: int = 1, dp: int = 1, sp: bool = False) -> dict:
    """What every rank of a layout builds: its step, megatron's group sizes, whether its linear layers
    run sequence-parallel, and the sequence length its transformer layers see (split under SP)."""
    return dict(
        step=step,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        data_parallel=dp,
        linears_sequence_parallel=[sp],
        sequence=SEQ // tp if sp else SEQ,
    )


# name: (processes, settings, activation recompute, what each rank must build). Recomputed activations
# are the same numbers: three layouts recompute (FSDP with full recompute, whose backward gathers each layer's
# weights for the recomputed forward), which tests recompute for the price of no extra launch.
LAYOUTS = {
    "single-process": (1, ParallelConfig(tensor_parallel=1), "none", built()),
    "data-parallel-2": (2, ParallelConfig(tensor_parallel=1), "none", built(dp=2)),
    "tensor+sequence-parallel-2+selective-recompute": (
        2,
        ParallelConfig(tensor_parallel=2, sequence_parallel=True),
        "selective",
        built(tp=2, sp=True),
    ),
    # Both of megatron's overlaps: each bucket's reduction during backward, the weights' all-gather during the
    # next forward. tests/test_pipeline_training.py runs this layout without them.
    "data-parallel-2+distributed-optimizer+overlap+compiled": (
        2,
        ParallelConfig(tensor_parallel=1, distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True),
        "none",
        built("MegatronStep", dp=2),
    ),
    "pipeline-parallel-2+full-recompute+compiled": (
        2,
        ParallelConfig(tensor_parallel=1, pipeline_parallel=2),
        "full",
        built("MegatronStep", pp=2),
    ),
    "fully-sharded-data-parallel-2+full-recompute": (
        2,
        ParallelConfig(tensor_parallel=1, fsdp=True),
        "full",
        built("FsdpStep", dp=2),
    ),
}


# Layouts whose transformer layers and loss head run compiled (train.compile: on), each named ``+compiled``; the
# others and the TP=2 reference run eager. Both MegatronStep: the distributed optimizer, the step of the gpt-350m
# and gpt-1b presets on CUDA, here with both overlaps (megatron's forward pre-hooks run inside the compiled layers),
# and the pipeline schedule with full recompute. LocalStep is not compiled here: it runs no compiled code of its
# own (the layers and the loss head are the model's, its clipping and AdamW stay eager), and a third compiled
# launch costs 5 s more (tests/test_metrics.py traces it compiled, through bench_train). Every rank of every launch
# shares one Inductor cache (TORCHINDUCTOR_CACHE_DIR, by default /tmp/torchinductor_<user>: ranks inherit the
# environment) and both layouts run one micro-batch shape, so the second loads the graphs the first generated.
# With a cold cache the distributed optimizer's layout takes 26 s and the pipeline's 18 s, warm 9 s and 12 s (eager,
# 2 s each): what a warm cache leaves is Dynamo's tracing, the layer's AOTAutograd (megatron's autograd.Function
# keeps it out of the cache), the graphs' loading, and the pipeline's two stages compiling one after the other.
COMPILED = {name for name in LAYOUTS if name.endswith("+compiled")}
UNMASKED = {"single-process"}
"""Layouts trained without document masking, against the plain TP=2 run; the others are masked."""

# Layouts run at micro-batch 2 instead of 4 (the mean of the micro-batches' mean losses is the same number):
# FSDP's unsharded accumulation before the last micro-batch's reduce-scatter and megatron's overlapped reduction,
# which must wait for the last micro-batch, need two micro-batches per rank at DP=2; the compiled pipeline takes
# the same shape (four micro-batches through its 1F1B schedule) to load the graphs the distributed optimizer's
# layout compiled.
ACCUMULATING = {"data-parallel-2+distributed-optimizer+overlap+compiled", "fully-sharded-data-parallel-2+full-recompute"}
SMALL_MICRO_BATCH = ACCUMULATING | COMPILED


def expected_step(name: str) -> str:
    """The step implementation the layout ``name`` must build."""
    return LAYOUTS[name][3]["step"]


def layout_summary(facts: dict) -> dict:
    """What a rank built, less what differs by rank alone (its number, its pipeline position)."""
    keys = ("step", "tensor_parallel", "pipeline_parallel", "data_parallel", "linears_sequence_parallel")
    return {k: facts[k] for k in keys} | {"sequence": facts["layer_input_sequence"]}


def grad_norms(ref) -> list[float]:
    return [r["grad_norm"] for r in records(ref)]


def heldout_losses(ref) -> dict[int, float]:
    return {r["step"]: r["heldout_loss"] for r in records(ref) if "heldout_loss" in r}


def check_built_layout(name: str, facts: list[dict]) -> None:
    """The ranks built the layout ``name`` asked for, from facts of the built model and optimizer."""
    nproc, _, _, expected = LAYOUTS[name]
    assert [f["rank"] for f in facts] == list(range(nproc)), facts
    assert [layout_summary(f) for f in facts] == [expected] * nproc, facts
    if name.startswith("pipeline-parallel-2"):  # two stages, one transformer layer each, the ends where they belong
        assert [(f["pipeline_rank"], f["layers"], f["embedding"], f["output_layer"]) for f in facts] == [
            (0, [1], True, False),
            (1, [2], False, True),
        ], facts
    else:
        assert all(f["layers"] == [1, 2] and f["embedding"] and f["output_layer"] for f in facts), facts
    optimizer_share = [f["optimizer_state_elements"] / f["parameters"] for f in facts]
    parameter_share = [f["local_parameter_elements"] / f["parameters"] for f in facts]
    if "distributed-optimizer" in name:  # Adam's state sharded: each rank holds half of it
        assert all(set(f["optimizer"]) == {"DistributedOptimizer"} for f in facts), facts
        assert sum(f["optimizer_state_elements"] for f in facts) == facts[0]["parameters"], facts
        assert all(0.4 < share < 0.6 for share in optimizer_share), optimizer_share
    else:
        assert all("DistributedOptimizer" not in f["optimizer"] for f in facts), facts
    if name.startswith("fully-sharded"):  # weights and Adam's state sharded: each rank holds half of each
        assert all(f["dtensor_parameters"] == [True] and f["optimizer"] == ["AdamW"] for f in facts), facts
        assert parameter_share == optimizer_share == [0.5] * nproc, (parameter_share, optimizer_share)
        assert sum(f["local_parameter_elements"] for f in facts) == facts[0]["parameters"], facts
    else:
        assert all(f["dtensor_parameters"] == [False] for f in facts) and parameter_share == [1.0] * nproc, facts
        if "distributed-optimizer" not in name:
            assert optimizer_share == [1.0] * nproc, optimizer_share
    overlap = {"grad_reduce": True, "param_gather": True, "no_sync_func": True} if "+overlap" in name else None
    if expected["step"] == "MegatronStep":
        overlap = overlap or {"grad_reduce": False, "param_gather": False, "no_sync_func": False}
    assert [f["ddp_overlap"] for f in facts] == [overlap] * nproc, facts


@pytest.mark.slow
@pytest.mark.long("a compiled layout traces and compiles in every rank: 45-61 s under make test")
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_parallel_layouts_match_the_tensor_parallel_run(request, tmp_path, name):
    """Same initial weights and global batches whatever the layout: only float noise may differ
    in the losses, the gradient norms and the final weights (documents masked or not, as the reference)."""
    masked = name not in UNMASKED
    data = request.getfixturevalue("short_docs_dataset" if masked else "tiny_dataset")
    tp2_run = request.getfixturevalue("masked_tp2_run" if masked else "tp2_run")
    tp2_weights = request.getfixturevalue("masked_tp2_weights" if masked else "tp2_weights")
    nproc, parallel, recompute, _ = LAYOUTS[name]
    facts_dir = tmp_path / "facts"
    facts_dir.mkdir()
    dataset = fresh_copy(data, tmp_path / "store")
    # One save: the final weights. The single-process run measures no held-out loss: its weights matching the TP=2
    # run's (which does, at steps 4 and 8) show that the measurement changes nothing of the training. Neither does the
    # overlap layout, whose final checkpoint is then saved right after an optimizer step, before any forward has
    # all-gathered the updated weights (the held-out loss's would): the save must gather them itself.
    validate = not (name == "single-process" or "+overlap" in name)
    compiled = name in COMPILED
    steps = dataclasses.replace(
        STEPS,
        checkpoint_every=STEPS.steps,
        recompute=recompute,
        val_every=STEPS.val_every if validate else 0,
        compile="on" if compiled else "off",
        micro_batch_size=2 if name in SMALL_MICRO_BATCH else STEPS.micro_batch_size,
        document_masking=masked,
    )
    ref = launch(train_recording_layout, nproc, str(facts_dir), dataset, MODEL, parallel, steps)
    recorded = Layout(nproc, parallel.tensor_parallel, parallel.pipeline_parallel, parallel.distributed_optimizer, parallel.fsdp)
    assert ref.layouts == [LayoutSpan(1, STEPS.steps, recorded)]
    facts = layout_facts(facts_dir)
    check_built_layout(name, facts)
    assert [f["recompute"] for f in facts] == [None if recompute == "none" else recompute] * nproc, facts
    assert [f["compiled_layers"] for f in facts] == [[compiled] * len(f["layers"]) for f in facts], facts
    assert (ref.summary["compile_s"] > 0) == compiled, ref.summary  # compiled graphs ran (and took time), or none
    weights = final_weights(ref, MODEL)
    assert weights.keys() == tp2_weights.keys()
    diffs = {
        "loss": max(abs(a - b) for a, b in zip(losses(ref), losses(tp2_run), strict=True)),
        "grad_norm_rel": max(abs(a - b) / b for a, b in zip(grad_norms(ref), grad_norms(tp2_run), strict=True)),
        "weights": max((weights[k] - tp2_weights[k]).abs().max().item() for k in weights),
    }
    if expected_step(name) == "FsdpStep":  # its AdamW moments reshard too: the TP=2 run's, as whole tensors
        moments, tp2_moments = adam_moments(ref), adam_moments(tp2_run)
        kinds = {key.removeprefix(f"{checkpoint.OPTIMIZER_PREFIX}.").split(".")[0] for key in moments}
        assert moments.keys() == tp2_moments.keys() and kinds == {"exp_avg", "exp_avg_sq"}, sorted(moments)
        diffs["moments_rel"] = max(
            ((moments[k] - tp2_moments[k]).abs().max() / tp2_moments[k].abs().max()).item() for k in moments
        )
    if validate:  # forward only, through LocalStep.evaluate or MegatronStep.evaluate: the same held-out loss
        assert heldout_losses(ref).keys() == heldout_losses(tp2_run).keys(), heldout_losses(ref)
        ours, theirs = heldout_losses(ref).values(), heldout_losses(tp2_run).values()
        diffs["heldout_loss"] = max(abs(a - b) for a, b in zip(ours, theirs, strict=True))
    else:
        assert heldout_losses(ref) == {}
    print(f"{name}: {diffs}, compile_s {ref.summary['compile_s']}")
    assert diffs["loss"] <= LOSS_TOL, diffs
    assert diffs["grad_norm_rel"] <= GRAD_NORM_RTOL, diffs
    assert diffs["weights"] <= WEIGHT_TOL, diffs
    assert diffs.get("heldout_loss", 0.0) <= LOSS_TOL, diffs
    assert diffs.get("moments_rel", 0.0) <= MOMENT_RTOL, diffs


@pytest.mark.slow
def test_a_tensor_parallel_checkpoint_resumes_under_fsdp(tiny_dataset, tp2_run, tp2_weights, tmp_path):
    """The TP=2 run's step-4 checkpoint resumed with FSDP at DP=2: its weights and AdamW moments reshard into the
    FSDP shards, so steps 5-8 are the TP=2 run's up to float noise (resumed with a fresh optimizer instead, the
    losses moved by 3.5e-2 and the gradient norms by 13%). The other direction, an FSDP checkpoint read at TP=1
    with its moments the TP=2 run's, is the layout test's."""
    dataset = fresh_copy(tiny_dataset, tmp_path / "store")
    store = open_store(dataset.store)
    shutil.copytree(Path(tp2_run.store) / tp2_run.run, Path(dataset.store) / tp2_run.run)
    store.delete_prefix(checkpoint.checkpoint_prefix(tp2_run.run, 8))  # as if it stopped after step 4
    ref = launch(train, 2, dataset, MODEL, ParallelConfig(tensor_parallel=1, fsdp=True), STEPS)
    assert checkpoint.committed_steps(store, ref.run) == [4, 8]
    assert ref.layouts == [LayoutSpan(1, 4, Layout(2, tensor_parallel=2)), LayoutSpan(5, 8, Layout(2, fsdp=True))]
    assert records(ref)[:4] == records(tp2_run)[:4]  # resumed: steps 1-4 are the first run's own records
    weights = final_weights(ref, MODEL)
    diffs = {
        "loss": max(abs(a - b) for a, b in zip(losses(ref), losses(tp2_run), strict=True)),
        "grad_norm_rel": max(abs(a - b) / b for a, b in zip(grad_norms(ref), grad_norms(tp2_run), strict=True)),
        "weights": max((weights[k] - tp2_weights[k]).abs().max().item() for k in weights),
        "heldout_loss": abs(heldout_losses(ref)[8] - heldout_losses(tp2_run)[8]),
    }
    print(f"TP=2 step 4 resumed under FSDP: {diffs}")
    assert diffs["loss"] <= LOSS_TOL and diffs["heldout_loss"] <= LOSS_TOL, diffs
    assert diffs["grad_norm_rel"] <= GRAD_NORM_RTOL and diffs["weights"] <= WEIGHT_TOL, diffs


def test_recompute_setting_is_checked():
    with pytest.raises(ConfigError, match="train.recompute must be one of"):
        build_gpt(MODEL, 128, 16, tensor_parallel=1, recompute="everything")


@pytest.mark.slow
def test_rerun_with_same_inputs_resumes_from_latest_checkpoint(tiny_dataset, tp2_run, tmp_path):
    dataset = fresh_copy(tiny_dataset, tmp_path / "store")
    store = open_store(dataset.store)
    shutil.copytree(Path(tp2_run.store) / tp2_run.run, Path(dataset.store) / tp2_run.run)
    store.delete_prefix(checkpoint.checkpoint_prefix(tp2_run.run, 8))  # as if it crashed after step 4
    ref = launch(train, 2, dataset, MODEL, ParallelConfig(tensor_parallel=2), STEPS)
    assert checkpoint.committed_steps(store, ref.run) == [4, 8]
    assert losses(ref) == pytest.approx(losses(tp2_run), abs=1e-5)


@pytest.mark.slow
@pytest.mark.long("the TP=2 checkpoint resharded and evaluated at TP=1: 25-46 s under make test")
def test_evaluation_loads_tp2_checkpoint_at_tp1(tp2_run):
    # No lm-eval (~6.5 s an evaluation, nothing here reads it): tests/test_lm_eval*.py and the workflow's end-to-end run.
    report = evaluate(tp2_run, MODEL, EvalConfig(max_batches=2, batch_size=4, sample_tokens=4, prompt="def ", lm_eval_tasks=[]))
    assert math.isfinite(report.val_loss) and report.val_loss < math.log(384)
    assert report.perplexity == pytest.approx(math.exp(report.val_loss))
    assert report.sample.startswith("def ") and report.tokens_evaluated == 2 * 4 * 32
    stats = open_store(tp2_run.store).get_json(f"{tp2_run.dataset.prefix}/manifest.json")["stats"]
    assert report.bits_per_byte == pytest.approx(report.val_loss / math.log(2) * stats["val_doc_tokens"] / stats["val_bytes"])
    assert 0 < report.bits_per_byte < 8
    again = evaluate(tp2_run, MODEL, EvalConfig(max_batches=1, batch_size=4, sample_tokens=4, prompt="def ", lm_eval_tasks=[]))
    assert report.sampled.startswith("def ") and again.sampled == report.sampled  # seeded
    store = open_store(tp2_run.store)
    assert store.is_committed(report.outputs) and again.outputs != report.outputs
    results = store.get_json(f"{report.outputs}/results.json")
    assert results["val_loss"] == report.val_loss and results["step"] == tp2_run.step and results["sample"] == report.sample
    exported = {key.rsplit("/", 1)[1] for key in store.list(f"{report.outputs}/hf")}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= exported
    # Each evaluation's val/* and the run's hparams in its TensorBoard (read back in tests/test_tensorboard_eval.py).
    assert all(store.exists(event_file(tp2_run.run, e.outputs.rsplit("/", 1)[1])) for e in (report, again))


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
