"""The Triton kernels against PyTorch eager and torch.compile, forward + backward, on CUDA.

For each kernel and realistic shape (bf16; seq 4096 x batch 2 tokens; hidden 2048-8192;
vocabulary 32k-128k) it measures, per implementation:
  ms        median wall time of one forward + backward (CUDA events)
  peak_mib  peak memory allocated during it, above what was allocated before (inputs, weights)
and prints ratios against the Triton path (speedup_vs_* > 1: Triton is faster;
mem_ratio_vs_* < 1: Triton uses less), plus the largest relative difference between the
Triton and eager outputs and gradients as a sanity check.

Prints human-readable lines, then one JSON object as the last line. Without a CUDA device it
says so and prints {"cuda": false, "skipped": ...} (exit status 0).

  python benchmarks/bench_kernels.py [--only rmsnorm,swiglu,rotary,fused_linear_ce] [--iters N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable, Iterator
from typing import Any

import torch

KERNELS = ("rmsnorm", "swiglu", "rotary", "fused_linear_ce")
TOKENS = 4096 * 2  # seq 4096, micro-batch 2
DTYPE = torch.bfloat16


def ffn_size(hidden: int) -> int:
    """The SwiGLU width training/model.py uses: 8/3 * hidden, rounded up to a multiple of 64."""
    return -(-8 * hidden // 3 // 64) * 64


# Realistic shapes: hidden 2048 / 4096 / 8192 (16 / 32 / 64 heads of 128), seq 4096 x batch 2.
SHAPES: dict[str, list[dict[str, int]]] = {
    "rmsnorm": [{"tokens": TOKENS, "hidden": hidden} for hidden in (2048, 4096, 8192)],
    "swiglu": [{"tokens": TOKENS, "ffn": ffn_size(hidden)} for hidden in (2048, 4096, 8192)],
    "rotary": [{"seq": 4096, "batch": 2, "heads": heads, "head_dim": 128} for heads in (16, 32, 64)],
    "fused_linear_ce": [
        {"tokens": TOKENS, "hidden": hidden, "vocab": vocab} for hidden, vocab in ((2048, 32000), (4096, 128256), (8192, 128256))
    ],
}


def rope_freqs(seq: int, rot_dim: int, base: float = 10000.0) -> torch.Tensor:
    """Megatron's RotaryEmbedding angles: [seq, 1, 1, rot_dim], float32."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.float32, device="cuda") / rot_dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32, device="cuda"), inv_freq)
    return torch.cat((freqs, freqs), dim=-1)[:, None, None, :]


class Case:
    """One kernel at one shape: leaves that take gradients, fixed extra arguments, and the
    function for each implementation (all with the same signature)."""

    def __init__(
        self,
        kernel: str,
        shape: dict[str, int],
        leaves: list[torch.Tensor],
        extra: tuple[Any, ...],
        impls: dict[str, Callable[..., torch.Tensor]],
    ) -> None:
        self.kernel, self.shape, self.leaves, self.extra, self.impls = kernel, shape, leaves, extra, impls


def make_cases(only: set[str]) -> Iterator[Case]:
    """One case at a time, so only its tensors are allocated."""
    from kernels import fused_linear_ce, rmsnorm, rotary, swiglu

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device="cuda") * scale).to(DTYPE).requires_grad_()

    def impls(triton_fn: Callable[..., torch.Tensor], reference: Callable[..., torch.Tensor]) -> dict[str, Callable]:
        return {"triton": triton_fn, "eager": reference, "compile": torch.compile(reference, dynamic=False)}

    for shape in SHAPES["rmsnorm"] if "rmsnorm" in only else []:
        yield Case(
            "rmsnorm",
            shape,
            [randn(shape["tokens"], shape["hidden"]), randn(shape["hidden"], scale=0.1)],
            (1e-5,),
            impls(rmsnorm.rmsnorm, rmsnorm.rmsnorm_reference),
        )
    for shape in SHAPES["swiglu"] if "swiglu" in only else []:
        yield Case("swiglu", shape, [randn(shape["tokens"], 2 * shape["ffn"])], (), impls(swiglu.swiglu, swiglu.swiglu_reference))
    for shape in SHAPES["rotary"] if "rotary" in only else []:
        yield Case(
            "rotary",
            shape,
            [randn(shape["seq"], shape["batch"], shape["heads"], shape["head_dim"])],
            (rope_freqs(shape["seq"], shape["head_dim"]),),
            impls(rotary.apply_rotary, rotary.rotary_reference),
        )
    for shape in SHAPES["fused_linear_ce"] if "fused_linear_ce" in only else []:
        tokens, vocab = shape["tokens"], shape["vocab"]
        targets = torch.randint(0, vocab, (tokens,), device="cuda")
        targets[torch.rand(tokens, device="cuda") < 0.05] = -100  # some padding
        yield Case(
            "fused_linear_ce",
            shape,
            [randn(tokens, shape["hidden"]), randn(vocab, shape["hidden"], scale=shape["hidden"] ** -0.5)],
            (targets,),
            impls(fused_linear_ce.fused_linear_cross_entropy, fused_linear_ce.fused_linear_cross_entropy_reference),
        )


def run_once(case: Case, fn: Callable[..., torch.Tensor], grad_out: torch.Tensor | None) -> torch.Tensor:
    for leaf in case.leaves:
        leaf.grad = None
    out = fn(*case.leaves, *case.extra)
    out.backward(grad_out if out.dim() else None)
    return out


def measure(case: Case, fn: Callable[..., torch.Tensor], grad_out: torch.Tensor | None, iters: int) -> dict[str, float]:
    for _ in range(3):  # warm-up: Triton/Inductor compilation, cuBLAS heuristics, allocator
        run_once(case, fn, grad_out)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run_once(case, fn, grad_out)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    for leaf in case.leaves:
        leaf.grad = None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = run_once(case, fn, grad_out)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return {"ms": statistics.median(times), "peak_mib": peak / 2**20}


def max_rel_diff(case: Case, grad_out: torch.Tensor | None) -> float:
    """Largest |triton - eager| / max|eager| over the output and every gradient."""
    results = []
    for name in ("triton", "eager"):
        out = run_once(case, case.impls[name], grad_out).detach().float()
        results.append([out] + [leaf.grad.detach().float() for leaf in case.leaves])
    worst = 0.0
    for got, ref in zip(*results, strict=True):
        worst = max(worst, ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item())
    for leaf in case.leaves:
        leaf.grad = None
    return worst


def _one_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:200]


def bench_case(case: Case, iters: int) -> dict[str, Any]:
    with torch.no_grad():
        probe = case.impls["eager"](*case.leaves, *case.extra)
    grad_out = torch.randn_like(probe) if probe.dim() else None
    del probe
    row: dict[str, Any] = {"kernel": case.kernel, "dtype": str(DTYPE).removeprefix("torch."), **case.shape}
    try:
        row["max_rel_diff_vs_eager"] = max_rel_diff(case, grad_out)
    except Exception as error:  # report and go on: the last line must still be the JSON
        row["diff_error"] = _one_line(error)
    for name, fn in case.impls.items():
        try:
            result = measure(case, fn, grad_out, iters)
        except Exception as error:  # e.g. torch.compile failing on this stack: report, go on
            row[f"{name}_error"] = _one_line(error)
            torch.cuda.empty_cache()
            continue
        row[f"{name}_ms"] = round(result["ms"], 4)
        row[f"{name}_peak_mib"] = round(result["peak_mib"], 1)
    for other in ("eager", "compile"):
        if f"{other}_ms" in row and "triton_ms" in row:
            row[f"speedup_vs_{other}"] = round(row[f"{other}_ms"] / row["triton_ms"], 3)
            row[f"mem_ratio_vs_{other}"] = round(row["triton_peak_mib"] / max(row[f"{other}_peak_mib"], 1e-9), 3)
    return row


def describe(row: dict[str, Any]) -> str:
    shape = " ".join(
        f"{k}={row[k]}" for k in ("tokens", "seq", "batch", "heads", "head_dim", "hidden", "ffn", "vocab") if k in row
    )
    parts = [f"{row['kernel']:<16} {shape:<40}"]
    for name in ("triton", "eager", "compile"):
        if f"{name}_ms" in row:
            ratio = ""
            if f"speedup_vs_{name}" in row:  # Triton x faster, Triton's memory x of this one's
                ratio = f" (triton x{row[f'speedup_vs_{name}']:.2f} faster, mem x{row[f'mem_ratio_vs_{name}']:.2f})"
            parts.append(f"{name} {row[f'{name}_ms']:.3f} ms {row[f'{name}_peak_mib']:.0f} MiB{ratio}")
        else:
            parts.append(f"{name} failed: {row.get(f'{name}_error')}")
    if "max_rel_diff_vs_eager" in row:
        parts.append(f"max rel diff {row['max_rel_diff_vs_eager']:.1e}")
    else:
        parts.append(f"diff failed: {row.get('diff_error')}")
    return " | ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(KERNELS), help="comma-separated subset of " + ",".join(KERNELS))
    parser.add_argument("--iters", type=int, default=20, help="timed iterations per implementation (median)")
    args = parser.parse_args()
    only = {name.strip() for name in args.only.split(",") if name.strip()}
    if unknown := only - set(KERNELS):
        parser.error(f"unknown kernels: {sorted(unknown)}")

    if not torch.cuda.is_available():
        print("no CUDA device: the Triton kernels need a GPU to be benchmarked (tests run them in the interpreter)")
        print(json.dumps({"cuda": False, "skipped": "no CUDA device"}))
        return
    if os.environ.pop("TRITON_INTERPRET", "0") not in ("0", ""):
        print("TRITON_INTERPRET was set: unset for the benchmark (the interpreter is not a GPU kernel)")

    import triton

    device = torch.cuda.get_device_name()
    print(f"device: {device}; torch {torch.__version__}, triton {triton.__version__}; {DTYPE}, forward + backward")
    rows = []
    for case in make_cases(only):
        torch._dynamo.reset()  # each shape compiles afresh; no recompile limits carried over
        row = bench_case(case, args.iters)
        print(describe(row), flush=True)
        rows.append(row)
        del case
        torch.cuda.empty_cache()
    print(json.dumps({"cuda": True, "device": device, "torch": torch.__version__, "triton": triton.__version__, "results": rows}))


if __name__ == "__main__":
    main()
