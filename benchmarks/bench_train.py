"""Training throughput of our megatron-core GPT against a plain-PyTorch GPT of the same shape, and of the
data loader against what training consumes, measured in the same run.

(a) ours: ``training.model.build_gpt`` (TP=1, one process) + AdamW, fwd + bwd + clip + optimizer step;
    plain: ``PlainGPT`` below (RMSNorm, SwiGLU, RoPE, tied embeddings, SDPA attention), same shape and
    parameter count, same optimizer. Steps alternate between the two so that load from other processes
    hits both alike; tokens/s comes from the median step time after warm-up.
(b) loader: the training loader of ``training/data.py`` reading the shards of a dataset prepared in a
    temporary store by ``data_prep.prepare.prepare_dataset``, one pass, nothing else running.
(c) on CUDA (the default when available): bf16, the gpt-350m shape, model TFLOP/s and MFU against the
    device's data-sheet peak (``training/metrics.py``).

Prints human-readable lines, then one JSON object as the last line:
  ours / plain                 tokens_per_s (median step), step_ms, best_tokens_per_s (fastest step),
                               parameters, model_tflops_per_s, mfu
  ratio_ours_vs_plain          goal ≥ 0.9 (and ratio_ours_vs_plain_best, of the fastest steps)
  loader                       tokens_per_s, seconds, rows (or "skipped" with the reason)
  ratio_loader_vs_consumption  loader tokens/s over ours: goal ≥ 10

  python benchmarks/bench_train.py [--device cpu|cuda] [--size tiny|small|350m] [--steps N] [--warmup N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from training.config import ModelConfig, ParallelConfig
from training.metrics import device_peak, flops_per_token, non_embedding_params

# Model shapes; vocab is a multiple of 64 so that megatron's padding leaves it unchanged.
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(layers=2, hidden=64, heads=4, vocab=384, seq=64, batch=4),  # smoke test
    "small": dict(layers=4, hidden=256, heads=4, vocab=8192, seq=256, batch=4),  # 5.3M parameters: the CPU default
    "350m": dict(layers=24, hidden=1024, heads=16, vocab=32768, seq=2048, batch=8),  # configs/gpt-350m.yaml
}
# Documents of the corpus (Python's standard library) prepared for the loader measurement.
LOADER_DOCUMENTS = {"tiny": 60, "small": 300, "350m": 300}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Non-interleaved RoPE (megatron's default): the two halves of each head rotate as pairs."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(hidden), RMSNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden, bias=False), nn.Linear(hidden, hidden, bias=False)
        self.fc1, self.fc2 = nn.Linear(hidden, 2 * ffn, bias=False), nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        gate, up = self.fc1(self.norm2(x)).chunk(2, dim=-1)
        return x + self.fc2(F.silu(gate) * up)


class PlainGPT(nn.Module):
    """nanoGPT-style reference with our model's architecture (no biases, tied output layer)."""

    def __init__(self, layers: int, hidden: int, heads: int, ffn: int, vocab: int, seq: int, rotary_base: int = 10000) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        for p in self.parameters():
            if p.ndim == 2:
                nn.init.normal_(p, std=0.02)
        dim = hidden // heads
        angles = torch.outer(torch.arange(seq).float(), 1.0 / rotary_base ** (torch.arange(0, dim, 2).float() / dim))
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        x = self.embed(inputs)
        cos, sin = self.cos[: inputs.shape[1]].to(x.dtype), self.sin[: inputs.shape[1]].to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.norm(x) @ self.embed.weight.t()
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def optimizer_step(params: list[torch.Tensor], optimizer: torch.optim.Optimizer, loss_fn: Callable[[], torch.Tensor]) -> None:
    loss_fn().backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def build_ours(shape: dict[str, int], kernels: str) -> tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
    from training.model import build_gpt, init_distributed, mean_loss

    init_distributed(ParallelConfig(tensor_parallel=1), seed=0, standalone=True)
    model = build_gpt(model_config(shape, kernels), shape["vocab"], shape["seq"], tensor_parallel=1)
    return model, lambda tokens: mean_loss(model, tokens)


def model_config(shape: dict[str, int], kernels: str = "triton") -> ModelConfig:
    layers, hidden, heads = shape["layers"], shape["hidden"], shape["heads"]
    return ModelConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=heads, kernels=kernels)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def attention_backend(name: str):
    """The plain model's SDPA backend: 'sdpa' lets torch choose (flash on CUDA); 'math' is the unfused
    softmax(QKᵀ)V that megatron's local attention also computes, to tell attention apart from the rest."""
    if name == "math":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.MATH])
    return contextlib.nullcontext()


def measure_models(
    shape: dict[str, int], device: torch.device, steps: int, warmup: int, kernels: str = "triton", plain_attention: str = "sdpa"
) -> dict[str, dict]:
    from training.model import ffn_size

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # what build_gpt uses
    ours, ours_loss = build_ours(shape, kernels)
    assert next(ours.parameters()).device.type == device.type, "megatron built the model on another device"
    torch.manual_seed(0)
    ffn = ffn_size(model_config(shape))
    plain = PlainGPT(shape["layers"], shape["hidden"], shape["heads"], ffn, shape["vocab"], shape["seq"]).to(device, dtype)
    runs = {"ours": (ours, ours_loss), "plain": (plain, plain.loss)}
    tokens = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"] + 1), device=device)
    step_s: dict[str, list[float]] = {name: [] for name in runs}
    optimizers = {}
    for name, (model, _) in runs.items():
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        optimizers[name] = (params, torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1))
    for i in range(warmup + steps):
        for name, (_, loss_fn) in runs.items():
            params, optimizer = optimizers[name]
            sync(device)
            start = time.perf_counter()
            with attention_backend(plain_attention) if name == "plain" else contextlib.nullcontext():
                optimizer_step(params, optimizer, lambda: loss_fn(tokens))  # noqa: B023 (called right here)
            sync(device)
            if i >= warmup:
                step_s[name].append(time.perf_counter() - start)
    per_token = flops_per_token(non_embedding_params(model_config(shape)), shape["layers"], shape["hidden"], shape["seq"])
    peak, source = device_peak(device, dtype)
    results = {}
    for name, (model, _) in runs.items():
        median = statistics.median(step_s[name])
        tokens_per_s = shape["batch"] * shape["seq"] / median
        results[name] = {
            "tokens_per_s": round(tokens_per_s, 1),
            "step_ms": round(1000 * median, 2),
            # The fastest step: on a shared machine the least disturbed by other processes.
            "best_tokens_per_s": round(shape["batch"] * shape["seq"] / min(step_s[name]), 1),
            "parameters": sum(p.numel() for p in model.parameters()),
            "model_tflops_per_s": round(per_token * tokens_per_s / 1e12, 4),
            "mfu": round(per_token * tokens_per_s / peak, 4) if peak else None,
        }
    results["peak"] = {"flops": peak, "source": source}
    if device.type == "cuda":
        results["peak"]["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=sorted(SIZES), help="model shape (default: 350m on CUDA, small on CPU)")
    parser.add_argument("--steps", type=int, default=0, help="timed steps per model (default: 20 on CUDA, 8 on CPU)")
    parser.add_argument("--warmup", type=int, default=-1, help="untimed steps first (default: 3 on CUDA, 2 on CPU)")
    parser.add_argument("--kernels", choices=("triton", "torch"), default="triton", help="ours: model.kernels")
    parser.add_argument("--plain-attention", choices=("sdpa", "math"), default="sdpa", help="plain: SDPA backend")
    parser.add_argument("--no-loader", action="store_true", help="skip (b), the loader measurement")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    size = args.size or ("350m" if cuda else "small")
    steps = args.steps or (20 if cuda else 8)
    warmup = args.warmup if args.warmup >= 0 else (3 if cuda else 2)
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    if not cuda:
        # build_gpt puts the model on the GPU whenever one exists; hide it for a CPU measurement.
        torch.cuda.is_available = lambda: False  # type: ignore[assignment]
    warnings.filterwarnings("ignore", category=UserWarning)
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    shape = SIZES[size]

    from training.model import shutdown_distributed

    try:
        models = measure_models(shape, device, steps, warmup, args.kernels, args.plain_attention)
    finally:
        shutdown_distributed()
    ours, plain = models["ours"], models["plain"]
    result = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch_threads": torch.get_num_threads(),
        "size": size,
        "shape": shape,
        "dtype": "bf16" if cuda else "fp32",
        "steps": steps,
        "warmup": warmup,
        "kernels": args.kernels,
        "plain_attention": args.plain_attention,
        "ours": ours,
        "plain": plain,
        "peak": models["peak"],
        "ratio_ours_vs_plain": round(ours["tokens_per_s"] / plain["tokens_per_s"], 3),
        "ratio_ours_vs_plain_best": round(ours["best_tokens_per_s"] / plain["best_tokens_per_s"], 3),
    }
    if args.no_loader:
        result["loader"] = {"skipped": "--no-loader"}
    else:
        try:
            result["loader"] = measure_loader(shape, LOADER_DOCUMENTS[size])
            result["ratio_loader_vs_consumption"] = round(result["loader"]["tokens_per_s"] / ours["tokens_per_s"], 2)
        except Exception as err:  # e.g. a GPU image without the data-prep dependencies: still report (a)
            result["loader"] = {"skipped": f"{type(err).__name__}: {err}"}
    print(f"{result['device']}, {size} {shape}, {result['dtype']}, {steps} timed steps after {warmup} warm-up")
    for name in ("ours", "plain"):
        print(f"  {name:<6} {json.dumps(result[name])}")
    print(f"  ours/plain {result['ratio_ours_vs_plain']} (fastest steps {result['ratio_ours_vs_plain_best']})")
    print(f"  loader {json.dumps(result['loader'])}")
    if "ratio_loader_vs_consumption" in result:
        print(f"  loader/consumption {result['ratio_loader_vs_consumption']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
