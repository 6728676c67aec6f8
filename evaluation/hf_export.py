"""Our GPT as a Hugging Face Llama checkpoint: safetensors, ``config.json``, tokenizer files.

The model is Llama-shaped (pre-norm RMSNorm, SwiGLU MLP, non-interleaved RoPE over the
whole head, no biases, optional grouped-query attention and tied embeddings), so the
export is a renaming plus two splits of megatron's fused weights:

- ``linear_qkv`` holds, for each query group, that group's query heads, then its key head,
  then its value head: ``[groups, (q_per_group + 2) · head_dim, hidden]``.
- ``linear_fc1`` holds ``[gate | up]`` (what our SwiGLU kernel reads).

The vocabulary keeps megatron's padding: ``vocab_size`` in ``config.json`` is the padded
size, and the padding rows never win an argmax for trained models (they get no gradient
from the labels) — the tokenizer simply never produces those ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from common.contracts import EOD_TOKEN, PAD_TOKEN
from training.config import ModelConfig, ffn_size

WEIGHTS = "model.safetensors"
RMS_NORM_EPS = 1e-5  # megatron's TransformerConfig.layernorm_epsilon default, which build_gpt keeps


def llama_config(
    model_cfg: ModelConfig, vocab_size: int, seq_len: int, eod_id: int, pad_id: int, dtype: torch.dtype = torch.float32
) -> dict:
    """``config.json`` for ``LlamaForCausalLM``; ``vocab_size`` is the padded embedding size."""
    heads = model_cfg.num_attention_heads
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": model_cfg.hidden_size,
        "intermediate_size": ffn_size(model_cfg),
        "num_hidden_layers": model_cfg.num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": model_cfg.num_query_groups or heads,
        "head_dim": model_cfg.hidden_size // heads,
        "hidden_act": "silu",
        "max_position_embeddings": seq_len,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_parameters": {"rope_type": "default", "rope_theta": float(model_cfg.rotary_base)},
        "rope_theta": float(model_cfg.rotary_base),  # the key transformers < 5 reads
        "tie_word_embeddings": model_cfg.tied_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": eod_id,  # documents are separated, not opened: generation starts after an end-of-document
        "eos_token_id": eod_id,
        "pad_token_id": pad_id,
        "dtype": str(dtype).removeprefix("torch."),  # as trained: float32 on CPU, bfloat16 on GPU
    }


def llama_state_dict(megatron: dict[str, torch.Tensor], model_cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Megatron GPTModel (TP=1, local layer spec) parameter names and layouts → Llama's."""
    heads = model_cfg.num_attention_heads
    groups = model_cfg.num_query_groups or heads
    head_dim = model_cfg.hidden_size // heads
    q_per_group = heads // groups
    out = {
        "model.embed_tokens.weight": megatron["embedding.word_embeddings.weight"],
        "model.norm.weight": megatron["decoder.final_layernorm.weight"],
    }
    if not model_cfg.tied_embeddings:
        out["lm_head.weight"] = megatron["output_layer.weight"]
    for i in range(model_cfg.num_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        qkv = megatron[src + "self_attention.linear_qkv.weight"].view(groups, (q_per_group + 2) * head_dim, -1)
        q, k, v = qkv.split([q_per_group * head_dim, head_dim, head_dim], dim=1)
        gate, up = megatron[src + "mlp.linear_fc1.weight"].chunk(2, dim=0)
        out |= {
            dst + "input_layernorm.weight": megatron[src + "input_layernorm.weight"],
            dst + "self_attn.q_proj.weight": q.reshape(heads * head_dim, -1),
            dst + "self_attn.k_proj.weight": k.reshape(groups * head_dim, -1),
            dst + "self_attn.v_proj.weight": v.reshape(groups * head_dim, -1),
            dst + "self_attn.o_proj.weight": megatron[src + "self_attention.linear_proj.weight"],
            dst + "post_attention_layernorm.weight": megatron[src + "pre_mlp_layernorm.weight"],
            dst + "mlp.gate_proj.weight": gate,
            dst + "mlp.up_proj.weight": up,
            dst + "mlp.down_proj.weight": megatron[src + "mlp.linear_fc2.weight"],
        }
    # safetensors refuses views that share storage; each tensor gets its own copy.
    return {name: t.detach().to("cpu").contiguous().clone() for name, t in out.items()}


def tokenizer_files(tokenizer_json: str, seq_len: int) -> dict[str, str]:
    """The tokenizer in the layout ``AutoTokenizer.from_pretrained`` reads."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOD_TOKEN,
        "bos_token": EOD_TOKEN,
        "pad_token": PAD_TOKEN,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": seq_len,
        "clean_up_tokenization_spaces": False,
    }
    specials = {"eos_token": EOD_TOKEN, "bos_token": EOD_TOKEN, "pad_token": PAD_TOKEN}
    return {
        "tokenizer.json": tokenizer_json,
        "tokenizer_config.json": json.dumps(config, indent=2),
        "special_tokens_map.json": json.dumps(specials, indent=2),
    }


def export_llama(model, model_cfg: ModelConfig, tokenizer_json: str, seq_len: int, out_dir: Path) -> Path:
    """Write ``model`` (a TP=1 GPTModel) as a Hugging Face Llama checkpoint in ``out_dir``."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    eod_id, pad_id = tokenizer.token_to_id(EOD_TOKEN), tokenizer.token_to_id(PAD_TOKEN)
    megatron = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    embedding = megatron["embedding.word_embeddings.weight"]
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(llama_state_dict(megatron, model_cfg), str(out_dir / WEIGHTS), metadata={"format": "pt"})
    config = llama_config(model_cfg, embedding.shape[0], seq_len, eod_id, pad_id, embedding.dtype)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    generation = {"bos_token_id": eod_id, "eos_token_id": eod_id, "pad_token_id": pad_id, "do_sample": False}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2))
    for name, text in tokenizer_files(tokenizer_json, seq_len).items():
        (out_dir / name).write_text(text)
    return out_dir
