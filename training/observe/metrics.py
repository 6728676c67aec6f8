"""Per-step training metrics: throughput, model FLOP/s, MFU, memory, data wait; JSONL and TensorBoard.

Model FLOPs per token (forward + backward), as in Megatron-LM and PaLM (appendix B):

    flops_per_token = 6·N + 12·L·h·s

- ``6·N``: each non-embedding weight does one multiply-add (2 FLOPs) per token forward and
  two backward (input and weight gradients). N counts the transformer layers and the final
  norm, not the token embedding (a lookup) nor the output projection: the logits matmul
  (6·h·V per token) is left out, so for small models with a large vocabulary MFU is a
  conservative figure.
- ``12·L·h·s``: attention scores QKᵀ and the weighted sum AV, 2·2·s·h FLOPs per token per
  layer forward, ×3 with backward; the causal mask is not credited (PaLM's convention).

Recomputation is not counted: this is *model* FLOPs utilisation, not hardware FLOPs.
MFU = achieved model FLOP/s over all ranks / (ranks × peak FLOP/s of one device). The peak is
``TrainConfig.peak_flops`` when set, else the GPU's dense bf16/fp32 figure from ``PEAK_FLOPS``
by device name, else on CPU an estimate measured with an fp32 matmul on this process's threads
(an unknown GPU gets null MFU); each record names its source in ``peak_flops_source``.
"""

from __future__ import annotations

import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from common.contracts import tensorboard_prefix
from training.callbacks import Record, StepCallback
from training.config import ModelConfig, TrainConfig, head_size
from training.observe.timing import BREAKDOWN_KEYS

# Dense (no sparsity) tensor-core peaks from NVIDIA's data sheets, per GPU: (bf16, fp32).
# Matched in order against torch.cuda.get_device_name(): the more specific names first.
PEAK_FLOPS: list[tuple[str, float, float]] = [
    ("H200", 989e12, 67e12),
    ("H100 PCIe", 756e12, 51e12),
    ("H100 NVL", 835e12, 60e12),
    ("H100", 989e12, 67e12),  # SXM ("NVIDIA H100 80GB HBM3")
    ("A100", 312e12, 19.5e12),
    ("L40S", 362e12, 91.6e12),
    ("L4", 121e12, 30.3e12),
]


# Record keys logged to TensorBoard, as ``train/<key>``: each step's breakdown (a stacked view of
# where the time went), and at each straggler exchange the slowest rank's ratio.
TENSORBOARD_TAGS = (
    "loss",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "model_flops_per_s",
    "mfu",
    "peak_memory_mib",
    "data_wait_fraction",
    "step_time_s",
    *BREAKDOWN_KEYS,
    "slowest_ratio",
)


def non_embedding_params(cfg: ModelConfig) -> int:
    """Weights of the transformer layers and the final norm (what build_gpt makes, TP-independent)."""
    from training.config import ffn_size, head_size

    h, d = cfg.hidden_size, head_size(cfg)
    q, kv = cfg.num_attention_heads * d, (cfg.num_query_groups or cfg.num_attention_heads) * d
    attention = h * (q + 2 * kv) + q * h  # fused QKV, output projection
    attention += (q + 2 * kv if cfg.qkv_bias else 0) + (2 * d if cfg.qk_norm else 0)  # Qwen2's biases, Qwen3's norms
    mlp = h * 2 * ffn_size(cfg) + ffn_size(cfg) * h  # fc1 = [gate | up], fc2
    return cfg.num_layers * (attention + mlp + 2 * h) + h  # + two norms per layer, the final norm


def flops_per_token(n_non_embedding: int, num_layers: int, hidden: int, seq_len: int) -> float:
    """Model FLOPs of one trained token, forward + backward (see the module docstring)."""
    return 6.0 * n_non_embedding + 12.0 * num_layers * hidden * seq_len


def table_peak(device_name: str, dtype: torch.dtype) -> float | None:
    """The data-sheet peak of a known GPU, or None."""
    for name, bf16, fp32 in PEAK_FLOPS:
        if name.lower() in device_name.lower():
            return bf16 if dtype in (torch.bfloat16, torch.float16) else fp32
    return None


def measured_cpu_peak(size: int = 512, repeats: int = 8) -> float:
    """FLOP/s of a square fp32 matmul on this process's threads: the CPU's practical peak."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)  # first call allocates and warms the BLAS threads
    start = time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b)
    return 2.0 * size**3 * repeats / (time.perf_counter() - start)


def device_peak(device: torch.device, dtype: torch.dtype, override: float = 0.0) -> tuple[float, str]:
    """Peak FLOP/s of one device (0: unknown, MFU is then null) and where the figure comes from."""
    if override > 0:
        return override, "config"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = table_peak(name, dtype)
        if peak is not None:
            return peak, f"table: {name} {str(dtype).removeprefix('torch.')}"
        return 0.0, f"unknown GPU {name!r}: set train.peak_flops for MFU"
    return measured_cpu_peak(), "measured: fp32 matmul on this process's threads"


def mfu(model_flops_per_s: float, peak_per_device: float, devices: int) -> float:
    return model_flops_per_s / (peak_per_device * devices)


def peak_memory_mib(device: torch.device) -> float:
    """GPU: the most memory torch allocated; CPU: the process's maximum resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class StepMetrics(StepCallback):
    """Adds the derived figures to each step's record; on rank 0 also logs them to TensorBoard.

    TensorBoard writes into a local folder (the store may be S3); ``upload`` copies its event
    files to ``<run>/tensorboard/`` after each checkpoint, once its step is logged, so the store
    holds exactly the steps of the last committed checkpoint. A resumed run adds a new event file beside them.
    """

    def __init__(
        self,
        model_cfg: ModelConfig,
        seq_len: int,
        tokens_per_step: int,
        world_size: int,
        device: torch.device,
        dtype: torch.dtype,
        *,
        peak_override: float = 0.0,
        store=None,
        run_prefix: str = "",
        rank0: bool = True,
        tensorboard: bool = True,
    ) -> None:
        n = non_embedding_params(model_cfg)
        # The attention scores' term runs over the query width: heads × head size (Qwen3's differs from hidden).
        width = model_cfg.num_attention_heads * head_size(model_cfg)
        self.flops_per_token = flops_per_token(n, model_cfg.num_layers, width, seq_len)
        self.tokens_per_step, self.world_size, self.device = tokens_per_step, world_size, device
        self.rank0, self.store, self.run_prefix = rank0, store, run_prefix
        self.peak, self.peak_source = device_peak(device, dtype, peak_override) if rank0 else (0.0, "")
        self.tb_dir = Path(tempfile.mkdtemp(prefix="pretrain-tb-")) if rank0 and tensorboard else None
        self._writer = None
        if self.tb_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.tb_dir))

    @classmethod
    def for_training(
        cls,
        model_cfg: ModelConfig,
        cfg: TrainConfig,
        seq_len: int,
        world_size: int,
        param: torch.Tensor,
        store,
        run_prefix: str,
        rank0: bool,
    ) -> StepMetrics:
        """The meter of a training run; ``param`` is any model parameter (its device and dtype)."""
        tokens_per_step = cfg.global_batch_size * seq_len
        return cls(
            model_cfg,
            seq_len,
            tokens_per_step,
            world_size,
            param.device,
            param.dtype,
            peak_override=cfg.peak_flops,
            store=store,
            run_prefix=run_prefix,
            rank0=rank0,
            tensorboard=cfg.tensorboard,
        )

    def after_step(self, record: Record) -> None:
        record |= self.measure(record, record["step_time_s"], record["data_wait_s"])

    def on_record(self, record: Record) -> None:
        self.log(record)

    def on_save(self, step: int) -> None:
        self.upload()  # the event files, with this step's final record

    def measure(self, record: dict[str, Any], step_s: float, data_wait_s: float) -> dict[str, Any]:
        """The derived figures of a step (``record`` holds step, loss, lr, grad_norm) from its training
        time ``step_s``. A checkpoint save then adds its seconds to the record's ``step_time_s`` and
        ``time_checkpoint_s``, not to the throughput: tokens/s and MFU are those of the training.
        ``log`` writes the record to TensorBoard once it is final."""
        flops_s = self.flops_per_token * self.tokens_per_step / step_s
        extra = {
            "step_time_s": step_s,
            "model_flops_per_s": flops_s,
            "mfu": mfu(flops_s, self.peak, self.world_size) if self.peak else None,
            "peak_flops": self.peak,
            "peak_flops_source": self.peak_source,
            "peak_memory_mib": peak_memory_mib(self.device),
            "data_wait_fraction": min(1.0, data_wait_s / step_s),
        }
        return extra

    def log(self, record: dict[str, Any]) -> None:
        """Write a step's final record to TensorBoard (rank 0; the tags of ``TENSORBOARD_TAGS`` it has)."""
        if self._writer is None:
            return
        for key in TENSORBOARD_TAGS:
            if record.get(key) is not None:
                self._writer.add_scalar(f"train/{key}", record[key], record["step"])
        if record.get("heldout_loss") is not None:  # the Validator's held-out points (training.validator)
            self._writer.add_scalar("heldout/loss", record["heldout_loss"], record["step"])

    def upload(self) -> None:
        """Copy the TensorBoard event files to the store (rank 0; others return at once)."""
        if self._writer is None or self.store is None:
            return
        self._writer.flush()
        for path in sorted(self.tb_dir.iterdir()):
            self.store.put_file(f"{tensorboard_prefix(self.run_prefix)}/{path.name}", path)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            shutil.rmtree(self.tb_dir, ignore_errors=True)
            self._writer = None
