"""Training throughput of our megatron-core GPT against the strongest plain-PyTorch GPT of the same
parameter count, and of the data loader against what training consumes, measured in the same run.

(a) Four variants, same shape, batch, dtype (fp32 on CPU, bf16 on CUDA), AdamW hyperparameters
    (lr 1e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on matrices only) and global-norm clip 1.0;
    every step reads the loss and the gradient norm back, as a trainer logging them does:
    - ``ours``: the trainer's own single-stage step (``training.model.step.build_step`` at TP=PP=1: megatron's
      GPT, ``LocalStep`` with torch's fused AdamW and its clipping) with ``train.compile: on``: each transformer
      layer and the loss head compiled (``training/model/compiling.py``), ``model.kernels: triton``, which runs
      our kernels only where they can run (CUDA, or ``TRITON_INTERPRET=1``; on a CPU the PyTorch references,
      ``kernels_run`` in the JSON says which ran). The interpreter is never timed.
    - ``ours_eager``: the same with ``train.compile: off``.
    - ``plain_compiled``: ``PlainGPT`` below (``F.rms_norm``, causal SDPA with native GQA, RoPE from
      cos/sin tables built once in the compute dtype, SwiGLU, tied embeddings), each block and the
      head ``torch.compile``d (default mode; per block, as torchtitan does, so a 24-layer model
      compiles one block), the trainer's fused AdamW (``training.model.step.adamw``), torch's
      ``clip_grad_norm_``. Compile time is excluded from the step times and reported (``compile_s``).
    - ``plain_eager``: the same model and optimizer, not compiled: shows what compiling gains.
    - ``ours_masked``: ``ours`` with ``train.document_masking`` (training/model/documents.py: block-diagonal
      causal SDPA, positions restarting per document, the masked loss): its cost against ``ours`` is
      ``masked_vs_unmasked``. Every variant trains the same rows, packed documents whose lengths are drawn
      from an exponential distribution of mean seq/2 (two documents a row on average, ``documents_per_row``).
    - ``ours_fp8`` (with ``--fp8 RECIPE``): ``ours`` with ``train.precision: fp8`` under that recipe (the
      transformer layers' linears in FP8, training/model/fp8.py): ``fp8_vs_bf16`` is its speed over ``ours``.
      On a GPU without FP8 GEMMs (compute capability < 8.9) the run refuses with one line before it builds
      anything; on a CPU the same casts and ``torch._scaled_mm`` run (the dry run: figures that mean nothing).
    The parameter counts are asserted equal. Steps alternate round-robin between the variants (the
    order rotates every step) for ``--repeats`` repeats of ``--steps`` steps after ``--warmup``
    warm-up steps each; tokens/s comes from the median step time.
(b) loader: the training loader of ``training/data.py`` reading the shards of a dataset prepared in a
    temporary store by ``data_prep.prepare.prepare_dataset``, one pass, nothing else running.
(c) on CUDA (the default when available): bf16, the gpt-350m shape (or ``--size 1b``, configs/gpt-1b.yaml's
    shape at TP=1 without recompute), model TFLOP/s and MFU against the device's data-sheet peak
    (``training/observe/metrics.py``). ``--profile`` profiles two steps each of ``ours`` and ``plain_compiled``
    with torch.profiler and groups the self time (CUDA kernels on a GPU, CPU ops on a CPU) into attention,
    matmul, norm, rope, activation, loss, optimizer, compiled (inductor-fused), fp8_cast (FP8's scaling and casts),
    copy (layout changes and copies) and other, with the launches per step (with ``--fp8``, ``ours_fp8`` too).
(e) the step loop's stall per checkpoint: ``benchmarks/bench_checkpoint.py`` (a 60 M-parameter model, its
    weights and AdamW moments saved to SeaweedFS S3), asynchronous against synchronous, the same state, rotated;
    its ``async_stall_vs_sync_save`` (goal ≤ 0.15) joins "ratios" and "spread". ``--no-checkpoint`` skips it.
(d) the loader at its real job: ``benchmarks/bench_loader.py`` (two data-parallel ranks, cold, from the
    SeaweedFS S3 server, a 300 MB gpt-1b-shaped dataset) against one 8-GPU node's demand; on a GPU the
    demand is this run's own tokens/s, elsewhere bench_loader's own measured CPU step. ``--loader-s3-mb 0`` skips it.

Prints human-readable lines, then one JSON object as the last line:
  ours, ours_eager, plain_compiled, plain_eager
                               tokens_per_s (median step of all repeats), step_ms, best_tokens_per_s
                               (fastest step), tokens_per_s_repeats (per repeat) with tokens_per_s_min/max,
                               first_step_s, parameters, model_tflops_per_s, mfu; on CUDA step_peak_gib: the
                               most a step allocated above what was allocated when it began (activations,
                               gradients, workspaces: the weights and optimizer state, resident, not counted)
  memory                       on CUDA: step_peak_gib ratios (> 1: the first named needs more), ours_vs_plain_compiled
                               and, with --fp8, fp8_vs_bf16
  plain                        = plain_compiled (before issue 14 it was an eager, unfused model)
  ratios, spread               medians and [min, max] of per-repeat ratios (> 1: ours faster; each the
                               median of the repeat's paired step-time ratios, see repeat_ratios):
                               ours_vs_plain_compiled (goal ≥ 1.0 at ≥ 5M parameters, issue 31),
                               ours_eager_vs_plain_eager, ours_vs_plain_eager, ours_compile_speedup (ours over ours_eager),
                               with --fp8 fp8_vs_bf16 (ours_fp8 over ours; goal ≥ 1.15 at 1b, issue 52) and
                               ours_fp8_vs_plain_compiled
  plain_compile_speedup        plain_compiled over plain_eager: median, min, max of the per-repeat ratios
  ratio_ours_vs_plain          ours over plain = plain_compiled, from the median step times (the ratios
                               above are the better figure); ratio_ours_vs_plain_best from the fastest steps
  kernels                      "triton": the model.kernels of ours and ours_eager
  compile_s                    the first step's excess over a timed one, for ours and plain_compiled: compile
                               time, cold or warm as Inductor's cache (TORCHINDUCTOR_CACHE_DIR) finds it
  steps                        timed steps per repeat per variant (before issue 14: per model, one repeat)
  loader                       tokens_per_s, seconds, rows (or "skipped" with the reason)
  ratio_loader_vs_consumption  loader tokens/s over ours (a single-rank pass over local files: not a
                               measure of feeding GPUs from S3; kept for continuity)
  loader_s3                    (d) benchmarks/bench_loader.py's result: two ranks, cold, from SeaweedFS S3;
                               its ratios (loader_s3_vs_node_demand, goal >= 10) join "ratios" and "spread"
  checkpoint                   (e) bench_checkpoint.py's result: sync_save_s, async_stall_s, async_complete_s
  machine                      CPU, cores, threads, device, versions (benchmarks/machine_info.py)

  python benchmarks/bench_train.py [--device cpu|cuda] [--size tiny|small|350m|1b] [--repeats 3]
                                   [--steps N] [--warmup N] [--threads N] [--profile] [--no-loader] [--no-checkpoint]
                                   [--loader-s3-mb MB] [--fp8 tensorwise|rowwise]
  --size tiny is the smoke run (seconds, plus the compile).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import re
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from machine_info import machine, ratio_keys, require  # benchmarks/ (the script's folder)
from torch import nn

from training.config import ModelConfig, ParallelConfig, TrainConfig
from training.observe.metrics import device_peak, flops_per_token, non_embedding_params

# Model shapes; vocab is a multiple of 64 so that megatron's padding leaves it unchanged.
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(layers=2, hidden=64, heads=4, groups=4, vocab=384, seq=64, batch=4),  # smoke test
    "small": dict(layers=4, hidden=256, heads=4, groups=4, vocab=8192, seq=256, batch=4),  # 5.3M parameters: the CPU default
    "350m": dict(layers=24, hidden=1024, heads=16, groups=16, vocab=32768, seq=2048, batch=8),  # configs/gpt-350m.yaml
    "1b": dict(layers=24, hidden=2048, heads=16, groups=8, vocab=32768, seq=2048, batch=4),  # configs/gpt-1b.yaml at TP=1
}
# Documents of the corpus (Python's standard library) prepared for the loader measurement.
LOADER_DOCUMENTS = {"tiny": 60, "small": 300, "350m": 300, "1b": 300}
VARIANTS = ("ours", "ours_eager", "ours_masked", "plain_compiled", "plain_eager")
ALL_VARIANTS = (*VARIANTS, "ours_fp8")  # with --fp8 also ours in FP8
EOD = 0  # the batch's end-of-text id: its rows are packed documents (``packed_documents``)
# The optimizer settings of both sides: the trainer's betas and eps (training/model/step.py), one lr, its clip.
LR, WEIGHT_DECAY, CLIP = 1e-4, 0.1, 1.0
EPS_NORM = 1e-5  # megatron's RMSNorm epsilon (build_gpt keeps the default)

Step = Callable[[], tuple[float, float]]  # one optimizer step; returns (loss, grad norm) as read back


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Non-interleaved RoPE (megatron's default layout) from tables built once: under torch.compile
    the whole expression is one fused kernel."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, groups: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.groups, self.dim = heads, groups, hidden // heads
        self.norm1, self.norm2 = nn.Parameter(torch.ones(hidden)), nn.Parameter(torch.ones(hidden))
        self.qkv = nn.Linear(hidden, (heads + 2 * groups) * self.dim, bias=False)  # fused, as megatron's linear_qkv
        self.proj = nn.Linear(hidden, hidden, bias=False)
        self.fc1, self.fc2 = nn.Linear(hidden, 2 * ffn, bias=False), nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        qkv = self.qkv(F.rms_norm(x, (h,), self.norm1, EPS_NORM))
        q, k, v = qkv.split([self.heads * self.dim, self.groups * self.dim, self.groups * self.dim], dim=-1)
        q = q.view(b, s, self.heads, self.dim).transpose(1, 2)
        k, v = (t.view(b, s, self.groups, self.dim).transpose(1, 2) for t in (k, v))
        gqa = self.groups != self.heads  # SDPA repeats the key/value heads itself (flash does so natively)
        attn = F.scaled_dot_product_attention(rope(q, cos, sin), rope(k, cos, sin), v, is_causal=True, enable_gqa=gqa)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        gate, up = self.fc1(F.rms_norm(x, (h,), self.norm2, EPS_NORM)).chunk(2, dim=-1)
        return x + self.fc2(F.silu(gate) * up)


class Head(nn.Module):
    """Final norm, tied output projection and the mean next-token cross-entropy (fp32 softmax)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = F.linear(F.rms_norm(x, (x.shape[-1],), self.norm, EPS_NORM), weight)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


class PlainGPT(nn.Module):
    """What a practitioner writes for our architecture (no biases, tied output layer, GQA)."""

    def __init__(self, shape: dict[str, int], ffn: int, rotary_base: int = 10000) -> None:
        super().__init__()
        hidden, heads = shape["hidden"], shape["heads"]
        self.embed = nn.Embedding(shape["vocab"], hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, shape["groups"], ffn) for _ in range(shape["layers"]))
        self.head = Head(hidden)
        for p in self.parameters():
            if p.ndim == 2:
                nn.init.normal_(p, std=0.02)
        dim = hidden // heads
        angles = torch.outer(torch.arange(shape["seq"]).float(), 1.0 / rotary_base ** (torch.arange(0, dim, 2).float() / dim))
        angles = torch.cat((angles, angles), dim=-1)
        # Buffers: .to(dtype) casts them once, not every step.
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def compile_regions(self) -> None:
        """torch.compile each block and the head (torchtitan's per-block compile): the blocks share
        one compiled graph, so compile time does not grow with depth."""
        for block in self.blocks:
            block.compile()
        self.head.compile()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        x = self.embed(inputs)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        return self.head(x, self.embed.weight, labels)


def plain_step(model: PlainGPT, optimizer: torch.optim.Optimizer, tokens: torch.Tensor, attention: str) -> Step:
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> tuple[float, float]:
        with attention_backend(attention):
            loss = model(tokens)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item(), norm.item()

    return step


def model_config(shape: dict[str, int], kernels: str = "triton") -> ModelConfig:
    return ModelConfig(
        num_layers=shape["layers"],
        hidden_size=shape["hidden"],
        num_attention_heads=shape["heads"],
        num_query_groups=shape["groups"],
        kernels=kernels,
    )


def build_ours(
    shape: dict[str, int], compiled: bool, device: torch.device, tokens: torch.Tensor, masked: bool = False, fp8: str = ""
) -> tuple[nn.Module, Step, str]:
    """The trainer's own step at TP=PP=1, as ``training.model.step.build_step`` makes it (``train.compile``
    on or off; ``model.kernels: triton``; ``train.document_masking`` as ``masked``; ``train.precision: fp8``
    under the recipe ``fp8``, '' = bf16)."""
    from training.model.layers import IMPL_ATTR
    from training.model.step import LocalStep, build_step
    from training.observe.timing import StepTimer

    batch = shape["batch"]
    cfg = TrainConfig(
        micro_batch_size=batch,
        global_batch_size=batch,
        lr=LR,
        weight_decay=WEIGHT_DECAY,
        grad_clip=CLIP,
        compile="on" if compiled else "off",
        document_masking=masked,
        precision="fp8" if fp8 else "bf16",
        fp8_recipe=fp8 or "tensorwise",
    )
    local = build_step(model_config(shape), ParallelConfig(tensor_parallel=1), cfg, shape["vocab"], shape["seq"], EOD)
    require(isinstance(local, LocalStep), f"expected the single-stage LocalStep, got {type(local).__name__}")
    model, timer = local.model, StepTimer(device)
    built_on = next(model.parameters()).device.type
    require(built_on == device.type, f"megatron built the model on {built_on}, not {device.type}")

    def step() -> tuple[float, float]:
        result = local.step(tokens, LR, timer)
        return result.loss, result.grad_norm

    return model, step, getattr(model.config, IMPL_ATTR)


def packed_documents(rows: torch.Tensor, mean_length: float) -> torch.Tensor:
    """``rows`` (ids ≥ 1) with an end-of-text after each document, lengths drawn from an exponential
    distribution of ``mean_length`` tokens (a fixed seed), as the packer lays documents end to end."""
    generator = torch.Generator().manual_seed(0)
    flat = rows.flatten().clone()
    at = 0
    while True:
        at += 1 + int(torch.empty(1).exponential_(1 / mean_length, generator=generator).item())
        if at >= flat.numel():
            return flat.view_as(rows)
        flat[at] = EOD


def documents_per_row(tokens: torch.Tensor) -> float:
    """Documents a row holds on average: its boundaries + 1."""
    return (tokens[:, :-1] == EOD).sum(dim=1).float().mean().item() + 1


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def attention_backend(name: str):
    """The plain model's SDPA backend: 'sdpa' lets torch choose (flash on CUDA); 'math' is the unfused
    softmax(QKᵀ)V, to tell attention apart from the rest."""
    if name == "math":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.MATH])
    return contextlib.nullcontext()


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied weight is one parameter on both sides


def build_variants(
    shape: dict[str, int], device: torch.device, attention: str, fp8: str = ""
) -> tuple[dict[str, Step], dict[str, dict]]:
    """The variants' steps on one fixed batch, and what each variant is (parameters, kernels, optimizer, precision)."""
    from training.config import ffn_size
    from training.distributed import init_distributed
    from training.model.step import adamw

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # what build_gpt uses
    init_distributed(ParallelConfig(tensor_parallel=1), seed=0, standalone=True)
    torch.manual_seed(0)
    tokens = packed_documents(torch.randint(1, shape["vocab"], (shape["batch"], shape["seq"] + 1)), shape["seq"] / 2).to(device)
    steps, info = {}, {}
    ours = [("ours", True, False, ""), ("ours_eager", False, False, ""), ("ours_masked", True, True, "")]
    for name, compiled, masked, recipe in ours + ([("ours_fp8", True, False, fp8)] if fp8 else []):
        model, steps[name], ran = build_ours(shape, compiled, device, tokens, masked, recipe)
        info[name] = {"parameters": parameter_count(model), "compiled": compiled, "kernels_run": ran, "optimizer": "fused"}
        info[name] |= {"document_masking": masked, "documents_per_row": round(documents_per_row(tokens), 2)}
        info[name]["precision"] = f"fp8 {recipe}" if recipe else "bf16" if device.type == "cuda" else "fp32"
    for name in ("plain_compiled", "plain_eager"):
        torch.manual_seed(0)
        with device:  # initialised where it runs: a 1B model's init on the CPU alone takes tens of seconds
            plain = PlainGPT(shape, ffn_size(model_config(shape))).to(dtype)
        plain.train()
        if name == "plain_compiled":
            plain.compile_regions()
        # The trainer's own AdamW (fused, weight decay on matrices only): both sides step the same optimizer.
        optimizer = adamw([p for p in plain.parameters() if p.requires_grad], TrainConfig(lr=LR, weight_decay=WEIGHT_DECAY))
        steps[name] = plain_step(plain, optimizer, tokens, attention)
        info[name] = {"parameters": parameter_count(plain), "compiled": name == "plain_compiled", "optimizer": "fused"}
    counts = {name: i["parameters"] for name, i in info.items()}
    require(len(set(counts.values())) == 1, f"the variants must have the same parameter count: {counts}")
    return steps, info


def time_steps(
    steps: dict[str, Step], device: torch.device, warmup: int, per_repeat: int, repeats: int
) -> tuple[dict[str, float], dict[str, list[list[float]]], dict[str, float]]:
    """Seconds of each variant's first step (compile included), and of its timed steps per repeat; on CUDA
    the most each variant's timed steps allocated above what was allocated when each began (bytes).
    Variants alternate step by step, the order rotating, so that load from other processes and
    cache effects of the preceding variant hit all of them alike."""
    names = list(steps)
    first: dict[str, float] = {}
    timed: dict[str, list[list[float]]] = {name: [[] for _ in range(repeats)] for name in names}
    peaks: dict[str, float] = {}
    cuda = device.type == "cuda"
    for i in range(warmup + per_repeat * repeats):
        for j in range(len(names)):
            name = names[(i + j) % len(names)]
            sync(device)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
                resident = torch.cuda.memory_allocated(device)
            start = time.perf_counter()
            steps[name]()
            sync(device)
            seconds = time.perf_counter() - start
            if i == 0:
                first[name] = seconds
            if i >= warmup:
                timed[name][(i - warmup) // per_repeat].append(seconds)
                if cuda:
                    peaks[name] = max(peaks.get(name, 0), torch.cuda.max_memory_allocated(device) - resident)
    return first, timed, peaks


def summarize(
    shape: dict[str, int],
    device: torch.device,
    first: dict[str, float],
    timed: dict[str, list[list[float]]],
    peaks: dict[str, float],
) -> dict:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tokens = shape["batch"] * shape["seq"]
    per_token = flops_per_token(non_embedding_params(model_config(shape)), shape["layers"], shape["hidden"], shape["seq"])
    peak, source = device_peak(device, dtype)
    results: dict = {}
    for name, repeats in timed.items():
        every = [s for r in repeats for s in r]
        median = statistics.median(every)
        per_repeat = [tokens / statistics.median(r) for r in repeats]
        results[name] = {
            "tokens_per_s": round(tokens / median, 1),
            "step_ms": round(1000 * median, 2),
            # The fastest step: on a shared machine the least disturbed by other processes.
            "best_tokens_per_s": round(tokens / min(every), 1),
            "tokens_per_s_repeats": [round(t, 1) for t in per_repeat],
            "tokens_per_s_min": round(min(per_repeat), 1),
            "tokens_per_s_max": round(max(per_repeat), 1),
            "first_step_s": round(first[name], 3),
            "model_tflops_per_s": round(per_token * tokens / median / 1e12, 4),
            "mfu": round(per_token * tokens / median / peak, 4) if peak else None,
        }
        if name in peaks:
            results[name]["step_peak_gib"] = round(peaks[name] / 2**30, 3)
    if peaks:
        pairs = {"ours_vs_plain_compiled": ("ours", "plain_compiled"), "fp8_vs_bf16": ("ours_fp8", "ours")}
        results["memory"] = {key: round(peaks[a] / peaks[b], 3) for key, (a, b) in pairs.items() if a in peaks and peaks[b]}
    results["peak"] = {"flops": peak, "source": source}
    if device.type == "cuda":
        results["peak"]["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return results


def repeat_ratios(timed: dict[str, list[list[float]]]) -> dict:
    """Per-repeat ratios (> 1: the first named is faster), as ``ratios`` (median) and ``spread`` ([min, max]).

    A repeat's ratio is the median over its rounds of the paired ratio b's step time / a's: the steps
    of one round run back to back and share that moment's load from other processes, which on a
    shared machine moves step times far more than the difference being measured."""

    def over(a: str, b: str) -> list[float]:
        return [statistics.median(y / x for x, y in zip(ra, rb, strict=True)) for ra, rb in zip(timed[a], timed[b], strict=True)]

    keys = ratio_keys(
        {
            "ours_vs_plain_compiled": over("ours", "plain_compiled"),
            "ours_eager_vs_plain_eager": over("ours_eager", "plain_eager"),
            "ours_vs_plain_eager": over("ours", "plain_eager"),
            "ours_compile_speedup": over("ours", "ours_eager"),
            # < 1: document masking's cost, the masked step's speed over the unmasked one's.
            "masked_vs_unmasked": over("ours_masked", "ours"),
        }
        | (
            {"fp8_vs_bf16": over("ours_fp8", "ours"), "ours_fp8_vs_plain_compiled": over("ours_fp8", "plain_compiled")}
            if "ours_fp8" in timed
            else {}
        )
    )
    keys["ratios"] = {k: round(v, 3) for k, v in keys["ratios"].items()}
    keys["spread"] = {k: [round(v, 3) for v in mm] for k, mm in keys["spread"].items()}
    gain = over("plain_compiled", "plain_eager")
    keys["plain_compile_speedup"] = {k: round(f(gain), 3) for k, f in (("median", statistics.median), ("min", min), ("max", max))}
    return keys


# Profile groups: the first whose pattern matches an op or kernel name (lower case) takes its time.
GROUPS: list[tuple[str, re.Pattern[str]]] = [
    ("optimizer", re.compile(r"adam|foreach|multi_tensor|multitensor|vector_norm")),  # the clip's norm too
    ("compiled", re.compile(r"^triton_(poi|red|per|tem)_|compiledfxgraph|compiledfunction|torch-compiled|torchdynamo")),
    ("attention", re.compile(r"attention|flash|fmha|sdpa|scaled_dot_product")),
    ("loss", re.compile(r"cross_entropy|log_softmax|nll_loss|_ce_|linear_ce|logsumexp")),
    ("rope", re.compile(r"rope|rotary")),
    ("norm", re.compile(r"rms|norm")),
    ("activation", re.compile(r"silu|swiglu|glu")),
    ("fp8_cast", re.compile(r"tofloat8|to_float8|float8_|amax")),  # FP8's scaling and casts (its GEMMs are matmul)
    ("copy", re.compile(r"copy|memcpy|memset|contiguous|clone")),  # layout changes, e.g. megatron's [s, b, h, d]
    ("matmul", re.compile(r"(^|[^a-z])(add|badd)?b?mm([^a-z]|$)|matmul|gemm|linear|nvjet|xmma|cutlass|cublas|sm90_")),
]


def group_of(name: str) -> str:
    low = name.lower()
    return next((group for group, pattern in GROUPS if pattern.search(low)), "other")


def profile_step(step: Step, device: torch.device, steps: int = 2) -> dict:
    """Self time per group and the top ops of ``steps`` steps, per step: CUDA kernels on a GPU (and
    how much of the step the GPU was busy), CPU ops on a CPU."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync(device)
        wall_ms = 1000 * (time.perf_counter() - start) / steps
    events = prof.key_averages()
    if device.type == "cuda":
        kernels = [e for e in events if e.device_type == DeviceType.CUDA] or list(events)
        timed = [(e.key, e.self_device_time_total / 1000 / steps) for e in kernels]
    else:
        kernels = list(events)
        timed = [(e.key, e.self_cpu_time_total / 1000 / steps) for e in events]
    launches = sum(e.count for e in kernels) / steps  # GPU: kernels launched per step (CPU: ops run)
    timed = [(k, ms) for k, ms in timed if ms > 0]
    groups: dict[str, float] = {}
    for key, ms in timed:
        groups[group_of(key)] = groups.get(group_of(key), 0.0) + ms
    busy = sum(ms for _, ms in timed)
    top = sorted(timed, key=lambda kv: -kv[1])[:15]
    return {
        "step_ms": round(wall_ms, 2),
        "busy_ms": round(busy, 2),  # GPU: kernel time; the rest of step_ms the GPU waited (launches, syncs)
        "launches_per_step": round(launches),
        "groups_ms": {g: round(ms, 2) for g, ms in sorted(groups.items(), key=lambda kv: -kv[1])},
        "top_ms": [[key[:90], round(ms, 2)] for key, ms in top],
    }


def measure_models(shape: dict[str, int], device: torch.device, args: argparse.Namespace) -> dict:
    steps, info = build_variants(shape, device, args.plain_attention, args.fp8)
    first, timed, peaks = time_steps(steps, device, args.warmup, args.steps, args.repeats)
    results = summarize(shape, device, first, timed, peaks)
    results["ratios"] = repeat_ratios(timed)
    for name in steps:
        results[name] |= info[name]
    # The first step's excess over a timed one: torch.compile's time (cold or warm: Inductor's cache decides).
    results["compile_s"] = {name: round(first[name] - results[name]["step_ms"] / 1000, 2) for name in ("ours", "plain_compiled")}
    if args.profile:
        profiled = ("ours", "plain_compiled") + (("ours_fp8",) if args.fp8 else ())
        results["profile"] = {name: profile_step(steps[name], device) for name in profiled}
    return results


def measure_loader(shape: dict[str, int], documents: int) -> dict:
    """Tokens/s of one pass of the training loader over a freshly prepared dataset's train split."""
    from data_prep.config import DataConfig, TokenizerConfig
    from data_prep.prepare import prepare_dataset
    from storage import open_store

    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        data = DataConfig(max_documents=documents, seq_len=shape["seq"], sequences_per_sample=8, samples_per_shard=16, workers=2)
        ref = prepare_dataset(data, TokenizerConfig(vocab_size=min(shape["vocab"], 8192)), open_store(tmp))
        start = time.perf_counter()
        rows = sum(len(batch) for batch in loader_pass(ref, shape["batch"]))
        seconds = time.perf_counter() - start
    return {"tokens_per_s": round(rows * shape["seq"] / seconds, 1), "seconds": round(seconds, 3), "rows": rows}


def loader_pass(ref, batch_size: int):
    """One epoch of batches from whichever loader training/data.py offers (streaming, or rows in memory)."""
    from training import data

    if hasattr(data, "StreamingLoader"):
        loader, manifest = data.StreamingLoader.for_split(ref, "train", batch_size, seed=0)
        with loader:
            total = sum(int(s["sequences"]) for s in manifest["splits"]["train"]["shards"])
            for step in range(total // batch_size):
                yield loader.batch(step).tokens
    else:
        rows, _ = data.load_split(ref, "train")
        sampler = data.GlobalBatchSampler(rows, batch_size, seed=0)
        for step in range(len(rows) // batch_size):
            yield sampler.rank_batch(step, 0, 1)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=sorted(SIZES), help="model shape (default: 350m on CUDA, small on CPU)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats; ratios are medians of per-repeat ratios")
    parser.add_argument("--steps", type=int, default=0, help="timed steps per variant per repeat (default: 3 CUDA, 5 CPU)")
    parser.add_argument("--warmup", type=int, default=-1, help="untimed steps first, compile included (default: 2)")
    parser.add_argument("--plain-attention", choices=("sdpa", "math"), default="sdpa", help="plain: SDPA backend")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's; 1 is steadier on a busy CPU)")
    parser.add_argument("--profile", action="store_true", help="profile two steps of ours and plain_compiled, grouped by op")
    parser.add_argument("--no-loader", action="store_true", help="skip (b) and (d), the loader measurements")
    parser.add_argument("--no-checkpoint", action="store_true", help="skip (e), the checkpoint stall measurement")
    parser.add_argument(
        "--loader-s3-mb", type=float, default=-1, help="(d): MB of the S3 loader dataset (default 300; 0 skips; tiny: 0)"
    )
    parser.add_argument(
        "--fp8",
        choices=("tensorwise", "rowwise"),
        default="",
        help="also time ours with train.precision: fp8 under this recipe (ours_fp8; fp8_vs_bf16)",
    )
    parser.add_argument(
        "--compile-backend",
        choices=("inductor", "eager"),
        default="inductor",
        help="torch.compile's backend for ours and plain_compiled; 'eager' (gpu_checks.sh --dry-run, the smoke test): "
        "Dynamo traces every compiled region, Inductor generates no code, so its figures mean nothing",
    )
    args = parser.parse_args()
    cuda = args.device == "cuda"
    args.size = args.size or ("350m" if cuda else "small")
    # GPU: 4 variants × (2 + 3 × 3) steps, so the 1B shape fits gpu_checks.sh's 90 s with its compile and
    # profile. CPU: 5 steps per repeat, as a shared machine's noise needs (the default run takes ~2 minutes).
    args.steps = args.steps or (3 if cuda else 5)
    args.warmup = args.warmup if args.warmup >= 0 else 2
    if args.repeats < 1 or args.warmup < 1:
        parser.error("--repeats and --warmup must be ≥ 1 (the first step compiles)")
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    if cuda and args.fp8:
        from common.errors import ConfigError
        from training.model.fp8 import refuse_without_hardware

        try:
            refuse_without_hardware("this GPU")
        except ConfigError as refused:
            parser.error(f"--fp8: {refused}")
    return args


def report(result: dict) -> None:
    print(f"{result['device']}, {result['size']} {result['shape']}, {result['dtype']}", end=", ")
    print(f"{result['repeats']} repeats × {result['steps']} steps after {result['warmup']} warm-up")
    for name in [v for v in ALL_VARIANTS if v in result]:
        r = result[name]
        print(
            f"  {name:<19} {r['tokens_per_s']:>10.1f} tokens/s [{r['tokens_per_s_min']}, {r['tokens_per_s_max']}]"
            f"  step {r['step_ms']} ms  first step {r['first_step_s']} s  mfu {r['mfu']}"
        )
    for name, value in result["ratios"].items():
        print(f"  {name:<37} {value} {result['spread'][name]}")
    print(f"  plain compile speedup {result['plain_compile_speedup']}, compile {result['compile_s']} s")
    if "memory" in result:
        print(f"  step peak memory ratios {json.dumps(result['memory'])}")
    for name, prof in result.get("profile", {}).items():
        print(
            f"  profile {name}: step {prof['step_ms']} ms, busy {prof['busy_ms']} ms, {prof['launches_per_step']} launches, "
            f"{json.dumps(prof['groups_ms'])}"
        )
        for key, ms in prof["top_ms"][:8]:
            print(f"      {ms:>9.2f} ms  {key}")
    print(f"  loader {json.dumps(result['loader'])}")
    if "ratio_loader_vs_consumption" in result:
        print(f"  loader/consumption {result['ratio_loader_vs_consumption']}")


def main() -> None:
    args = parse_args()
    if args.compile_backend != "inductor":  # nn.Module.compile and training/model/compiling.py call torch.compile
        torch.compile = functools.partial(torch.compile, backend=args.compile_backend)  # type: ignore[assignment]
    cuda = args.device == "cuda"
    if not cuda:
        # build_gpt puts the model on the GPU whenever one exists; hide it for a CPU measurement.
        torch.cuda.is_available = lambda: False  # type: ignore[assignment]
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=UserWarning)
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    shape = SIZES[args.size]

    from training.distributed import shutdown_distributed

    try:
        models = measure_models(shape, device, args)
    finally:
        shutdown_distributed()
    ours, plain = models["ours"], models["plain_compiled"]
    result = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch_threads": torch.get_num_threads(),
        "size": args.size,
        "shape": shape,
        "dtype": "bf16" if cuda else "fp32",
        "repeats": args.repeats,
        "steps": args.steps,
        "warmup": args.warmup,
        "kernels": "triton",
        "plain_attention": args.plain_attention,
        "compile_backend": args.compile_backend,
        **{name: models[name] for name in ALL_VARIANTS if name in models},
        "plain": plain,
        "compile_s": models["compile_s"],
        "peak": models["peak"],
        **({"memory": models["memory"]} if "memory" in models else {}),
        "fp8_recipe": args.fp8 or None,
        "ratio_ours_vs_plain": round(ours["tokens_per_s"] / plain["tokens_per_s"], 3),
        "ratio_ours_vs_plain_best": round(ours["best_tokens_per_s"] / plain["best_tokens_per_s"], 3),
        **models["ratios"],
    }
    if "profile" in models:
        result["profile"] = models["profile"]
    if args.no_loader:
        result["loader"] = {"skipped": "--no-loader"}
    else:
        try:
            result["loader"] = measure_loader(shape, LOADER_DOCUMENTS[args.size])
            result["ratio_loader_vs_consumption"] = round(result["loader"]["tokens_per_s"] / ours["tokens_per_s"], 2)
        except Exception as err:  # e.g. a GPU image without the data-prep dependencies: still report (a)
            result["loader"] = {"skipped": f"{type(err).__name__}: {err}"}
        loader_s3_mb = args.loader_s3_mb if args.loader_s3_mb >= 0 else (0 if args.size == "tiny" else 300)
        if loader_s3_mb:
            # The loader at its real job (benchmarks/bench_loader.py): two ranks, cold, from SeaweedFS S3.
            try:
                from bench_loader import measure as measure_loader_s3

                # On a GPU the demand is this run's own tokens/s; on CPU, bench_loader measures a CPU step.
                per_gpu = None
                if args.device == "cuda":
                    per_gpu = (ours["tokens_per_s"], f"ours, this run: {args.size} on {result['device']}")
                result["loader_s3"] = measure_loader_s3(mb=loader_s3_mb, repeats=args.repeats, per_gpu=per_gpu)
                result["ratios"] |= result["loader_s3"]["ratios"]
                result["spread"] |= result["loader_s3"]["spread"]
            except Exception as err:  # a GPU image without SeaweedFS: still report the rest
                result["loader_s3"] = {"skipped": f"{type(err).__name__}: {err}"}
    if args.no_checkpoint:
        result["checkpoint"] = {"skipped": "--no-checkpoint"}
    else:
        # (e) the step loop's stall per checkpoint, asynchronous against synchronous (bench_checkpoint.py).
        from bench_checkpoint import measure as measure_checkpoint

        try:
            # --size tiny, the smoke run: a small model, a file store, one repeat (not the goal's figure).
            smoke = {"layers": 2, "hidden": 128, "store_kind": "local", "vocab": 4096, "min_parameters": 0}
            result["checkpoint"] = measure_checkpoint(repeats=args.repeats, **(smoke if args.size == "tiny" else {}))
            result["ratios"] |= result["checkpoint"]["ratios"]
            result["spread"] |= result["checkpoint"]["spread"]
        finally:
            shutdown_distributed()
    result["machine"] = machine(["torch", "megatron-core", "triton"])
    report(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
