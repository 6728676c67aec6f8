"""The GPT model on megatron-core: built from ModelConfig for a parallel layout (``training.distributed`` sets up its groups)."""

from __future__ import annotations

import functools
import importlib.util
import math

import torch

from common.errors import ConfigError
from training.config import ModelConfig, ParallelConfig, Recompute, ffn_size
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
):
    """A megatron-core GPTModel for this rank: with ``pipeline_parallel`` > 1, this rank's stage
    (its layers; the embedding on the first stage, the final norm and output on the last).
    megatron's groups must be initialised with the same sizes. With ``init_seed`` the CPU
    initialisation is the same whatever the parallel layout (see ``layers.py``). ``recompute``
    is ``TrainConfig.recompute``. ``document_eod``: the end-of-text id of document masking
    (``training.model.documents``; None = off), which ``mean_loss`` reads from the model."""
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
    install_rotary()
    vocab = _padded_vocab(vocab_size, tensor_parallel)
    model = _gpt_class()(
        config=transformer,
        transformer_layer_spec=gpt_block_spec(config.num_layers // pipeline_parallel),
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        vocab_size=vocab,
        max_sequence_length=seq_len,
        share_embeddings_and_output_weights=config.tied_embeddings,
        position_embedding_type="rope",
        rotary_base=config.rotary_base,
    )
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


def transformer_config(config: ModelConfig, parallel: ParallelConfig, recompute: str):
    """megatron's TransformerConfig of our GPT (RMSNorm, SwiGLU, RoPE, no biases or dropout) on this machine:
    bf16 on GPUs, fp32 on CPU."""
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
