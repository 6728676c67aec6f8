"""The layout planner (``benchmarks.layout_plan``): its parameter count is the built model's, and the presets
train with the layout its table picks for the cluster profile they are written for."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks import layout_plan
from benchmarks.layout_plan import CANDIDATES, Layout, estimate, parameters, pick
from pipeline.config import load_config
from tests.helpers import ROOT, tiny_model
from training.config import ParallelConfig
from training.distributed import init_distributed, shutdown_distributed
from training.model.gpt import build_gpt
from training.model.step import count_parameters


@pytest.mark.parametrize("model", [tiny_model(), dataclasses.replace(tiny_model(), num_query_groups=2, tied_embeddings=True)])
def test_parameter_count_is_the_built_models(model):
    init_distributed(ParallelConfig(tensor_parallel=1), 0, standalone=True)
    try:
        built = build_gpt(model, 384, 32, tensor_parallel=1)
        assert parameters(model, 384) == count_parameters(built)
        assert parameters(model, 300) == count_parameters(build_gpt(model, 300, 32, tensor_parallel=1))  # padded to 320
    finally:
        shutdown_distributed()


@pytest.mark.parametrize("preset", ["gpt-350m", "gpt-1b"])
def test_presets_use_the_layout_the_plan_picks_for_their_cluster(preset):
    config = load_config(ROOT / "configs" / f"{preset}.yaml")
    gpus = 16  # configs/cluster/gpu-2x8.yaml, the profile the presets name
    args = (config.model, config.tokenizer.vocab_size, config.data.seq_len, config.train.micro_batch_size)
    estimates = [estimate(*args, config.train.global_batch_size, layout, gpus) for layout in CANDIDATES]
    chosen = pick(estimates).layout
    dp = "distributed_optimizer" if config.parallel.distributed_optimizer else "ddp"
    assert Layout(config.parallel.tensor_parallel, dp) == chosen, chosen
    assert config.train.recompute == "none"  # the chosen layout fits without recomputing (the estimate's memory)
    assert all(e.memory_gb > 0 and e.comm_gb > 0 for e in estimates)


def test_fsdp_is_picked_where_only_it_fits():
    """An 8 B-parameter shape (Llama 3 8B's) at micro-batch 4 × 4096 on one node: replicated state (18 B a
    parameter, 135 GB) and the distributed optimizer's (7.5 B a parameter) with the activations exceed 85 % of
    141 GB; FSDP's 2.25 B a parameter fits, and is picked despite sending the most."""
    model = dataclasses.replace(
        tiny_model(), num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8, ffn_hidden_size=14336
    )
    assert 7e9 < parameters(model, 128_256) < 8e9
    layout_plan.MEASURED_TOKENS_PER_S[32 * 4096] = 8_000.0  # compute time only orders; memory decides here
    try:
        estimates = [estimate(model, 128_256, 4096, 4, 256, layout, 8) for layout in CANDIDATES if layout.tensor_parallel == 1]
    finally:
        del layout_plan.MEASURED_TOKENS_PER_S[32 * 4096]
    assert {e.layout.data_parallel: e.fits for e in estimates} == {"ddp": False, "distributed_optimizer": False, "fsdp": True}
    assert pick(estimates).layout == Layout(1, "fsdp")
    assert max(estimates, key=lambda e: e.comm_gb).layout == Layout(1, "fsdp")
