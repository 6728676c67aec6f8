"""SDPAttention computes what megatron's DotProductAttention computes, values and gradients."""

import pytest
import torch

from training.config import ModelConfig, ParallelConfig
from training.distributed import init_distributed, shutdown_distributed
from training.model.gpt import build_gpt


@pytest.fixture(scope="module")
def megatron_world():
    init_distributed(ParallelConfig(tensor_parallel=1), seed=0, standalone=True)
    yield
    shutdown_distributed()


def attention_pair(heads: int, groups: int, hidden: int = 64):
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from training.model.layers import SDPAttention

    config = TransformerConfig(
        num_layers=1, hidden_size=hidden, num_attention_heads=heads, num_query_groups=groups, attention_dropout=0.0
    )
    kwargs = dict(layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    return [cls(config, **kwargs) for cls in (DotProductAttention, SDPAttention)]


@pytest.mark.slow
@pytest.mark.parametrize("heads,groups", [(4, 4), (4, 2)], ids=["multi-head", "grouped-query"])
def test_sdpa_matches_megatron_attention(megatron_world, heads, groups):
    seq, batch, dim = 12, 3, 16
    gen = torch.Generator().manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    inputs = [torch.randn(seq, batch, n, dim, generator=gen).to(device) for n in (heads, groups, groups)]
    results = []
    for module in attention_pair(heads, groups):
        leaves = [t.clone().requires_grad_() for t in inputs]
        out = module(*leaves, attention_mask=None)
        out.backward(torch.linspace(-1, 1, out.numel(), device=device).view_as(out))
        results.append((out.detach(), [t.grad for t in leaves]))
    (ref, ref_grads), (out, grads) = results
    assert out.shape == ref.shape == (seq, batch, heads * dim)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


def test_gpt_layers_use_sdpa(megatron_world):
    from training.model.layers import SDPAttention

    model = build_gpt(ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=4), 128, 16, 1)
    assert all(type(layer.self_attention.core_attention) is SDPAttention for layer in model.decoder.layers)
