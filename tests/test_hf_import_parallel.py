"""An imported Hugging Face checkpoint loads at other layouts than the one it was written at (TP=1, PP=1)
and gives ``transformers``' logits: every family at TP=2 (the vocabulary-parallel output gathered), and
Qwen3 at PP=2 (the embedding on one stage, the output layer on the other).

Qwen3 is the pipeline case because it is the family furthest from the plain block: a norm on every query
and key head (``q_layernorm``/``k_layernorm``, which must follow their layer to the second stage) and a head
size of its own (32, where hidden / heads is 16), so its fused query/key/value rows are not hidden-sized.

The ranks are launched once per layout and compute every family's logits in that one launch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hf_interop.convert import hf_logits
from hf_interop.tiny import FAMILIES, sample_texts
from registry.hf_import import import_checkpoint
from storage import open_store
from training.launch import launch

ROWS, SEQ = 2, 64
TOLERANCE = 1e-4  # fp32 on both sides
PIPELINE_FAMILIES = ("qwen3", "smollm")
"""Qwen3 (q/k norms travel with their layers, a head size of its own) and SmolLM (tied: the last stage's output
matrix comes from the embedding's checkpoint key)."""


def _ids(folder: Path) -> torch.Tensor:
    """``ROWS`` rows of ``SEQ`` ids: the starts of Python standard-library sources, encoded with the folder's
    own tokenizer (special tokens as its post-processor adds them)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    rows = [tokenizer.encode(text).ids[:SEQ] for text in sample_texts(ROWS)]
    assert all(len(row) == SEQ for row in rows)
    return torch.tensor(rows, dtype=torch.long)


def _vocab(folder: Path) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size()


def rank_logits(store_uri: str, jobs: list[tuple[str, int, torch.Tensor]], tensor_parallel: int, pipeline_parallel: int):
    """In each rank: for every job (registry entry, tokenizer size, ids), the model built at the layout, its
    weights loaded from the entry's checkpoint as training's ``init_from`` loads them, and its logits over the
    whole padded vocabulary ``[rows, seq, padded vocab]``; rank 0's are returned."""
    from common.contracts import ENTRY_CHECKPOINT
    from registry.card import read_card
    from training.checkpointing.checkpoint import load_weights
    from training.config import ModelConfig, ParallelConfig
    from training.distributed import init_distributed, shutdown_distributed
    from training.model.gpt import build_gpt

    init_distributed(ParallelConfig(tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel), seed=0)
    store = open_store(store_uri)
    out = []
    try:
        for prefix, vocab, ids in jobs:
            config = ModelConfig(**{**read_card(store, prefix).config["model"], "kernels": "torch"})
            model = build_gpt(config, vocab, ids.shape[1], tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel)
            load_weights(store, f"{prefix}/{ENTRY_CHECKPOINT}", model, committed_at=prefix)
            out.append(_full_logits(model.eval(), ids))
    finally:
        shutdown_distributed()
    return out


def _full_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """One forward-only pass through megatron's pipeline schedule (the activations sent from stage to stage);
    the last stage's vocabulary-parallel logits gathered over TP and broadcast to every stage."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    with torch.no_grad():
        collected = get_forward_backward_func()(
            forward_step_func=_forward_step,
            data_iterator=iter([ids]),
            model=[model],
            num_microbatches=1,
            seq_length=ids.shape[1],
            micro_batch_size=ids.shape[0],
            forward_only=True,
            collect_non_loss_data=True,  # the last stage's output as it is, not a loss
        )
    tp_group, pp_group = ps.get_tensor_model_parallel_group(), ps.get_pipeline_model_parallel_group()
    shape = torch.zeros(3, dtype=torch.long)
    if ps.is_pipeline_last_stage():
        (local,) = collected  # [rows, seq, padded vocab / TP]
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size(tp_group))]
        dist.all_gather(parts, local.contiguous(), group=tp_group)
        logits = torch.cat(parts, dim=-1)
        shape = torch.tensor(logits.shape)
    if dist.get_world_size(pp_group) == 1:
        return logits
    last = ps.get_pipeline_model_parallel_last_rank()
    dist.broadcast(shape, src=last, group=pp_group)
    if not ps.is_pipeline_last_stage():
        logits = torch.empty(*shape.tolist())
    dist.broadcast(logits, src=last, group=pp_group)
    return logits


def _forward_step(data, model):
    ids = next(data)
    positions = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    return model(ids, positions, None), _as_is


def _as_is(output: torch.Tensor, non_loss_data: bool = False) -> torch.Tensor:
    return output


@pytest.fixture(scope="module")
def imported(tiny_hf_models, tmp_path_factory) -> tuple[str, dict[str, tuple[str, int, torch.Tensor]]]:
    """Every tiny family imported into one local store: the store's URI and, by family, (entry prefix,
    tokenizer size, ids)."""
    store = open_store(str(tmp_path_factory.mktemp("hf-import-parallel") / "store"))
    entries = {}
    for family in FAMILIES:
        folder = tiny_hf_models[family]
        ref, _ = import_checkpoint(store, folder, f"tiny-{family}")
        entries[family] = (ref.prefix, _vocab(folder), _ids(folder))
    return store.uri, entries


def _check(family: str, folder: Path, ids: torch.Tensor, ours: torch.Tensor) -> float:
    """The largest difference between our logits, cut to the checkpoint's vocabulary, and transformers'; the
    columns of megatron's padding rows (zero on import, whatever the layout pads to) must be 0."""
    theirs = hf_logits(folder, ids)
    assert theirs.std().item() > 0.5, f"{family}: transformers' logits are too flat for the comparison to mean anything"
    vocab = theirs.shape[-1]
    assert ours.shape[:2] == theirs.shape[:2] and ours.shape[-1] >= vocab, (family, ours.shape, theirs.shape)
    assert not ours[..., vocab:].any(), f"{family}: the padding rows of the vocabulary give logits other than 0"
    return (ours[..., :vocab] - theirs).abs().max().item()


@pytest.mark.slow
def test_every_family_at_tensor_parallel_2_gives_transformers_logits(imported, tiny_hf_models):
    store_uri, entries = imported
    jobs = [entries[f] for f in FAMILIES]
    logits = launch(rank_logits, 2, store_uri, jobs, 2, 1)
    differences = {f: _check(f, tiny_hf_models[f], entries[f][2], ours) for f, ours in zip(FAMILIES, logits, strict=True)}
    print(f"TP=2 max abs differences: {differences}")
    over = {f: d for f, d in differences.items() if d > TOLERANCE}
    assert not over, f"TP=2 logits differ from transformers' by more than {TOLERANCE}: {over}"


@pytest.mark.slow
def test_pipeline_parallel_2_gives_transformers_logits(imported, tiny_hf_models):
    store_uri, entries = imported
    all_logits = launch(rank_logits, 2, store_uri, [entries[f] for f in PIPELINE_FAMILIES], 1, 2)
    for family, logits in zip(PIPELINE_FAMILIES, all_logits, strict=True):
        difference = _check(family, tiny_hf_models[family], entries[family][2], logits)
        print(f"PP=2 {family} max abs difference: {difference}")
        assert difference <= TOLERANCE, f"PP=2 {family} logits differ from transformers' by {difference}"
