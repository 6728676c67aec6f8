"""Hugging Face parameter names and layouts ↔ megatron's (whole tensors, as a TP=1 GPTModel holds them).

Two of megatron's tensors fuse what Hugging Face keeps apart:

- ``linear_qkv`` holds, for each query group, that group's query heads, then its key head, then its
  value head: ``[groups, (q_per_group + 2) · head_dim, hidden]`` (its bias the same way, without ``hidden``).
- ``linear_fc1`` holds ``[gate | up]`` (what our SwiGLU kernel reads).

The embedding (and an untied output layer) keeps megatron's padding to a multiple of 64 × TP rows; the
padding rows are zero on import and cut on export to the family's ``vocab_size``.
"""

from __future__ import annotations

import torch

from training.config import ModelConfig, head_size

LAYER = "decoder.layers.{}."
HF_LAYER = "model.layers.{}."

# One-to-one renames inside a layer: megatron → Hugging Face.
_LAYER_RENAMES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
_QK_NORMS = {
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
}


def _shape(model: ModelConfig) -> tuple[int, int, int]:
    heads = model.num_attention_heads
    groups = model.num_query_groups or heads
    return groups, heads // groups, head_size(model)


def to_hf(megatron: dict[str, torch.Tensor], model: ModelConfig, vocab_size: int) -> dict[str, torch.Tensor]:
    """Hugging Face's state dict of a megatron one; the embedding cut to ``vocab_size`` rows."""
    groups, per_group, head_dim = _shape(model)
    out = {
        "model.embed_tokens.weight": megatron["embedding.word_embeddings.weight"][:vocab_size],
        "model.norm.weight": megatron["decoder.final_layernorm.weight"],
    }
    if not model.tied_embeddings:
        out["lm_head.weight"] = megatron["output_layer.weight"][:vocab_size]
    for i in range(model.num_layers):
        src, dst = LAYER.format(i), HF_LAYER.format(i)
        names = {"weight"} | ({"bias"} if model.qkv_bias else set())
        for kind in sorted(names):
            fused = megatron[f"{src}self_attention.linear_qkv.{kind}"]
            fused = fused.view(groups, (per_group + 2) * head_dim, *fused.shape[1:])
            q, k, v = fused.split([per_group * head_dim, head_dim, head_dim], dim=1)
            out[f"{dst}self_attn.q_proj.{kind}"] = q.reshape(groups * per_group * head_dim, *fused.shape[2:])
            out[f"{dst}self_attn.k_proj.{kind}"] = k.reshape(groups * head_dim, *fused.shape[2:])
            out[f"{dst}self_attn.v_proj.{kind}"] = v.reshape(groups * head_dim, *fused.shape[2:])
        gate, up = megatron[f"{src}mlp.linear_fc1.weight"].chunk(2, dim=0)
        out[f"{dst}mlp.gate_proj.weight"], out[f"{dst}mlp.up_proj.weight"] = gate, up
        renames = _LAYER_RENAMES | (_QK_NORMS if model.qk_norm else {})
        out |= {dst + theirs: megatron[src + ours] for ours, theirs in renames.items()}
    # safetensors refuses views that share storage; each tensor gets its own copy.
    return {name: t.detach().to("cpu").contiguous().clone() for name, t in out.items()}


def to_megatron(hf: dict[str, torch.Tensor], model: ModelConfig, padded_vocab: int) -> dict[str, torch.Tensor]:
    """megatron's state dict of a Hugging Face one; the embedding padded with zero rows to ``padded_vocab``.
    A tensor missing from ``hf`` raises KeyError naming it; one left over is reported by ``unused``."""
    groups, per_group, head_dim = _shape(model)

    def padded(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t.new_zeros(padded_vocab - t.shape[0], *t.shape[1:])]) if t.shape[0] < padded_vocab else t

    out = {
        "embedding.word_embeddings.weight": padded(hf["model.embed_tokens.weight"]),
        "decoder.final_layernorm.weight": hf["model.norm.weight"],
    }
    if not model.tied_embeddings:
        out["output_layer.weight"] = padded(hf["lm_head.weight"])
    for i in range(model.num_layers):
        src, dst = HF_LAYER.format(i), LAYER.format(i)
        for kind in ("weight", "bias") if model.qkv_bias else ("weight",):
            q, k, v = (hf[f"{src}self_attn.{p}_proj.{kind}"] for p in "qkv")
            rest = q.shape[1:]
            fused = torch.cat(
                [
                    q.reshape(groups, per_group * head_dim, *rest),
                    k.reshape(groups, head_dim, *rest),
                    v.reshape(groups, head_dim, *rest),
                ],
                dim=1,
            )
            out[f"{dst}self_attention.linear_qkv.{kind}"] = fused.reshape(-1, *rest)
        out[f"{dst}mlp.linear_fc1.weight"] = torch.cat([hf[f"{src}mlp.gate_proj.weight"], hf[f"{src}mlp.up_proj.weight"]])
        renames = _LAYER_RENAMES | (_QK_NORMS if model.qk_norm else {})
        out |= {dst + ours: hf[src + theirs] for ours, theirs in renames.items()}
    return out


def unused(hf: dict[str, torch.Tensor], model: ModelConfig) -> list[str]:
    """Tensors of a Hugging Face checkpoint that ``to_megatron`` does not read (buffers such as
    ``rotary_emb.inv_freq`` aside): a feature of the checkpoint our model would silently drop."""
    read = set(to_hf(_names_only(model), model, 0))
    if model.tied_embeddings:
        read.add("lm_head.weight")  # a tied checkpoint may store the shared matrix twice
    return sorted(name for name in hf if name not in read and not name.endswith("rotary_emb.inv_freq"))


def _names_only(model: ModelConfig) -> dict[str, torch.Tensor]:
    """A megatron state dict of empty tensors with every name ``to_hf`` reads, shaped so its splits work."""
    groups, per_group, head_dim = _shape(model)
    qkv = torch.empty(groups * (per_group + 2) * head_dim, 0)
    names = {"embedding.word_embeddings.weight": torch.empty(0), "decoder.final_layernorm.weight": torch.empty(0)}
    if not model.tied_embeddings:
        names["output_layer.weight"] = torch.empty(0)
    for i in range(model.num_layers):
        src = LAYER.format(i)
        names[f"{src}self_attention.linear_qkv.weight"] = qkv
        names[f"{src}self_attention.linear_qkv.bias"] = torch.empty(groups * (per_group + 2) * head_dim)
        names[f"{src}mlp.linear_fc1.weight"] = torch.empty(2, 0)
        for ours in (*_LAYER_RENAMES, *_QK_NORMS):
            names[src + ours] = torch.empty(0)
    return names
