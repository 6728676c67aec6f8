"""Configuration of model, parallelism, training and evaluation."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum

from common.docfields import documented
from common.settings import as_choice, at_least, choice_problem

TRITON_RMSNORM_MAX_HIDDEN = 65536  # kernels/rmsnorm.py's MAX_HIDDEN (kernels/ imports torch)


class Kernels(StrEnum):
    """``model.kernels``: our Triton kernels where they can run, or their PyTorch references."""

    TRITON = "triton"
    TORCH = "torch"


class BadLossAction(StrEnum):
    """``train.on_bad_loss``: what a non-finite or spiking loss does."""

    STOP = "stop"
    SKIP = "skip"


class Recompute(StrEnum):
    """``train.recompute``: which activations are recomputed in backward instead of kept."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class LrSchedule(StrEnum):
    """``train.lr_schedule``: the learning rate's shape after the linear warm-up (training/schedule.py)."""

    COSINE = "cosine"
    WSD = "wsd"
    LINEAR = "linear"
    INVERSE_SQRT = "inverse_sqrt"
    CONSTANT = "constant"


class DecayShape(StrEnum):
    """``train.decay_shape``: how a WSD run's decay falls from ``lr`` to ``min_lr``."""

    LINEAR = "linear"
    COSINE = "cosine"
    SQRT = "sqrt"


class CompileMode(StrEnum):
    """``train.compile``: torch.compile of the transformer layers and the loss head."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class Precision(StrEnum):
    """``train.precision``: the transformer layers' matmuls."""

    BF16 = "bf16"
    FP8 = "fp8"


FP8_NEEDS = "FP8 needs NVIDIA GPUs of compute capability 8.9 or newer (L4, L40S, H100, H200, B200)"
"""Why ``train.precision: fp8`` is refused where it is (the launch check, each rank)."""


class Fp8Recipe(StrEnum):
    """``train.fp8_recipe``: how FP8's casts are scaled (torchao's recipe names)."""

    TENSORWISE = "tensorwise"
    ROWWISE = "rowwise"


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
    head_dim: int = 0
    """Channels per attention head (0 = hidden_size / num_attention_heads; Qwen3 sets its own)."""
    qkv_bias: bool = False
    """Biases on the query, key and value projections (Qwen2); no other layer has one."""
    qk_norm: bool = False
    """An RMSNorm on every query and key head before RoPE (Qwen3)."""
    norm_eps: float = 1e-5
    """The epsilon of every RMSNorm."""
    rope_scaling_factor: float = 0.0
    """Llama 3's RoPE scaling of long wavelengths by this factor (0 = none; an imported Llama 3.x sets it)."""
    rope_low_freq_factor: float = 1.0
    """Llama 3 RoPE scaling: wavelengths above original_max_positions / this are divided by the factor."""
    rope_high_freq_factor: float = 4.0
    """Llama 3 RoPE scaling: wavelengths below original_max_positions / this are kept; between, blended."""
    rope_original_max_positions: int = 8192
    """Llama 3 RoPE scaling: the context length the model was first trained at."""
    vocab_size: int = 0
    """Embedding rows before tensor-parallel padding (0 = the tokenizer's size; an imported model's own)."""
    kernels: Kernels = Kernels.TRITON
    """Norm, SwiGLU, RoPE and output-layer loss: 'triton' (our kernels where CUDA or the Triton
    interpreter can run them, their PyTorch references elsewhere) or 'torch' (the references)."""

    def __post_init__(self) -> None:
        self.kernels = as_choice(Kernels, self.kernels)

    def problems(self) -> list[str]:
        """Every setting of this section that cannot work, one line each (see common.settings)."""
        out = choice_problem("model.kernels", self.kernels, Kernels)
        for name in ("num_layers", "hidden_size", "num_attention_heads"):
            out += at_least(f"model.{name}", getattr(self, name), 1)
        out += at_least("model.num_query_groups", self.num_query_groups, 0, " (0 = one per attention head)")
        out += at_least("model.ffn_hidden_size", self.ffn_hidden_size, 0, " (0 = 8/3 × hidden_size)")
        out += at_least("model.rotary_base", self.rotary_base, 2, " (typical 10000)")
        out += at_least("model.head_dim", self.head_dim, 0, " (0 = hidden_size / num_attention_heads)")
        out += at_least("model.vocab_size", self.vocab_size, 0, " (0 = the tokenizer's size)")
        out += at_least("model.rope_scaling_factor", self.rope_scaling_factor, 0, " (0 = no scaling)")
        if not 0 < self.norm_eps < 1:
            out.append(f"model.norm_eps is {self.norm_eps}: RMSNorm's epsilon must be between 0 and 1 (typical 1e-5 or 1e-6)")
        if self.rope_scaling_factor and not (0 < self.rope_low_freq_factor < self.rope_high_freq_factor):
            out.append(
                f"model.rope_low_freq_factor={self.rope_low_freq_factor} and model.rope_high_freq_factor="
                f"{self.rope_high_freq_factor}: Llama 3's RoPE scaling needs 0 < low < high (it uses 1 and 4)"
            )
        if self.rope_scaling_factor:
            out += at_least("model.rope_original_max_positions", self.rope_original_max_positions, 1, " (Llama 3 uses 8192)")
        if out:
            return out  # the rules below divide by these
        heads, groups = self.num_attention_heads, self.num_query_groups or self.num_attention_heads
        if self.head_dim:
            if self.head_dim % 2:
                out.append(f"model.head_dim={self.head_dim}: RoPE rotates channel pairs, so it must be even")
        elif self.hidden_size % heads:
            out.append(
                f"model.hidden_size={self.hidden_size} is not divisible by model.num_attention_heads={heads}: "
                "every head gets hidden_size / heads channels"
            )
        elif (self.hidden_size // heads) % 2:
            out.append(
                f"model.hidden_size={self.hidden_size} / model.num_attention_heads={heads} = {self.hidden_size // heads} "
                "channels per head: RoPE rotates channel pairs, so it must be even"
            )
        if heads % groups:
            out.append(
                f"model.num_query_groups={groups} does not divide model.num_attention_heads={heads}: "
                "each key/value head serves the same number of query heads"
            )
        if self.kernels == Kernels.TRITON and self.hidden_size > TRITON_RMSNORM_MAX_HIDDEN:
            out.append(
                f"model.hidden_size is {self.hidden_size}: the Triton RMSNorm handles at most "
                f"{TRITON_RMSNORM_MAX_HIDDEN} channels; set model.kernels: torch"
            )
        return out


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
    fsdp: bool = False
    """Fully sharded data parallelism: weights, gradients and Adam moments all sharded over data-parallel ranks
    (torch FSDP2 through megatron-core's TorchFullyShardedDataParallel), each layer's weights all-gathered just
    before it runs and its gradients reduce-scattered during backward. Same maths as off; needs
    tensor_parallel 1 and pipeline_parallel 1, and excludes distributed_optimizer (FSDP shards that state too)."""
    overlap_grad_reduce: bool = False
    """Reduce gradients during backward, bucket by bucket as they are ready, instead of after it (megatron's DDP:
    needs distributed_optimizer or pipeline_parallel > 1). Same maths as off; the collective share of the step
    time shrinks by what backward hides."""
    overlap_param_gather: bool = False
    """All-gather the updated weights during the next forward, bucket by bucket, instead of at the end of the
    optimizer step (megatron's DDP; needs distributed_optimizer). Same maths as off."""

    def problems(self) -> list[str]:
        """Every setting of this section that cannot work, one line each."""
        out = at_least("parallel.tensor_parallel", self.tensor_parallel, 1)
        out += at_least("parallel.pipeline_parallel", self.pipeline_parallel, 1)
        if self.sequence_parallel and self.tensor_parallel < 2:
            out.append(
                f"parallel.sequence_parallel needs parallel.tensor_parallel ≥ 2 (it is {self.tensor_parallel}): "
                "raise tensor_parallel or set sequence_parallel: false"
            )
        out += at_least("parallel.collective_timeout_s", self.collective_timeout_s, 1, " (typical 60 … 600)")
        out += at_least("parallel.checkpoint_timeout_s", self.checkpoint_timeout_s, 1, " (typical 1800)")
        out += at_least("parallel.stall_timeout_s", self.stall_timeout_s, 0, " (0 = no watchdog)")
        return out + self._sharding_problems()

    def _sharding_problems(self) -> list[str]:
        """FSDP and the overlap switches: where each applies."""
        out = []
        if self.fsdp:
            if self.tensor_parallel != 1:
                out.append(
                    f"parallel.fsdp needs parallel.tensor_parallel 1 (it is {self.tensor_parallel}): FSDP here shards "
                    "whole layers over the data-parallel ranks; set tensor_parallel: 1 or fsdp: false"
                )
            if self.pipeline_parallel != 1:
                out.append(
                    f"parallel.fsdp needs parallel.pipeline_parallel 1 (it is {self.pipeline_parallel}): set "
                    "pipeline_parallel: 1 or fsdp: false"
                )
            if self.distributed_optimizer:
                out.append(
                    "parallel.fsdp and parallel.distributed_optimizer are both on: FSDP already shards the optimizer "
                    "state with the weights; set distributed_optimizer: false (or fsdp: false)"
                )
            for name in ("overlap_grad_reduce", "overlap_param_gather"):
                if getattr(self, name):
                    out.append(
                        f"parallel.{name} does not apply with parallel.fsdp: FSDP2 always gathers each layer's weights "
                        "ahead of it and reduce-scatters its gradients during backward (overlapped on GPU streams); "
                        f"set {name}: false"
                    )
            return out
        if self.overlap_grad_reduce and not (self.distributed_optimizer or self.pipeline_parallel > 1):
            out.append(
                "parallel.overlap_grad_reduce needs megatron's DDP (parallel.distributed_optimizer: true or "
                "pipeline_parallel > 1): the plain data-parallel step all-reduces once after the last backward; "
                "set distributed_optimizer: true or overlap_grad_reduce: false"
            )
        if self.overlap_param_gather and not self.distributed_optimizer:
            out.append(
                "parallel.overlap_param_gather needs parallel.distributed_optimizer: true (only it all-gathers "
                "updated weights); set distributed_optimizer: true or overlap_param_gather: false"
            )
        return out


@documented
@dataclass
class TrainConfig:
    """The optimisation loop and checkpointing."""

    steps: int = 300
    """Optimizer steps (0 = from ``tokens``; set exactly one of the two)."""
    tokens: int = 0
    """The run's budget in training tokens instead of steps (0 = use ``steps``), e.g. 2e9: converted to
    ceil(tokens / (global_batch_size × data.seq_len)) steps."""
    micro_batch_size: int = 8
    """Sequences per rank per forward pass."""
    global_batch_size: int = 16
    """Sequences per optimizer step over all data-parallel ranks (gradient accumulation fills the gap)."""
    lr: float = 2e-3
    """Peak learning rate."""
    min_lr: float = 2e-4
    """Learning rate at the end of the decay (cosine, linear, WSD), and the floor of inverse_sqrt."""
    warmup_steps: int = 20
    """Linear warm-up steps (inverse_sqrt's timescale too)."""
    lr_schedule: LrSchedule = LrSchedule.COSINE
    """After the warm-up: 'cosine' (down to min_lr at the run's end), 'linear' (the same, linearly), 'wsd'
    (warmup-stable-decay: lr until the last ``decay_fraction`` of the steps, then ``decay_shape`` to min_lr;
    ``steps`` does not name a WSD run, so a run still in its stable phase can be extended), 'inverse_sqrt'
    (lr × sqrt(warmup / step), floored at min_lr) or 'constant'."""
    decay_fraction: float = 0.2
    """WSD: the share of the run's steps spent decaying (0 < f ≤ 1)."""
    decay_shape: DecayShape = DecayShape.LINEAR
    """WSD: the decay's shape, 'linear', 'cosine' or 'sqrt' (1 − sqrt: MiniCPM's)."""
    cooldown_from: str = ""
    """Cool a WSD run down: RUN[@STEP], a run's committed checkpoint (latest if no step; its weights,
    optimizer state and data position), from which ``cooldown_steps`` decay to min_lr, in a run of its own
    ('' = off). RUN is its id as `pretrain runs list` shows it."""
    cooldown_steps: int = 0
    """The cooldown's length in steps (with ``cooldown_from``): the run ends at STEP + cooldown_steps (``steps``,
    and a preset's, do not apply to a cooldown)."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 = off)."""
    recompute: Recompute = Recompute.NONE
    """Activation recompute: 'none'; 'selective' (attention recomputed in backward: its
    activations grow with the square of the sequence, its FLOPs do not dominate); 'full' (each
    layer's forward recomputed: least memory, about a third more compute)."""
    compile: CompileMode = CompileMode.AUTO
    """torch.compile each transformer layer and the loss head (training/model/compiling.py): 'auto' (on CUDA;
    off on CPU, where compiling costs more than a short run gains), 'on' (fails where it cannot run) or 'off'.
    Compile time is reported apart from step time; Inductor caches the compiled graphs across runs."""
    precision: Precision = Precision.BF16
    """The transformer layers' matmuls: 'bf16' (bf16 weights and activations with fp32 master weights on GPUs;
    fp32 on CPU) or 'fp8' (their linears' GEMMs in FP8 through torchao's float8 training, the rest as bf16:
    training/model/fp8.py). FP8 needs NVIDIA GPUs of compute capability 8.9 or newer (L4, L40S, H100, H200,
    B200); a run refuses elsewhere before anything starts."""
    fp8_recipe: Fp8Recipe = Fp8Recipe.TENSORWISE
    """How FP8's casts are scaled (with precision 'fp8'): 'tensorwise' (one scale per tensor, e5m2 gradients:
    the fastest GEMMs) or 'rowwise' (a power-of-two scale per row, e4m3 throughout: closer to bf16)."""
    seed: int = 1234
    """Seed of initialisation and data order."""
    checkpoint_every: int = 150
    """Save a checkpoint every N steps (the last step is always saved)."""
    keep_checkpoints: int = 2
    """Committed checkpoints kept per run (older ones are deleted)."""
    keep_every: int = 0
    """Also keep every checkpoint whose step is a multiple of N, whatever ``keep_checkpoints`` says (0 = off):
    the points a WSD run can later be cooled down from."""
    async_checkpoints: bool = True
    """Complete each checkpoint in the background: the step loop stalls only while the state is copied to
    host memory; writing, digests, upload and commit overlap the next steps (one save at a time, the last
    waited for). Off: the step loop waits for the commit. It holds a second copy of the state in host memory."""
    max_restarts: int = 3
    """How often a failed attempt restarts the job's ranks in place (a rank killed or hung: training/restarts.py),
    resuming from the newest committed checkpoint, before the task fails (0 = never). Not a user's error, nor a
    failure at the same place twice: those fail at once. It observes: outside the run id and the task's cache key."""
    keep_local_checkpoints: int = 1
    """Newest committed checkpoints each node keeps on local disk (private staging), so that a restart on the
    same node resumes without downloading (digest-checked first); 0 = none. Outside the run id and the cache key."""
    local_checkpoint_every: int = 0
    """Between the store's checkpoints, also save one every N steps to this node's disk only (0 = off): never
    uploaded, kept as the node's newest copy (``keep_local_checkpoints`` must be >= 1), so that a restart in place
    on this node goes back at most N steps instead of up to ``checkpoint_every`` (multi-level checkpointing, as
    NVIDIA's Resiliency Extension does). A restart elsewhere resumes from the store's newest. Single-node jobs
    only (on several nodes no node holds every rank's files): ignored there. Outside the run id and the cache key."""
    shuffle_window_shards: int = 4
    """Shards whose rows are shuffled together each epoch (shard order is shuffled too); the loader
    holds about twice this many shards in memory."""
    document_masking: bool = False
    """Attend within each document of a packed sequence only, with RoPE positions restarting at each document
    and no loss on predicting a document's first token from the one before (Llama 3, torchtitan); the shards
    already mark documents with end-of-text, so nothing is prepared again (training/model/documents.py)."""
    init_from: str = ""
    """Continue pretraining from a registered model: NAME, NAME:VERSION or NAME:ALIAS
    ('' = from scratch). Its tokenizer is reused and the model section must match it."""
    val_every: int = 100
    """Measure the held-out loss during training (``heldout_loss``) every N steps and at the last step (0 = off):
    forward only, on the same ``val_batches`` global batches of the validation split each time; the curves get
    held-out points. Not the evaluation's ``val_loss``, which reads more rows (``evaluation.max_batches``)."""
    val_batches: int = 2
    """Global batches of the validation split each of those measurements reads."""
    tensorboard: bool = True
    """Also write the per-step metrics as TensorBoard event files to <run>/tensorboard/."""
    peak_flops: float = 0.0
    """Peak FLOP/s of one device for MFU (0 = the GPU's data-sheet figure; on CPU a measured matmul rate)."""
    log_every: int = 10
    """Print a step line every N steps (the first and last steps always print); metrics record every step."""
    profile: str = ""
    """Steps to profile with torch.profiler on every rank, 'FIRST-LAST' or 'STEP' (1-based, e.g. '11-13';
    '' = off): one gzip'd Chrome trace per rank under <run>/tensorboard/plugins/profile/ (Perfetto,
    TensorBoard), and on a GPU a CUDA memory snapshot per rank (pytorch.org/memory_viz)."""
    profile_stacks: bool = False
    """Record Python stacks in the profile (larger traces, more overhead)."""
    straggler_every: int = 10
    """Every N steps the ranks exchange their step times; the slowest rank and its ratio to the median are
    logged (0 = off)."""
    straggler_ratio: float = 1.5
    """A rank whose busy time (step time minus collective waits) exceeds this × the median rank's is slow."""
    straggler_windows: int = 3
    """Warn when the same rank is slow this many exchange windows in a row."""
    loss_spike_factor: float = 4.0
    """A loss above this × the running median of the last 50 accepted steps is a spike (0 = only NaN/Inf
    count as bad); checked from step 20 on."""
    on_bad_loss: BadLossAction = BadLossAction.STOP
    """A NaN/Inf or spiking loss: 'stop' (fail with the step, loss and the batch's shards and rows) or 'skip'
    (drop the batch's update, record the event and go on)."""
    max_skipped_steps: int = 10
    """With on_bad_loss 'skip', training stops anyway once this many steps were skipped."""

    def __post_init__(self) -> None:
        self.recompute = as_choice(Recompute, self.recompute)
        self.compile = as_choice(CompileMode, self.compile)
        self.lr_schedule = as_choice(LrSchedule, self.lr_schedule)
        self.decay_shape = as_choice(DecayShape, self.decay_shape)
        self.on_bad_loss = as_choice(BadLossAction, self.on_bad_loss)

    def profile_window(self) -> tuple[int, int] | None:
        """``profile`` as (first, last) step, or None when off or unreadable (see ``problems``)."""
        text = self.profile.strip()
        if not text:
            return None
        first, dash, last = text.partition("-")
        try:
            window = int(first), int(last if dash else first)
        except ValueError:
            return None
        return window if 1 <= window[0] <= window[1] else None

    def problems(self) -> list[str]:
        """Every setting of this section that cannot work, one line each."""
        out = at_least("train.steps", self.steps, 0, " (0 = from train.tokens)")
        out += at_least("train.tokens", self.tokens, 0, " (0 = use train.steps)")
        if self.steps > 0 and self.tokens > 0:
            out.append(
                f"train.steps={self.steps} and train.tokens={self.tokens} are both set: give the budget one way, "
                "steps or tokens, and set the other to 0"
            )
        elif self.steps == 0 and self.tokens == 0 and not self.cooldown_from:
            out.append("train.steps and train.tokens are both 0: give the run's budget in steps or in tokens")
        out += at_least("train.micro_batch_size", self.micro_batch_size, 1)
        out += at_least("train.global_batch_size", self.global_batch_size, 1)
        if not out and self.global_batch_size % self.micro_batch_size:
            out.append(
                f"train.global_batch_size={self.global_batch_size} is not a multiple of "
                f"train.micro_batch_size={self.micro_batch_size}: gradient accumulation runs whole micro-batches"
            )
        if not self.lr > 0:
            out.append(f"train.lr is {self.lr}: must be > 0 (typical 1e-4 … 3e-3)")
        elif not 0 <= self.min_lr <= self.lr:
            out.append(f"train.min_lr is {self.min_lr}: must be in [0, train.lr = {self.lr}] (typical lr / 10)")
        out += at_least("train.warmup_steps", self.warmup_steps, 0)
        out += self.schedule_problems()
        out += at_least("train.weight_decay", self.weight_decay, 0, " (typical 0.1)")
        out += at_least("train.grad_clip", self.grad_clip, 0, " (0 = off; typical 1.0)")
        out += choice_problem("train.recompute", self.recompute, Recompute)
        out += choice_problem("train.compile", self.compile, CompileMode)
        out += choice_problem("train.precision", self.precision, Precision)
        out += choice_problem("train.fp8_recipe", self.fp8_recipe, Fp8Recipe)
        out += at_least("train.seed", self.seed, 0)
        out += at_least("train.checkpoint_every", self.checkpoint_every, 1, " (the last step is always saved)")
        out += at_least("train.keep_every", self.keep_every, 0, " (0 = off)")
        out += at_least("train.max_restarts", self.max_restarts, 0, " (0 = never restart in place)")
        out += at_least("train.keep_local_checkpoints", self.keep_local_checkpoints, 0, " (0 = download to resume)")
        out += at_least("train.local_checkpoint_every", self.local_checkpoint_every, 0, " (0 = off)")
        if self.local_checkpoint_every > 0 and self.keep_local_checkpoints < 1:
            out.append(
                f"train.local_checkpoint_every={self.local_checkpoint_every} saves checkpoints that only this node keeps, "
                "but train.keep_local_checkpoints=0 keeps none: set keep_local_checkpoints >= 1 or local_checkpoint_every=0"
            )
        out += at_least("train.shuffle_window_shards", self.shuffle_window_shards, 1)
        out += at_least("train.peak_flops", self.peak_flops, 0, " (0 = the device's data-sheet figure)")
        out += at_least("train.log_every", self.log_every, 1)
        out += at_least("train.val_every", self.val_every, 0, " (0 = off)")
        out += at_least("train.val_batches", self.val_batches, 1)
        if self.profile.strip() and self.profile_window() is None:
            out.append(f"train.profile is {self.profile!r}: give steps as 'FIRST-LAST' or 'STEP' (1-based), e.g. '11-13'")
        elif self.profile_window() and self.profile_window()[0] > self.steps:
            out.append(f"train.profile is {self.profile!r}: it starts after the last step (train.steps={self.steps})")
        out += at_least("train.straggler_every", self.straggler_every, 0, " (0 = off)")
        if not self.straggler_ratio > 1:
            out.append(f"train.straggler_ratio is {self.straggler_ratio}: must be > 1 (typical 1.2 … 2)")
        out += at_least("train.straggler_windows", self.straggler_windows, 1)
        if self.loss_spike_factor != 0 and not self.loss_spike_factor > 1:
            out.append(f"train.loss_spike_factor is {self.loss_spike_factor}: must be > 1 or 0 = off (typical 3 … 5)")
        out += choice_problem("train.on_bad_loss", self.on_bad_loss, BadLossAction)
        out += at_least("train.max_skipped_steps", self.max_skipped_steps, 0)
        return out

    def schedule_problems(self) -> list[str]:
        """The learning-rate schedule's settings, and a cooldown's."""
        out = choice_problem("train.lr_schedule", self.lr_schedule, LrSchedule)
        out += choice_problem("train.decay_shape", self.decay_shape, DecayShape)
        wsd = self.lr_schedule == LrSchedule.WSD
        if wsd and not 0 < self.decay_fraction <= 1:
            out.append(
                f"train.decay_fraction is {self.decay_fraction}: must be in (0, 1], the share of the steps spent "
                "decaying (typical 0.1 … 0.2)"
            )
        elif wsd and not self.cooldown_from and self.steps > 0 and not out:
            decay = self.decay_steps()
            if decay > self.steps - self.warmup_steps:
                out.append(
                    f"train.decay_fraction={self.decay_fraction} makes a decay of {decay} steps, longer than the "
                    f"{self.steps - self.warmup_steps} steps after train.warmup_steps={self.warmup_steps}: lower one of them"
                )
        if self.cooldown_from:
            if not wsd:
                out.append(
                    f"train.cooldown_from is {self.cooldown_from!r} but train.lr_schedule is {self.lr_schedule}: "
                    "a cooldown continues a WSD run and decays as one; set lr_schedule: wsd"
                )
            if cooldown_point(self.cooldown_from) is None:
                out.append(f"train.cooldown_from is {self.cooldown_from!r}: write RUN or RUN@STEP, e.g. 3f2a9c0d@400")
            if self.cooldown_steps < 1:
                out.append(f"train.cooldown_steps is {self.cooldown_steps}: a cooldown needs its length in steps (≥ 1)")
            if self.tokens > 0:
                out.append("train.tokens is set with train.cooldown_from: a cooldown lasts train.cooldown_steps; set tokens to 0")
        elif self.cooldown_steps:
            out.append(
                f"train.cooldown_steps is {self.cooldown_steps} without train.cooldown_from: name a run to cool down, or 0"
            )
        return out

    def decay_steps(self) -> int:
        """A WSD run's decay length in steps: a cooldown's ``cooldown_steps``, else ``decay_fraction`` of its steps
        (at least one)."""
        if self.cooldown_from:
            return self.cooldown_steps
        return max(1, round(self.decay_fraction * self.steps))

    def steps_for(self, seq_len: int) -> int:
        """The optimizer steps of the budget: ``steps``, or ``tokens`` in global batches of ``seq_len``-token
        sequences (rounded up). A cooldown's are known once its start is (``training.cooldown``)."""
        if self.tokens > 0:
            return -(-self.tokens // (self.global_batch_size * seq_len))
        return self.steps

    def identity(self) -> TrainConfig:
        """This config with the settings that only observe a run (console, profiles, straggler checks,
        TensorBoard, the MFU peak) and the reactions to a bad loss at their defaults: what names the run,
        so turning on a profile, or following a stopped run's advice to set on_bad_loss: skip, resumes
        the same run from its last checkpoint instead of starting another."""
        observing = {name: getattr(TrainConfig, name) for name in OBSERVING_FIELDS}
        if self.lr_schedule == LrSchedule.WSD:
            # A WSD run's length is not its identity: extended while it is still in its stable phase, it
            # continues (its trained steps keep their learning rates; checked at resume).
            observing |= {"steps": TrainConfig.steps, "tokens": TrainConfig.tokens}
        return replace(self, **observing)


OBSERVING_FIELDS = (
    "val_every",
    "val_batches",
    "tensorboard",
    "peak_flops",
    "log_every",
    "profile",
    "profile_stacks",
    "straggler_every",
    "straggler_ratio",
    "straggler_windows",
    # Until a bad loss comes they change nothing, and the steps before it trained the same.
    "loss_spike_factor",
    "on_bad_loss",
    "max_skipped_steps",
    # When a checkpoint completes, not what it holds: a run saved either way resumes the same.
    "async_checkpoints",
    # How a failure is recovered, not what is trained: a restart resumes the same run.
    "max_restarts",
    "keep_local_checkpoints",
    "local_checkpoint_every",
)


def cooldown_point(text: str) -> tuple[str, int] | None:
    """``train.cooldown_from`` as (run id, step; 0 = its latest committed checkpoint), or None if unreadable.
    The run may be written as its id or as runs/<id>."""
    run, at, step = text.strip().removeprefix("runs/").partition("@")
    if not run or "/" in run or (at and not (step.isdigit() and int(step) > 0)):
        return None
    return run, int(step) if at else 0


def layout_problems(model: ModelConfig, parallel: ParallelConfig) -> list[str]:
    """How the model splits over the ranks: heads and key/value heads over tensor-parallel ranks,
    layers over pipeline stages (sizes below 1 are the sections' own problems)."""
    tp, pp = parallel.tensor_parallel, parallel.pipeline_parallel
    if tp < 1 or pp < 1 or model.num_attention_heads < 1 or model.num_layers < 1 or model.num_query_groups < 0:
        return []
    out = []
    heads, groups = model.num_attention_heads, model.num_query_groups or model.num_attention_heads
    if heads % tp:
        out.append(
            f"model.num_attention_heads={heads} is not divisible by parallel.tensor_parallel={tp}: "
            "each tensor-parallel rank holds the same number of heads"
        )
    if groups % tp and model.num_query_groups:
        out.append(
            f"model.num_query_groups={groups} is not divisible by parallel.tensor_parallel={tp}: "
            "each tensor-parallel rank holds the same number of key/value heads"
        )
    if model.num_layers % pp:
        out.append(
            f"model.num_layers={model.num_layers} is not divisible by parallel.pipeline_parallel={pp}: "
            "every pipeline stage holds the same number of layers"
        )
    return out


def world_problems(parallel: ParallelConfig, world_size: int, where: str = "") -> list[str]:
    """The ``world_size`` ranks (``where``: where that number comes from) split into whole
    tensor × pipeline groups."""
    tp, pp = parallel.tensor_parallel, parallel.pipeline_parallel
    if tp < 1 or pp < 1 or world_size % (tp * pp) == 0:
        return []
    return [
        f"parallel.tensor_parallel={tp} × parallel.pipeline_parallel={pp} = {tp * pp} does not divide the "
        f"{world_size} ranks of the train task: choose sizes whose product divides {world_size}{where}"
    ]


def batch_problems(train: TrainConfig, data_parallel: int, where: str = "") -> list[str]:
    """The global batch splits into whole micro-batches on each of ``data_parallel`` ranks
    (``where``: where that number comes from)."""
    if train.micro_batch_size < 1 or train.global_batch_size < 1 or data_parallel < 1:
        return []
    per_step = train.micro_batch_size * data_parallel
    if train.global_batch_size % per_step == 0:
        return []
    lower = per_step * max(1, train.global_batch_size // per_step)
    return [
        f"train.global_batch_size={train.global_batch_size} is not a multiple of train.micro_batch_size × "
        f"data-parallel size = {train.micro_batch_size} × {data_parallel} = {per_step}: use e.g. {lower} "
        f"or {lower + per_step}, or a smaller micro_batch_size{where}"
    ]


def head_size(config: ModelConfig) -> int:
    """Channels per attention head."""
    return config.head_dim or config.hidden_size // config.num_attention_heads


def ffn_size(config: ModelConfig) -> int:
    if config.ffn_hidden_size:
        return config.ffn_hidden_size
    return int(math.ceil(8 * config.hidden_size / 3 / 64) * 64)
