"""Which parallel layout a preset should train with, estimated: memory per rank and communication per step.

    python -m benchmarks.layout_plan [configs/gpt-350m.yaml configs/gpt-1b.yaml ...]

prints, for each preset, one 8-GPU node and the 2 × 8 cluster profile, every candidate layout
(tensor-parallel 1 or 2; data parallelism as DDP, megatron's distributed optimizer or FSDP)
with its memory per GPU, the bytes each GPU sends per optimizer step, the time those take on
the interconnect next to the step's compute, and the pick: the layout that fits in memory with
the least communication. Both are estimates from the formulas below; no layout's step is timed,
and the compute column (one measured single-GPU rate) is shown beside them but does not enter
the pick. docs/performance.md quotes the table.

The accounting (bf16 training with fp32 gradients reduced in fp32 and fp32 main weights, as
megatron-core trains on GPUs; ``training/model/step.py``):
- model state per parameter: 2 B weights + 4 B gradients + 12 B fp32 main weight and Adam
  moments = 18 B (megatron's ``theoretical_memory_usage``); the distributed optimizer shards
  the 12 B over data-parallel ranks, FSDP all 18 B (plus two gathered layers in flight).
- activations per layer and micro-batch: 34 · s · b · h bytes (Korthikanti et al. 2022, with
  flash attention: no s² term), divided by TP under sequence parallelism; full recompute keeps
  2 · s · b · h per layer instead.
- communication (ring algorithms, bytes sent per GPU, factor (n−1)/n): DDP all-reduces fp32
  gradients (2 × 4 B per parameter); the distributed optimizer reduce-scatters them and
  all-gathers bf16 weights (4 + 2 B); FSDP gathers bf16 weights in forward and again in
  backward for every micro-batch and reduce-scatters fp32 gradients once a step
  (2 × 2 B × micro-batches + 4 B); tensor parallelism moves 8 activations of s · b · h bf16
  per layer and micro-batch (4 collectives forward, 4 backward).
- time: communication at NVLINK_GBPS inside a node and IB_GBPS per GPU across nodes, not
  overlapped (the worst case); compute from the measured tokens/s of one H200
  (benchmarks/results/gpu-bench_train-2026-12-04.json: 350m 117,985, 1b 50,102 tokens/s).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from training.config import ModelConfig
from training.observe.metrics import non_embedding_params

GPU_MEMORY_GB = 141.0  # one H200
USABLE = 0.85  # of it, left after the CUDA context, the allocator's fragmentation, NCCL buffers
NVLINK_GBPS = 360.0  # achievable bus bandwidth of one H200 over NVLink (data sheet 450 GB/s one way)
IB_GBPS = 45.0  # one 400 Gb/s NIC per GPU, achievable
MEASURED_TOKENS_PER_S = {24 * 1024: 117_985.0, 24 * 2048: 50_102.0}  # (layers × hidden): one H200, bf16, TP=1
STATE_BYTES = {"ddp": (18.0, 0.0), "distributed_optimizer": (6.0, 12.0), "fsdp": (0.0, 18.0)}  # (kept, sharded over DP)


@dataclass(frozen=True)
class Layout:
    tensor_parallel: int
    data_parallel: str  # "ddp", "distributed_optimizer" or "fsdp"
    recompute: str = "none"


@dataclass(frozen=True)
class Estimate:
    layout: Layout
    gpus: int
    memory_gb: float
    comm_gb: float
    comm_s: float
    compute_s: float

    @property
    def fits(self) -> bool:
        return self.memory_gb <= GPU_MEMORY_GB * USABLE

    @property
    def comm_share(self) -> float:
        return self.comm_s / (self.comm_s + self.compute_s)


def parameters(model: ModelConfig, vocab: int, tensor_parallel: int = 1) -> int:
    """Parameters of the whole model (embedding tied with the output layer, vocabulary padded as build_gpt pads it)."""
    padded = math.ceil(vocab / (64 * tensor_parallel)) * 64 * tensor_parallel
    return non_embedding_params(model) + padded * model.hidden_size


def estimate(
    model: ModelConfig, vocab: int, seq: int, micro: int, global_batch: int, layout: Layout, gpus: int, gpus_per_node: int = 8
) -> Estimate:
    tp = layout.tensor_parallel
    dp = gpus // tp
    n = parameters(model, vocab, tp)
    per_rank = n / tp
    kept, sharded = STATE_BYTES[layout.data_parallel]
    state = per_rank * (kept + sharded / dp)
    layer = non_embedding_params(model) / model.num_layers / tp
    if layout.data_parallel == "fsdp":
        state += 2 * layer * 2  # two layers' bf16 weights gathered at a time (the current one, the next prefetched)
    sbh = seq * micro * model.hidden_size
    per_layer = 2 * sbh if layout.recompute == "full" else 34 * sbh / tp
    activations = model.num_layers * per_layer
    micro_batches = global_batch // (micro * dp)
    ring = (dp - 1) / dp
    dp_bytes = {
        "ddp": 8 * per_rank * ring,
        "distributed_optimizer": 6 * per_rank * ring,
        "fsdp": (4 * micro_batches + 4) * per_rank * ring,
    }[layout.data_parallel]
    tp_bytes = 8 * 2 * sbh * (tp - 1) / tp * model.num_layers * micro_batches
    crosses_nodes = gpus > gpus_per_node
    comm_s = dp_bytes / ((IB_GBPS if crosses_nodes else NVLINK_GBPS) * 1e9) + tp_bytes / (NVLINK_GBPS * 1e9)
    rate = MEASURED_TOKENS_PER_S.get(model.num_layers * model.hidden_size)
    if rate is None:
        raise ValueError(f"no measured tokens/s for a {model.num_layers}-layer, {model.hidden_size}-wide model")
    # Tensor parallelism splits each matmul: assume it keeps the GPU as busy (a generous assumption for TP).
    compute_s = global_batch * seq / gpus / rate
    return Estimate(layout, gpus, (state + activations) / 1e9, (dp_bytes + tp_bytes) / 1e9, comm_s, compute_s)


CANDIDATES = [Layout(tp, dp) for tp in (1, 2) for dp in ("ddp", "distributed_optimizer", "fsdp")]


def pick(estimates: list[Estimate]) -> Estimate:
    """The layout that fits with the least communication time; ties go to the less memory."""
    fitting = [e for e in estimates if e.fits]
    if not fitting:
        raise ValueError("no candidate layout fits in memory: add full recompute or more GPUs")
    return min(fitting, key=lambda e: (round(e.comm_s, 3), e.memory_gb))


def table(path: str) -> list[str]:
    from pipeline.config import load_config

    config = load_config(path)
    model, train = config.model, config.train
    args = (model, config.tokenizer.vocab_size, config.data.seq_len, train.micro_batch_size, train.global_batch_size)
    lines = [
        f"### {path}: {parameters(model, config.tokenizer.vocab_size) / 1e9:.2f} B parameters, "
        f"micro-batch {train.micro_batch_size}, global batch {train.global_batch_size} × {config.data.seq_len}",
        "",
        "| GPUs | TP | data parallelism | memory / GPU (GB) | sent / GPU / step (GB) | comm (s) | compute (s) | comm share | |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for gpus in (8, 16):
        estimates = [estimate(*args, layout, gpus) for layout in CANDIDATES]
        chosen = pick(estimates)
        for e in estimates:
            mark = "**chosen**" if e is chosen else ("" if e.fits else "does not fit")
            lines.append(
                f"| {gpus} | {e.layout.tensor_parallel} | {e.layout.data_parallel} | {e.memory_gb:.1f} | {e.comm_gb:.2f} "
                f"| {e.comm_s:.3f} | {e.compute_s:.2f} | {e.comm_share:.1%} | {mark} |"
            )
    return [*lines, ""]


def main(argv: list[str]) -> None:
    for path in argv or ["configs/gpt-350m.yaml", "configs/gpt-1b.yaml"]:
        print("\n".join(table(path)))


if __name__ == "__main__":
    main(sys.argv[1:])
