"""Our Triton kernels inside megatron-core's GPT.

- RMSNorm (every layer's two norms and the final one) and the SwiGLU activation go in
  through the layer spec: megatron builds whatever module the spec names.
- Core attention: megatron's local ``DotProductAttention`` materialises the [b, heads, s, s]
  scores; ``SDPAttention`` runs the same maths through ``torch.nn.functional.scaled_dot_product_attention``
  (flash / memory-efficient kernels on CUDA), falling back to megatron's path for what it does not cover.
- RoPE: megatron's attention calls the module-level ``apply_rotary_pos_emb`` and offers no
  spec hook for it; ``install_rotary`` swaps in a dispatcher that takes our kernel for the
  configurations it covers (no packed sequences, no context parallelism, non-interleaved)
  and megatron's own function otherwise.
- Output layer + loss: ``mean_token_loss`` runs the model up to the final norm and feeds the
  hidden states and the output weight to the fused linear + cross-entropy, which never
  builds the [tokens, vocab] logits. It needs the whole vocabulary on one rank, so with
  tensor parallelism megatron's vocab-parallel cross-entropy is used instead.

``kernels: triton`` runs the Triton kernels where they can run (CUDA, or the interpreter
with ``TRITON_INTERPRET=1``) and their PyTorch references elsewhere; ``kernels: torch``
always runs the references. Either way the modules and checkpoints are the same.
"""

from __future__ import annotations

import functools
import os

import torch

from kernels.fused_linear_ce import fused_linear_cross_entropy
from kernels.rmsnorm import rmsnorm
from kernels.rotary import apply_rotary
from kernels.swiglu import swiglu

COMPILE_ATTR = "pretrain_compiled_loss"  # set on megatron's TransformerConfig by training.model.compiling
IMPL_ATTR = "pretrain_kernel_impl"  # set on megatron's TransformerConfig by build_gpt
TP_PARTIAL = "tp_partial_grad"  # a replicated parameter whose gradient each tensor-parallel rank holds a part of


def resolve_impl(choice: str) -> str:
    if choice not in ("triton", "torch"):
        raise ValueError(f"model.kernels must be 'triton' or 'torch', got {choice!r}")
    runnable = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
    return "triton" if choice == "triton" and runnable else "torch"


def _megatron_module():
    # Subclassing MegatronModule gives the modules megatron's sharded_state_dict (replicated
    # parameters), which its dist-checkpointing asks every submodule for.
    from megatron.core.transformer.module import MegatronModule

    return MegatronModule


class RMSNorm(_megatron_module()):
    """megatron's norm interface ``(config, hidden_size, eps)`` on our kernel."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__(config=config)
        device = "cpu" if config.use_cpu_initialization else torch.cuda.current_device()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype, device=device))
        # Under sequence parallelism each TP rank normalises its own slice of the sequence,
        # so the weight's gradient is partial: the trainer sums such gradients over TP.
        self.weight.sequence_parallel = config.sequence_parallel
        self.eps = eps
        self.impl = getattr(config, IMPL_ATTR, "torch")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rmsnorm(x, self.weight, self.eps, impl=self.impl)


class HeadRMSNorm(RMSNorm):
    """The query/key norm (Qwen3's): over each head's channels, after the projection. A tensor-parallel rank
    holds some of the heads, so the weight's gradient is partial whatever the sequence split: the trainer sums
    it over TP (``TP_PARTIAL``), as megatron's own gradient finaliser does for its q/k layernorms."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__(config, hidden_size, eps)
        setattr(self.weight, TP_PARTIAL, True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [s, b, heads, d]: the kernels normalise rows of a 2-D view.
        return super().forward(x.reshape(-1, x.shape[-1])).view(x.shape)


class SwiGLU(_megatron_module()):
    """The MLP activation on fc1's ``[gate | up]`` output: silu(gate) · up."""

    def __init__(self, config) -> None:
        super().__init__(config=config)
        self.impl = getattr(config, IMPL_ATTR, "torch")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x, impl=self.impl)


INIT_SEED_ATTR = "pretrain_init_seed"  # set on megatron's TransformerConfig by build_gpt


@functools.lru_cache(maxsize=1)
def _seeded_layer_class():
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_layer import TransformerLayer, get_transformer_layer_offset

    class SeededTransformerLayer(TransformerLayer):
        """A transformer layer whose CPU initialisation depends on its global layer number alone.

        With ``use_cpu_initialization`` megatron draws every weight from the default generator in
        build order, so a pipeline stage that builds layers k… from a fresh seed would get other
        weights than a single stage does for the same layers. Re-seeding (not forking: what is
        built after the last layer, an untied output layer, must follow it the same way on every
        layout) from (seed, global layer number) makes the initial model identical whatever the
        pipeline split, as tensor-parallel splits already are. On a GPU megatron's own RNG
        tracker initialises and the layout-dependence is megatron's as shipped.
        """

        def __init__(self, config, submodules, layer_number: int = 1, *args, **kwargs) -> None:
            seed = getattr(config, INIT_SEED_ATTR, None)
            if config.use_cpu_initialization and seed is not None:
                pg = kwargs.get("pg_collection")
                pp_rank = pg.pp.rank() if pg is not None else parallel_state.get_pipeline_model_parallel_rank()
                offset = get_transformer_layer_offset(config, kwargs.get("vp_stage"), pp_rank)
                torch.manual_seed(seed * 100_003 + layer_number + offset)
            super().__init__(config, submodules, layer_number, *args, **kwargs)

    return SeededTransformerLayer


def _dot_product_attention():
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    return DotProductAttention


class SDPAttention(_dot_product_attention()):
    """megatron's core attention (same constructor, parameters and checkpoints) on torch's SDPA.

    The 350M shape (seq 2048, bf16, one H200) trained at 38k tokens/s on megatron's unfused path
    and 154k on this one (benchmarks/bench_train.py). Causal self-attention without bias, dropout, window,
    softmax offset or query-key layer scaling takes SDPA; anything else megatron's code. A boolean
    ``[b, 1, s, s]`` mask (True = masked, megatron's convention: document masking's block-diagonal causal
    mask, ``training.model.documents``) goes to SDPA as its complement, the causality included.
    """

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None, packed_seq_params=None, **kw):
        from megatron.core.transformer.enums import AttnMaskType

        config = self.config
        masked = attention_mask is not None and attention_mask.dtype == torch.bool and attention_mask.dim() == 4
        plain = (
            (attn_mask_type or self.attn_mask_type) == AttnMaskType.causal
            and (attention_mask is None or masked)
            and attention_bias is None
            and packed_seq_params is None
            and query.shape[0] == key.shape[0]
            and getattr(self, "softmax_offset", None) is None
            and getattr(config, "window_size", None) is None
            and not config.apply_query_key_layer_scaling
            and (self.attention_dropout.p == 0 or not self.training)
            and not kw  # arguments of a newer megatron that this path does not know
        )
        if not plain:
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params, **kw)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [s, b, heads, d] -> [b, heads, s, d]
        if q.shape[1] != k.shape[1]:  # grouped-query attention: repeat each key/value head over its group
            k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        if masked:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=~attention_mask, scale=self.softmax_scale)
        else:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
        return out.permute(2, 0, 1, 3).reshape(out.shape[2], out.shape[0], -1)  # [s, b, heads · d]


def gpt_block_spec(num_layers: int, qk_norm: bool = False, fp8: bool = False):
    """megatron's local GPT layer spec with our norm, activation and SDPA attention, plus our final norm;
    with ``qk_norm`` our norm on every query and key head too; with ``fp8`` the four linears of each layer
    multiply in FP8 (``training.model.fp8``).

    ``num_layers`` is this pipeline stage's share: megatron numbers the layers globally
    (stage offset + local index), so checkpoints do not depend on the pipeline split.
    """
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    layer = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=qk_norm)
    layer.module = _seeded_layer_class()
    layer.submodules.input_layernorm = RMSNorm
    layer.submodules.pre_mlp_layernorm = RMSNorm
    if qk_norm:
        layer.submodules.self_attention.submodules.q_layernorm = HeadRMSNorm
        layer.submodules.self_attention.submodules.k_layernorm = HeadRMSNorm
    layer.submodules.mlp.submodules.activation_func = SwiGLU
    layer.submodules.self_attention.submodules.core_attention = SDPAttention
    if fp8:
        from training.model.fp8 import fp8_linears

        column, row = fp8_linears()
        layer.submodules.self_attention.submodules.linear_qkv = column
        layer.submodules.self_attention.submodules.linear_proj = row
        layer.submodules.mlp.submodules.linear_fc1 = column
        layer.submodules.mlp.submodules.linear_fc2 = row
    return TransformerBlockSubmodules(layer_specs=[layer] * num_layers, layer_norm=RMSNorm)


_installed = False


def install_rotary() -> None:
    """Route megatron's attention RoPE through our kernel where it applies. Idempotent."""
    global _installed
    if _installed:
        return
    from megatron.core.transformer import attention

    megatron_rope = attention.apply_rotary_pos_emb

    def rope(t, freqs, config, cu_seqlens=None, mscale=1.0, cp_group=None):
        # Per-token angles ([s, b, 1, d]: document masking's positions) take megatron's broadcasting function.
        per_token = freqs.dim() == 4 and freqs.shape[1] != 1
        plain = (
            cu_seqlens is None and not per_token and not config.rotary_interleaved and (cp_group is None or cp_group.size() == 1)
        )
        if plain and getattr(config, IMPL_ATTR, None) is not None:
            # In compiled layers the reference, which Inductor fuses (training/model/compiling.py).
            impl = "torch" if getattr(config, COMPILE_ATTR, False) else getattr(config, IMPL_ATTR)
            return apply_rotary(t, freqs, mscale, impl=impl)
        return megatron_rope(t, freqs, config=config, cu_seqlens=cu_seqlens, mscale=mscale, cp_group=cp_group)

    attention.apply_rotary_pos_emb = rope
    _installed = True


IGNORE_INDEX = -100
"""A label that counts for nothing in the fused loss (and its reference's): the default of both."""


def mean_token_loss(
    model,
    inputs: torch.Tensor,
    positions: torch.Tensor,
    labels: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    loss_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean next-token cross-entropy of a batch (``[batch, seq]`` inputs and labels), over the tokens of
    ``loss_mask`` (all when None); ``attention_mask`` as megatron takes it (None: causal)."""
    config = model.config
    if config.tensor_model_parallel_size > 1:
        losses = model(inputs, positions, attention_mask, labels=labels).float()
        if loss_mask is None:
            return losses.mean()
        return (losses * loss_mask).sum() / loss_mask.sum().clamp(min=1)
    if loss_mask is not None:
        labels = labels.masked_fill(~loss_mask, IGNORE_INDEX)
    model.post_process = False  # GPTModel then returns the final-norm hidden states [s, b, h]
    try:
        hidden = model(inputs, positions, attention_mask)
    finally:
        model.post_process = True
    weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else model.output_layer.weight
    impl = getattr(config, IMPL_ATTR, "torch")
    if impl == "torch" and getattr(config, COMPILE_ATTR, False):  # the references, fused by Inductor
        return compiled_loss()(hidden.reshape(-1, hidden.shape[-1]), weight, labels.t().reshape(-1))
    return fused_linear_cross_entropy(hidden, weight, labels.t(), impl=impl)


@functools.cache
def compiled_loss():
    """The PyTorch reference of the fused linear + cross-entropy, compiled once per process."""
    from kernels.fused_linear_ce import fused_linear_cross_entropy_reference

    return torch.compile(fused_linear_cross_entropy_reference)
