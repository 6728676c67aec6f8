"""The GPT model on megatron-core: built from ModelConfig for a parallel layout (``training.distributed`` sets up its groups)."""

from __future__ import annotations

import functools
import importlib.util
import math

import torch

from common.errors import ConfigError
from training.config import ModelConfig, ParallelConfig, Recompute, ffn_size, head_size
from training.distributed import check_parallel

# megatron's settings per TrainConfig.recompute. Selective recomputes the core attention
# (scores, softmax, weighted sum) in backward; full recomputes every layer from its input.
RECOMPUTE: dict[str, dict] = {
    Recompute.NONE: {},
    Recompute.SELECTIVE: {"recompute_granularity": "selective"},
    Recompute.FULL: {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
}


def build_gpt(
    config: ModelConfig,
    vocab_size: int,
    seq_len: int,
    tensor_parallel: int,
    sequence_parallel: bool = False,
    pipeline_parallel: int = 1,
    init_seed: int | None = None,
    recompute: str = "none",
    document_eod: int | None = None,
    fp8_recipe: str = "",
):
    """A megatron-core GPTModel for this rank: with ``pipeline_parallel`` > 1, this rank's stage
    (its layers; the embedding on the first stage, the final norm and output on the last).
    megatron's groups must be initialised with the same sizes. With ``init_seed`` the CPU
    initialisation is the same whatever the parallel layout (see ``layers.py``). ``recompute``
    is ``TrainConfig.recompute``. ``document_eod``: the end-of-text id of document masking
    (``training.model.documents``; None = off), which ``mean_loss`` reads from the model. ``fp8_recipe``:
    the transformer layers' linears multiply in FP8 under that recipe (``training.model.fp8``; '' = not)."""
    from megatron.core import parallel_state

    from training.model.layers import IMPL_ATTR, INIT_SEED_ATTR, gpt_block_spec, install_rotary, resolve_impl

    if recompute not in RECOMPUTE:
        raise ConfigError(f"train.recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    parallel = ParallelConfig(
        tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel, sequence_parallel=sequence_parallel
    )
    check_parallel(parallel, config)
    if parallel_state.get_pipeline_model_parallel_world_size() != pipeline_parallel:
        raise ConfigError(
            f"pipeline_parallel={pipeline_parallel} but the process groups were set up for "
            f"{parallel_state.get_pipeline_model_parallel_world_size()} stages"
        )

    on_gpu = torch.cuda.is_available()
    transformer = transformer_config(config, parallel, recompute)
    setattr(transformer, IMPL_ATTR, resolve_impl(config.kernels))
    if init_seed is not None:
        setattr(transformer, INIT_SEED_ATTR, init_seed)
    if fp8_recipe:
        from training.model.fp8 import FP8_ATTR, Fp8Recipe

        setattr(transformer, FP8_ATTR, Fp8Recipe(fp8_recipe).value)
    install_rotary()
    if config.vocab_size and vocab_size > config.vocab_size:
        raise ConfigError(
            f"the tokenizer has {vocab_size} tokens but model.vocab_size is {config.vocab_size}: "
            "its ids would fall outside the embedding; use the model's own tokenizer or set model.vocab_size: 0"
        )
    vocab = _padded_vocab(config.vocab_size or vocab_size, tensor_parallel)
    layers = gpt_block_spec(config.num_layers // pipeline_parallel, qk_norm=config.qk_norm, fp8=bool(fp8_recipe))
    model = _gpt_class()(
        config=transformer,
        transformer_layer_spec=layers,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        vocab_size=vocab,
        max_sequence_length=seq_len,
        share_embeddings_and_output_weights=config.tied_embeddings,
        position_embedding_type="rope",
        rotary_base=config.rotary_base,
    )
    if config.rope_scaling_factor and model.rotary_pos_emb is not None:
        model.rotary_pos_emb.inv_freq = llama3_inv_freq(model.rotary_pos_emb.inv_freq, config)
    model.document_eod = document_eod
    if on_gpu:
        model.cuda()
    return model


@functools.cache
def _gpt_class():
    from megatron.core.models.gpt import GPTModel

    class GPT(GPTModel):
        """megatron's GPTModel whose RoPE follows ``position_ids`` when they are given per row: megatron's
        rotary embedding covers positions 0..s-1 alike in every row; document masking restarts them at each
        document. The angles travel down to the layers as an argument (recompute replays them)."""

        document_eod: int | None = None

        def _preprocess(self, input_ids, position_ids, *args, **kwargs):
            out = super()._preprocess(input_ids, position_ids, *args, **kwargs)
            rotary = out[1]
            if self.document_eod is None or position_ids is None or rotary is None or position_ids.dim() != 2:
                return out
            per_token = rotary[:, 0, 0, :][position_ids.t()].unsqueeze(2)  # [s, 1, 1, d] -> [s, b, 1, d]
            return (out[0], per_token, *out[2:])

    return GPT


def llama3_inv_freq(inv_freq: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """RoPE's inverse frequencies under Llama 3's scaling (``rope_type: llama3``), as transformers computes
    them: long wavelengths divided by the factor, short ones kept, those between blended. megatron's own
    scaling fixes every setting but the factor, so the frequencies are set here from all four."""
    factor, low, high = config.rope_scaling_factor, config.rope_low_freq_factor, config.rope_high_freq_factor
    original = config.rope_original_max_positions
    low_wavelen, high_wavelen = original / low, original / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def transformer_config(config: ModelConfig, parallel: ParallelConfig, recompute: str):
    """megatron's TransformerConfig of our GPT (RMSNorm, SwiGLU, RoPE, no dropout, no biases but the optional
    query/key/value ones) on this machine: bf16 on GPUs, fp32 on CPU."""
    from megatron.core.transformer import TransformerConfig

    groups = config.num_query_groups or config.num_attention_heads
    on_gpu = torch.cuda.is_available()
    return TransformerConfig(
        **RECOMPUTE[recompute],
        num_layers=config.num_layers,
        hidden_size=config.hidden_size,
        ffn_hidden_size=ffn_size(config),
        num_attention_heads=config.num_attention_heads,
        num_query_groups=groups,
        kv_channels=head_size(config),
        add_qkv_bias=config.qkv_bias,
        qk_layernorm=config.qk_norm,
        layernorm_epsilon=config.norm_eps,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        # Build the activation module named in the spec (our SwiGLU kernel) instead of
        # applying activation_func itself; the flag's name is megatron's, for its TE path.
        use_te_activation_func=True,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=parallel.tensor_parallel,
        sequence_parallel=parallel.sequence_parallel,
        pipeline_model_parallel_size=parallel.pipeline_parallel,
        # Activations sent between stages travel in the compute dtype.
        pipeline_dtype=torch.bfloat16 if on_gpu else torch.float32,
        # The post-exchange device synchronisation is a CUDA workaround (older NCCL).
        batch_p2p_sync=on_gpu,
        use_cpu_initialization=not on_gpu,
        bf16=on_gpu,
        params_dtype=torch.bfloat16 if on_gpu else torch.float32,
        bias_activation_fusion=False,
        masked_softmax_fusion=on_gpu and _fused_softmax_built(),
        persist_layer_norm=False,
        init_method_std=0.02,
    )


def _fused_softmax_built() -> bool:
    """megatron's fused masked softmax needs its compiled CUDA extensions, absent from plain torch images."""
    return all(importlib.util.find_spec(m) for m in ("scaled_masked_softmax_cuda", "scaled_upper_triang_masked_softmax_cuda"))


def _padded_vocab(vocab_size: int, tensor_parallel: int, multiple: int = 64) -> int:
    """Megatron splits the vocabulary across TP ranks: pad to a multiple of 64 × TP."""
    step = multiple * tensor_parallel
    return int(math.ceil(vocab_size / step) * step)


def mean_loss(model, tokens: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of rows holding ``seq_len + 1`` ids (within documents, with the model's
    document masking)."""
    from training.model.layers import mean_token_loss

    return mean_token_loss(model, *model_inputs(model, tokens))


def model_inputs(model, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``mean_token_loss``'s inputs, positions, labels, attention mask and loss mask for rows of ``seq_len + 1``
    ids on the model's device: plain causal, or the documents' (``model.document_eod``)."""
    from training.model.documents import documents

    device = next(model.parameters()).device
    tokens = tokens.to(device=device, dtype=torch.long)
    inputs, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    eod = getattr(model, "document_eod", None)
    if eod is None:
        positions = torch.arange(inputs.shape[1], device=device).unsqueeze(0).expand_as(inputs)
        return inputs, positions, labels, None, None
    docs = documents(inputs, eod)
    return inputs, docs.positions, labels, docs.attention_mask, docs.loss_mask
