"""Which Hugging Face checkpoints are our GPT, and the ``config.json`` of ours in their family.

Our GPT is the Llama block (pre-norm RMSNorm, SwiGLU, rotate-half RoPE, grouped-query attention), and
three families are that block with a knob or two:

- **llama** (Llama 2/3.x, SmolLM, TinyLlama): no biases; Llama 3.x adds ``rope_type: llama3`` scaling.
- **mistral**: Llama's block; only without a sliding window (Mistral 7B v0.2 and later set none).
- **qwen2** (Qwen2, Qwen2.5): biases on the query, key and value projections.
- **qwen3**: an RMSNorm on every query and key head, and a head size of its own.

Everything else (mixtures of experts, sliding windows, an attention output bias, MLP biases, another
activation or RoPE scaling) is refused with one line naming it, before anything is read or written.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import UserError
from training.config import ModelConfig, ffn_size, head_size

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
EXPORTS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
"""What our model exports as: a Mistral without sliding window is a Llama, and loads as one."""


class UnsupportedCheckpoint(UserError, ValueError):
    """A Hugging Face checkpoint that is not our GPT; the message names the architecture or feature."""


@dataclass(frozen=True)
class Imported:
    """What a Hugging Face ``config.json`` says of our model."""

    family: str
    architecture: str
    model: ModelConfig
    max_positions: int


def _rope(hf: dict) -> tuple[float, dict]:
    """RoPE's base and scaling from either layout: transformers 5's ``rope_parameters`` or the older
    ``rope_theta`` + ``rope_scaling``."""
    params = hf.get("rope_parameters") or {}
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    scaling = hf.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type")) if scaling else params.get("rope_type", "default")
    return float(theta), ({**scaling, "rope_type": kind} if scaling else {**params, "rope_type": kind})


def _refusals(hf: dict, family: str) -> list[str]:
    heads = hf.get("num_attention_heads") or 0
    out = []
    if hf.get("num_experts") or hf.get("num_local_experts") or hf.get("n_routed_experts"):
        out.append("a mixture of experts")
    if family == "mistral" and hf.get("sliding_window") is not None:
        out.append(f"a sliding attention window ({hf['sliding_window']} tokens)")
    if family in ("qwen2", "qwen3") and hf.get("use_sliding_window"):
        out.append(f"a sliding attention window (use_sliding_window, {hf.get('sliding_window')} tokens)")
    if any(kind != "full_attention" for kind in hf.get("layer_types") or []):
        out.append("layers of sliding attention (layer_types)")
    if family in ("llama", "qwen3") and hf.get("attention_bias"):
        out.append("biases on the attention projections, the output one included (attention_bias)")
    if hf.get("mlp_bias"):
        out.append("MLP biases (mlp_bias)")
    if hf.get("hidden_act", "silu") != "silu":
        out.append(f"the activation {hf.get('hidden_act')!r} (SwiGLU takes silu)")
    _, rope = _rope(hf)
    if rope["rope_type"] not in ("default", "llama3"):
        out.append(f"RoPE scaling of type {rope['rope_type']!r} (default and llama3 are supported)")
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        out.append(f"partial RoPE (partial_rotary_factor {hf['partial_rotary_factor']})")
    if hf.get("pretraining_tp", 1) != 1:
        out.append(f"pretraining_tp {hf['pretraining_tp']}")
    if not heads:
        out.append("no num_attention_heads")
    return out


def imported_config(hf: dict, where: str) -> Imported:
    """Our model section of the Hugging Face ``config.json`` ``hf`` (read from ``where``); refuses, in one line,
    an architecture or feature that is not our GPT."""
    architectures = hf.get("architectures") or [f"model_type {hf.get('model_type')!r}"]
    architecture = architectures[0]
    family = ARCHITECTURES.get(architecture)
    if family is None:
        raise UnsupportedCheckpoint(
            f"{where}: architecture {architecture} is not supported (supported: {', '.join(ARCHITECTURES)}); nothing was written"
        )
    refused = _refusals(hf, family)
    if refused:
        raise UnsupportedCheckpoint(f"{where}: {architecture} with {'; '.join(refused)} is not supported; nothing was written")
    theta, rope = _rope(hf)
    heads = hf["num_attention_heads"]
    hidden = hf["hidden_size"]
    head_dim = hf.get("head_dim") or hidden // heads
    scaled = rope["rope_type"] == "llama3"
    model = ModelConfig(
        num_layers=hf["num_hidden_layers"],
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=hf.get("num_key_value_heads") or heads,
        ffn_hidden_size=hf["intermediate_size"],
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)),  # every family's default
        rotary_base=int(theta) if float(theta).is_integer() else _refuse_theta(where, theta),
        head_dim=head_dim if head_dim * heads != hidden else 0,
        qkv_bias=family == "qwen2",
        qk_norm=family == "qwen3",
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_scaling_factor=float(rope["factor"]) if scaled else 0.0,
        rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)) if scaled else 1.0,
        rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)) if scaled else 4.0,
        rope_original_max_positions=int(rope.get("original_max_position_embeddings", 8192)) if scaled else 8192,
        vocab_size=hf["vocab_size"],
    )
    problems = model.problems()
    if problems:
        raise UnsupportedCheckpoint(f"{where}: {architecture} does not fit our model: {'; '.join(problems)}; nothing was written")
    return Imported(family, architecture, model, int(hf.get("max_position_embeddings") or 2048))


def _refuse_theta(where: str, theta: float) -> int:
    raise UnsupportedCheckpoint(f"{where}: rope_theta {theta} is not a whole number (model.rotary_base is one)")


def family_of(model: ModelConfig) -> str:
    """The Hugging Face family our model exports as: Qwen3 with query/key norms, Qwen2 with query/key/value
    biases, else Llama. Both at once are no family's, and refused."""
    if model.qk_norm and model.qkv_bias:
        raise UnsupportedCheckpoint(
            "model.qk_norm and model.qkv_bias together are no Hugging Face family's (Qwen3 has the norms, Qwen2 the "
            "biases): the model cannot be exported"
        )
    return "qwen3" if model.qk_norm else "qwen2" if model.qkv_bias else "llama"


def exported_config(
    model: ModelConfig, vocab_size: int, max_positions: int, eod_id: int, pad_id: int, bos_id: int | None, dtype: str
) -> dict:
    """``config.json`` of ``model`` in its family (``family_of``); ``vocab_size``: the rows exported (the
    imported size, or the padded embedding of a model trained here)."""
    family = family_of(model)
    heads = model.num_attention_heads
    rope: dict = {"rope_type": "default", "rope_theta": float(model.rotary_base)}
    if model.rope_scaling_factor:
        rope = {
            "rope_type": "llama3",
            "rope_theta": float(model.rotary_base),
            "factor": model.rope_scaling_factor,
            "low_freq_factor": model.rope_low_freq_factor,
            "high_freq_factor": model.rope_high_freq_factor,
            "original_max_position_embeddings": model.rope_original_max_positions,
        }
    config = {
        "architectures": [EXPORTS[family]],
        "model_type": family,
        "vocab_size": vocab_size,
        "hidden_size": model.hidden_size,
        "intermediate_size": ffn_size(model),
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": model.num_query_groups or heads,
        "head_dim": head_size(model),
        "hidden_act": "silu",
        "max_position_embeddings": max_positions,
        "rms_norm_eps": model.norm_eps,
        "rope_parameters": rope,
        # The keys transformers < 5 reads.
        "rope_theta": float(model.rotary_base),
        **({"rope_scaling": {k: v for k, v in rope.items() if k != "rope_theta"}} if model.rope_scaling_factor else {}),
        "tie_word_embeddings": model.tied_embeddings,
        "bos_token_id": eod_id if bos_id is None else bos_id,
        "eos_token_id": eod_id,
        "pad_token_id": pad_id,
        "dtype": dtype,
    }
    if family == "llama":
        config |= {"attention_bias": False, "mlp_bias": False}
    elif family == "qwen3":
        config |= {"attention_bias": False, "use_sliding_window": False, "sliding_window": None}
    else:
        config |= {"use_sliding_window": False, "sliding_window": None}
    return config
