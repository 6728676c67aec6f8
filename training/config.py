"""Configuration of model, parallelism, training and evaluation."""

from __future__ import annotations

from dataclasses import dataclass

from common.docfields import documented


@documented
@dataclass
class ModelConfig:
    """A decoder-only GPT (RMSNorm, SwiGLU, RoPE) built with megatron-core."""

    num_layers: int = 4
    """Transformer layers."""
    hidden_size: int = 128
    """Model width."""
    num_attention_heads: int = 4
    """Attention heads (must divide hidden_size and be divisible by tensor_parallel)."""
    num_query_groups: int = 0
    """Key/value heads for grouped-query attention (0 = one per attention head)."""
    ffn_hidden_size: int = 0
    """MLP width (0 = 8/3 × hidden, rounded up to a multiple of 64)."""
    tied_embeddings: bool = True
    """Share the input embedding with the output layer."""
    rotary_base: int = 10000
    """RoPE base frequency."""
    kernels: str = "triton"
    """Norm, SwiGLU, RoPE and output-layer loss: 'triton' (our kernels where CUDA or the Triton
    interpreter can run them, their PyTorch references elsewhere) or 'torch' (the references)."""


@documented
@dataclass
class ParallelConfig:
    """How ranks split the model; the data-parallel size is what is left of the world."""

    tensor_parallel: int = 2
    """Tensor-parallel size (splits attention heads and MLP columns across ranks)."""
    pipeline_parallel: int = 1
    """Pipeline-parallel size: consecutive layers split into this many stages (must divide model.num_layers),
    run with megatron's 1F1B schedule over the step's micro-batches (global ÷ (micro × data-parallel) of them)."""
    sequence_parallel: bool = False
    """Split the sequence across tensor-parallel ranks outside attention and MLP (needs tensor_parallel ≥ 2)."""
    collective_timeout_s: int = 60
    """Seconds a collective waits for a dead or stuck rank before training fails with an error saying so."""
    checkpoint_timeout_s: int = 1800
    """Seconds ranks wait for each other while a checkpoint is uploaded or downloaded (large ones take long)."""
    stall_timeout_s: int = 600
    """Seconds one training step may take before the watchdog declares the rank stuck, prints its stacks
    and ends it (0 = no watchdog); checkpoint saves and loads get checkpoint_timeout_s instead."""
    distributed_optimizer: bool = False
    """Shard the optimizer state (fp32 main weights, Adam moments) over data-parallel ranks: megatron's DDP with
    reduce-scatter of gradients and all-gather of weights, and its distributed optimizer. Same maths as off."""


@documented
@dataclass
class TrainConfig:
    """The optimisation loop and checkpointing."""

    steps: int = 300
    """Optimizer steps."""
    micro_batch_size: int = 8
    """Sequences per rank per forward pass."""
    global_batch_size: int = 16
    """Sequences per optimizer step over all data-parallel ranks (gradient accumulation fills the gap)."""
    lr: float = 2e-3
    """Peak learning rate."""
    min_lr: float = 2e-4
    """Learning rate at the end of the cosine decay."""
    warmup_steps: int = 20
    """Linear warm-up steps."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 = off)."""
    recompute: str = "none"
    """Activation recompute: 'none'; 'selective' (attention recomputed in backward: its
    activations grow with the square of the sequence, its FLOPs do not dominate); 'full' (each
    layer's forward recomputed: least memory, about a third more compute)."""
    seed: int = 1234
    """Seed of initialisation and data order."""
    checkpoint_every: int = 150
    """Save a checkpoint every N steps (the last step is always saved)."""
    keep_checkpoints: int = 2
    """Committed checkpoints kept per run (older ones are deleted)."""
    shuffle_window_shards: int = 4
    """Shards whose rows are shuffled together each epoch (shard order is shuffled too); the loader
    holds about twice this many shards in memory."""
    init_from: str = ""
    """Continue pretraining from a registered model: NAME, NAME:VERSION or NAME:ALIAS
    ('' = from scratch). Its tokenizer is reused and the model section must match it."""
    tensorboard: bool = True
    """Also write the per-step metrics as TensorBoard event files to <run>/tensorboard/."""
    peak_flops: float = 0.0
    """Peak FLOP/s of one device for MFU (0 = the GPU's data-sheet figure; on CPU a measured matmul rate)."""


@documented
@dataclass
class EvalConfig:
    """Held-out evaluation."""

    batch_size: int = 16
    """Validation sequences per forward pass."""
    max_batches: int = 16
    """Batches evaluated at most (0 = the whole validation split)."""
    sample_tokens: int = 48
    """Tokens generated from the prompt (greedily, and sampled) for the model card."""
    prompt: str = "def main():\n"
    """Prompt of the samples."""
    temperature: float = 0.8
    """Temperature of the sampled (non-greedy) continuation."""
    seed: int = 0
    """Seed of the sampled continuation: the same checkpoint gives the same text."""
