"""Our Triton kernels against Liger-Kernel (the peer), PyTorch eager and torch.compile, forward +
backward, on CUDA.

For each kernel and realistic shape (bf16; seq 4096 x batch 2 tokens; hidden 2048-8192;
vocabulary 32k-128k) it measures, per implementation:
  ms        median wall time of one forward + backward (CUDA events) over --iters iterations
  peak_mib  peak memory allocated during one, above what was allocated before (inputs, weights)
Implementations: `triton` (ours), `liger` (Liger-Kernel 0.8.5), `eager` (our PyTorch
reference) and, at each kernel's headline (middle) shape only unless --compile-all (each shape
costs Inductor a forward and a backward compilation: the default run is meant to fit ~2 minutes
on an H200 with --iters 10), `compile` (the reference under torch.compile), `triton_compile`
and `liger_compile` (ours and Liger's, each called inside a torch.compile'd function). Before
Liger was added, `compile` ran at every shape: rows of the other shapes now lack compile_ms.

Repeats: --repeats (default 3) rounds; in each, every implementation is measured in turn (the
order reversed every other round, so neither side always runs first), and every ratio is taken
inside the round, then summarized as median and [min, max] over the rounds. Row keys:
`<impl>_ms` / `<impl>_peak_mib` are medians over rounds (`<impl>_ms_range`: [min, max]);
speedup_vs_<other> = other_ms / triton_ms (> 1: ours faster) and mem_ratio_vs_<other> =
triton_peak / other_peak (< 1: ours uses less), medians of per-round ratios. The last line's
"ratios" / "spread" (median, [min, max] over rounds; machine_info.ratio_keys):
  <kernel>_vs_liger                      Liger ms / ours, geometric mean over the kernel's shapes
  <kernel>_peak_mem_vs_liger             ours peak / Liger's, geometric mean over the shapes
  <kernel>_compiled_vs_liger_compiled    both inside torch.compile, compiled shapes
  <kernel>_vs_torch_compile              compiled PyTorch reference ms / ours, compiled shapes
Goals (issue 14): each kernel >= 0.95x Liger's speed; fused_linear_ce peak memory <= Liger's.

How each side is called (conventions as in tests/test_kernels_liger.py, which checks both agree):
- rmsnorm: Liger's casting_mode="gemma" (float32 inside, one rounding: our numerics), in_place
  =False (its default writes dx into the incoming gradient, which this harness reuses).
- swiglu: Liger's LigerFusedGateUpSiLUMulFunction, which takes our [gate, up] layout.
- rotary: q and k (same head count), each side in its own layout without copies: the leaves
  are [batch, seq, heads, dim] (HF's storage); Liger gets its [batch, heads, seq, dim] views,
  ours gets [seq, batch, heads, dim] views (megatron's order; the kernel takes strides). Liger
  gets cos/sin precomputed in bf16 (as HF passes them; shared by all layers, not timed) and
  rotates in place, so its peak has no output; ours computes cos/sin from the angles in float32
  and writes new tensors. Each side's incoming gradient has its own output's layout. The rotary
  rows time q and k together (before Liger was added, they timed one tensor t).
- fused_linear_ce: reduction mean, ignore_index -100 (5% of tokens), no z-loss; Liger in bf16
  with its default accumulation (bf16 grad_weight, as ours). Same chunk size on both sides.

Checked before timed: at each shape, before any timing, every implementation's outputs and input
gradients (one forward + backward on fresh copies of the inputs, the same incoming gradient) are
compared with our PyTorch reference's (`eager`). Per dtype (TOLERANCES), max|diff| / max|reference|
catches a local error (a wrong tile, row or mask) and mean|diff| / mean|reference| a systematic one
(a wrong scale; in float32 one 1% off, in bf16 one a few percent off: TOLERANCES says why). An
implementation outside either is refused: its row gets `<impl>_refused` (kernel, shape, tensor, both
differences and tolerances) and no timing figure at all; a refused `triton` (ours) leaves the whole
shape untimed, since every figure is a ratio to it. The other kernels and shapes still run (a lent
GPU's minutes are not lost to one wrong kernel), the JSON line is still printed last, and the exit
status is then 1. An implementation that raises is recorded as `<impl>_error`, untimed, as before;
if the reference itself raises, the shape is untimed (`check_error`). Row keys: `check_vs_eager`
({impl: {max, mean}}), `max_rel_diff_vs_eager` (ours's max, as before).

Prints human-readable lines, then one JSON object as the last line (with the machine). Without
a CUDA device it says so and prints {"cuda": false, "skipped": ...} (exit status 0).
--dry-run-cpu runs the whole harness on CPU at tiny shapes (float32), with our PyTorch references
standing in for ours unless TRITON_INTERPRET=1 is set (then ours run in the interpreter);
torch.compile uses the "eager" backend (dynamo traces, no Inductor). Liger's kernels need a GPU:
their adapters are imported (the names exist) but not run, and no `liger*` implementation or
`*_vs_liger*` figure appears (a stand-in's figure would be a lie). Its figures mean nothing: it
checks the harness, the reference check, our adapters, the Liger adapters' imports and the JSON.

  python benchmarks/bench_kernels.py [--only rmsnorm,swiglu,rotary,fused_linear_ce] [--iters N]
                                     [--repeats N] [--quick] [--compile-all] [--dry-run-cpu]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from machine_info import machine, ratio_keys

KERNELS = ("rmsnorm", "swiglu", "rotary", "fused_linear_ce")
TOKENS = 4096 * 2  # seq 4096, micro-batch 2
DTYPE = torch.bfloat16
PACKAGES = ["torch", "triton", "liger-kernel"]
OURS = "triton"
PEERS = ("liger", "eager", "compile")  # rows get speedup_vs_<peer>, mem_ratio_vs_<peer>


def ffn_size(hidden: int) -> int:
    """The SwiGLU width training/model/gpt.py uses: 8/3 * hidden, rounded up to a multiple of 64."""
    return -(-8 * hidden // 3 // 64) * 64


# The reference check's tolerances per dtype, (max, mean) (see the module docstring):
# max |got - ref| / max |ref| and mean |got - ref| / mean |ref| over each output and gradient.
# float32 (the dry run, the interpreter): both sides compute in float32, only summation order differs.
# bfloat16: what no correct implementation of ours exceeds by design. fused_linear_ce rounds its weight
# gradient to bf16 once per chunk (16-32 chunks at these shapes; the reference rounds once): about
# 2^-9 * sqrt(chunks / 2), ~1% of each element, is expected; the bounds give that 3x-6x room (2^-5 on
# average, 2^-4 at the largest). A 1% scale error therefore passes in bf16 (the float32 dry run
# refuses it); an error of a few percent everywhere, or a wrong tile, row or mask, does not.
# float16: the same, three mantissa bits finer. check_vs_eager records the figures seen, to tighten these.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-5),
    torch.bfloat16: (2**-4, 2**-5),
    torch.float16: (2**-7, 2**-8),
}


# Realistic shapes: hidden 2048 / 4096 / 8192 (16 / 32 / 64 heads of 128), seq 4096 x batch 2.
# The middle one of each kernel is its headline shape (also run under torch.compile, --quick).
SHAPES: dict[str, list[dict[str, int]]] = {
    "rmsnorm": [{"tokens": TOKENS, "hidden": hidden} for hidden in (2048, 4096, 8192)],
    "swiglu": [{"tokens": TOKENS, "ffn": ffn_size(hidden)} for hidden in (2048, 4096, 8192)],
    "rotary": [{"seq": 4096, "batch": 2, "heads": heads, "head_dim": 128} for heads in (16, 32, 64)],
    "fused_linear_ce": [
        {"tokens": TOKENS, "hidden": hidden, "vocab": vocab} for hidden, vocab in ((2048, 32000), (4096, 128256), (8192, 128256))
    ],
}
# --dry-run-cpu: tiny shapes, the harness only.
TINY_SHAPES: dict[str, list[dict[str, int]]] = {
    "rmsnorm": [{"tokens": 64, "hidden": hidden} for hidden in (64, 128, 256)],  # three: the non-headline path too
    "swiglu": [{"tokens": 64, "ffn": 128}],
    "rotary": [{"seq": 16, "batch": 2, "heads": 4, "head_dim": 32}],
    "fused_linear_ce": [{"tokens": 64, "hidden": 32, "vocab": 256}],
}


def rope_freqs(seq: int, rot_dim: int, device: str, base: float = 10000.0) -> torch.Tensor:
    """Megatron's RotaryEmbedding angles: [seq, 1, 1, rot_dim], float32."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.float32, device=device) / rot_dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32, device=device), inv_freq)
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
        impls: dict[str, Callable[..., Any]],
    ) -> None:
        self.kernel, self.shape, self.leaves, self.extra, self.impls = kernel, shape, leaves, extra, impls


# ----------------------------------------------------------------------------------------------
# Each kernel's implementations, all with the signature (*leaves, *extra)


def our_functions() -> dict[str, tuple[Callable[..., Any], Callable[..., Any]]]:
    """kernel -> (ours, our PyTorch reference)."""
    from kernels import fused_linear_ce, rmsnorm, rotary, swiglu

    def rotary_ours(q: torch.Tensor, k: torch.Tensor, freqs: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return rotary.apply_rotary(q.transpose(0, 1), freqs), rotary.apply_rotary(k.transpose(0, 1), freqs)

    def rotary_reference(q: torch.Tensor, k: torch.Tensor, freqs: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return rotary.rotary_reference(q.transpose(0, 1), freqs), rotary.rotary_reference(k.transpose(0, 1), freqs)

    return {
        "rmsnorm": (rmsnorm.rmsnorm, rmsnorm.rmsnorm_reference),
        "swiglu": (swiglu.swiglu, swiglu.swiglu_reference),
        "rotary": (rotary_ours, rotary_reference),
        "fused_linear_ce": (fused_linear_ce.fused_linear_cross_entropy, fused_linear_ce.fused_linear_cross_entropy_reference),
    }


def liger_functions() -> dict[str, Callable[..., Any]]:
    """kernel -> Liger-Kernel's, called with our signature (see the module docstring)."""
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.rope import LigerRopeFunction
    from liger_kernel.ops.swiglu import LigerFusedGateUpSiLUMulFunction

    def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "gemma", False)

    def rotary(q: torch.Tensor, k: torch.Tensor, freqs: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        q_out, k_out = LigerRopeFunction.apply(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)

    def fused_linear_ce(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return LigerFusedLinearCrossEntropyFunction.apply(hidden, weight, targets)[0]  # mean, ignore_index -100

    return {
        "rmsnorm": rmsnorm,
        "swiglu": LigerFusedGateUpSiLUMulFunction.apply,
        "rotary": rotary,
        "fused_linear_ce": fused_linear_ce,
    }


def make_cases(
    only: set[str], shapes: dict[str, list[dict[str, int]]], device: str, dtype: torch.dtype, dry_run: bool, compile_all: bool
) -> Iterator[Case]:
    """One case at a time, so only its tensors are allocated."""
    ours = our_functions()
    liger = liger_functions()  # imported in the dry run too: the adapters' names exist
    backend = "eager" if dry_run else "inductor"  # dry run: dynamo traces, no C++ toolchain needed

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device=device) * scale).to(dtype).requires_grad_()

    def impls(kernel: str, headline: bool) -> dict[str, Callable[..., Any]]:
        triton_fn, reference = ours[kernel]
        # Dry run: Liger's kernels need a GPU (or the bridges of tests/test_kernels_liger.py): its entries
        # are dropped below; the reference stands in for ours unless TRITON_INTERPRET=1 runs them interpreted.
        liger_fn = reference if dry_run else liger[kernel]
        if dry_run and os.environ.get("TRITON_INTERPRET") != "1":
            triton_fn = reference
        out = {OURS: triton_fn, "liger": liger_fn, "eager": reference}
        if headline or compile_all:  # Inductor compiles a forward and a backward per shape: seconds each
            out["compile"] = torch.compile(reference, dynamic=False, backend=backend)
            out["triton_compile"] = torch.compile(triton_fn, dynamic=False, backend=backend)
            out["liger_compile"] = torch.compile(liger_fn, dynamic=False, backend=backend)
        if dry_run:  # Liger's side would be our reference under its name: no liger figure is emitted
            out = {name: fn for name, fn in out.items() if not name.startswith("liger")}
        return out

    for kernel in KERNELS:
        if kernel not in only:
            continue
        for index, shape in enumerate(shapes[kernel]):
            headline = index == len(shapes[kernel]) // 2
            if kernel == "rmsnorm":
                leaves, extra = [randn(shape["tokens"], shape["hidden"]), randn(shape["hidden"], scale=0.1)], (1e-5,)
            elif kernel == "swiglu":
                leaves, extra = [randn(shape["tokens"], 2 * shape["ffn"])], ()
            elif kernel == "rotary":
                seq, batch, heads, head_dim = shape["seq"], shape["batch"], shape["heads"], shape["head_dim"]
                freqs = rope_freqs(seq, head_dim, device)
                # HF passes cos/sin in the activations' dtype, [seq, rot_dim].
                cos, sin = torch.cos(freqs[:, 0, 0]).to(dtype), torch.sin(freqs[:, 0, 0]).to(dtype)
                leaves, extra = [randn(batch, seq, heads, head_dim), randn(batch, seq, heads, head_dim)], (freqs, cos, sin)
            else:
                tokens, vocab = shape["tokens"], shape["vocab"]
                targets = torch.randint(0, vocab, (tokens,), device=device)
                targets[torch.rand(tokens, device=device) < 0.05] = -100  # some padding
                leaves, extra = (
                    [randn(tokens, shape["hidden"]), randn(vocab, shape["hidden"], scale=shape["hidden"] ** -0.5)],
                    (targets,),
                )
            yield Case(kernel, shape, leaves, extra, impls(kernel, headline))


# ----------------------------------------------------------------------------------------------
# Measuring


def as_list(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, tuple | list) else [out]


def run_once(case: Case, fn: Callable[..., Any], grads: list[torch.Tensor | None]) -> list[torch.Tensor]:
    for leaf in case.leaves:
        leaf.grad = None
    outs = as_list(fn(*case.leaves, *case.extra))
    torch.autograd.backward(outs, [g for g in grads] if outs[0].dim() else None)
    return outs


def grads_like(outs: list[torch.Tensor]) -> list[torch.Tensor | None]:
    """An incoming gradient per output, in that output's own layout (randn_like keeps strides):
    neither side pays a copy for a layout it did not produce."""
    return [torch.randn_like(o) if o.dim() else None for o in outs]


class Clock:
    """CUDA events and the allocator's peak on a GPU; perf_counter and no memory figure on CPU."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time_ms(self, step: Callable[[], Any]) -> float:
        if not self.cuda:
            start = time.perf_counter()
            step()
            return (time.perf_counter() - start) * 1e3
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def peak_mib(self, step: Callable[[], Any]) -> float | None:
        if not self.cuda:
            return None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del out
        return peak / 2**20


def measure(case: Case, fn: Callable[..., Any], iters: int, clock: Clock) -> dict[str, float | None]:
    torch.manual_seed(1)
    with torch.no_grad():
        grads = grads_like(as_list(fn(*case.leaves, *case.extra)))
    for _ in range(3):  # warm-up: Triton/Inductor compilation, cuBLAS heuristics, allocator
        run_once(case, fn, grads)
    clock.sync()
    times = [clock.time_ms(lambda: run_once(case, fn, grads)) for _ in range(iters)]
    for leaf in case.leaves:
        leaf.grad = None
    peak = clock.peak_mib(lambda: run_once(case, fn, grads))
    return {"ms": statistics.median(times), "peak_mib": peak}


class WrongResult(Exception):
    """An implementation's output or gradients differ from the PyTorch reference beyond the dtype's
    tolerance: it is not timed."""


Results = list[tuple[str, torch.Tensor | None]]  # (name, tensor): the outputs, then each input's gradient


def results_of(case: Case, fn: Callable[..., Any], grads: list[torch.Tensor | None]) -> Results:
    """One forward + backward of ``fn`` on fresh copies of the leaves (an implementation may write
    into its inputs: Liger's RoPE rotates q and k in place), with the given incoming gradients."""
    leaves = [leaf.detach().clone().requires_grad_() for leaf in case.leaves]
    outs = as_list(fn(*leaves, *case.extra))
    # Liger's RoPE returns [batch, seq, heads, dim] where ours and the reference return [seq, batch, ...]:
    # its outputs are compared, and its incoming gradients given, with the first two dimensions swapped.
    outs = [o.transpose(0, 1) if g is not None and o.shape != g.shape else o for o, g in zip(outs, grads, strict=True)]
    torch.autograd.backward(outs, [g for g in grads] if outs[0].dim() else None)
    return [(f"output {i}", o.detach()) for i, o in enumerate(outs)] + [
        (f"grad of input {i}", None if leaf.grad is None else leaf.grad.detach()) for i, leaf in enumerate(leaves)
    ]


def reference_results(case: Case) -> tuple[Results, list[torch.Tensor | None]]:
    """The reference's outputs and gradients, and the incoming gradients every check uses."""
    torch.manual_seed(2)
    with torch.no_grad():
        grads = grads_like(as_list(case.impls["eager"](*case.leaves, *case.extra)))
    return results_of(case, case.impls["eager"], grads), grads


def shape_text(case: Case) -> str:
    return " ".join(f"{key}={value}" for key, value in case.shape.items())


def check(case: Case, name: str, reference: Results, grads: list[torch.Tensor | None]) -> dict[str, float]:
    """The largest differences of ``name`` from the reference over its outputs and gradients,
    {"max": ..., "mean": ...}; raises WrongResult past the dtype's tolerance (TOLERANCES)."""
    dtype = case.leaves[0].dtype
    tol_max, tol_mean = TOLERANCES[dtype]
    where = f"{case.kernel} {shape_text(case)} {str(dtype).removeprefix('torch.')}: {name}"
    got = results_of(case, case.impls[name], grads)
    if [label for label, _ in got] != [label for label, _ in reference]:
        raise WrongResult(f"{where} returns {[label for label, _ in got]}, the reference {[label for label, _ in reference]}")
    worst = {"max": 0.0, "mean": 0.0}
    for (label, mine), (_, theirs) in zip(got, reference, strict=True):
        if mine is None or theirs is None or mine.shape != theirs.shape:
            shapes = [None if t is None else tuple(t.shape) for t in (mine, theirs)]
            raise WrongResult(f"{where}: {label} is {shapes[0]}, the reference's {shapes[1]}")
        diff = (mine.float() - theirs.float()).abs()
        magnitude = theirs.float().abs()
        largest = (diff.max() / magnitude.max().clamp_min(1e-30)).item()
        mean = (diff.mean() / magnitude.mean().clamp_min(1e-30)).item()
        del diff, magnitude
        # `not <=`: a NaN anywhere fails too (every comparison with NaN is false)
        if not (largest <= tol_max and mean <= tol_mean):
            raise WrongResult(
                f"{where} differs from the PyTorch reference in {label}: max|diff|/max|ref| {largest:.3g} "
                f"(tolerance {tol_max:.3g}), mean|diff|/mean|ref| {mean:.3g} (tolerance {tol_mean:.3g}); not timed"
            )
        worst = {"max": max(worst["max"], largest), "mean": max(worst["mean"], mean)}
    return worst


def _one_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:200]


def checked(case: Case, row: dict[str, Any], clock: Clock) -> list[str]:
    """The implementations that may be timed: each checked against the reference first (the module
    docstring); the others get ``<impl>_refused`` or ``<impl>_error`` in ``row``."""
    try:
        reference, grads = reference_results(case)
    except Exception as error:  # nothing can be checked, so nothing is timed; the last line must still be the JSON
        row["check_error"] = f"the reference failed, nothing timed: {_one_line(error)}"
        return []
    passed, diffs = [], {}
    for name in case.impls:
        if name == "eager":  # the reference itself
            passed.append(name)
            continue
        try:
            diffs[name] = check(case, name, reference, grads)
            passed.append(name)
        except WrongResult as error:
            row[f"{name}_refused"] = str(error)
        except Exception as error:  # e.g. torch.compile failing on this stack: report, go on
            row[f"{name}_error"] = _one_line(error)
    del reference, grads  # not held while the timings measure peak memory
    if clock.cuda:
        torch.cuda.empty_cache()
    row["check_vs_eager"] = {name: {key: float(f"{value:.3g}") for key, value in d.items()} for name, d in diffs.items()}
    if OURS in diffs:
        row["max_rel_diff_vs_eager"] = diffs[OURS]["max"]
    if f"{OURS}_refused" in row:
        return []  # every figure is a ratio to ours: a wrong kernel of ours leaves the shape untimed
    return passed


def bench_case(case: Case, iters: int, repeats: int, clock: Clock) -> dict[str, Any]:
    row: dict[str, Any] = {"kernel": case.kernel, "dtype": str(case.leaves[0].dtype).removeprefix("torch."), **case.shape}
    timed = checked(case, row, clock)
    per_round: dict[str, list[dict[str, float | None]]] = {name: [] for name in timed}
    for round_ in range(repeats):
        names = timed if round_ % 2 == 0 else timed[::-1]  # alternate who goes first
        for name in names:
            if f"{name}_error" in row:
                continue
            try:
                per_round[name].append(measure(case, case.impls[name], iters, clock))
            except Exception as error:  # e.g. torch.compile failing on this stack: report, go on
                row[f"{name}_error"] = _one_line(error)
                per_round[name] = []
                if clock.cuda:
                    torch.cuda.empty_cache()
    row["per_round_ms"] = {name: [round(r["ms"], 4) for r in rounds] for name, rounds in per_round.items() if rounds}
    for name, rounds in per_round.items():
        if not rounds:
            continue
        ms = [r["ms"] for r in rounds]
        row[f"{name}_ms"] = round(statistics.median(ms), 4)
        row[f"{name}_ms_range"] = [round(min(ms), 4), round(max(ms), 4)]
        if rounds[0]["peak_mib"] is not None:
            row[f"{name}_peak_mib"] = round(statistics.median(r["peak_mib"] for r in rounds), 1)
    row["per_round_ratios"] = round_ratios(per_round)
    for name, values in row["per_round_ratios"].items():
        row[name] = round(statistics.median(values), 3)
    return row


def round_ratios(per_round: dict[str, list[dict[str, float | None]]]) -> dict[str, list[float]]:
    """Per-round ratios of ours against each peer: speed (> 1: ours faster), memory (< 1: ours less)."""
    ratios: dict[str, list[float]] = {}
    pairs = [(OURS, peer, peer) for peer in PEERS] + [("triton_compile", "liger_compile", "liger_compiled")]
    for mine, other, label in pairs:
        a, b = per_round.get(mine, []), per_round.get(other, [])
        if not a or len(a) != len(b):
            continue
        ratios[f"speedup_vs_{label}"] = [y["ms"] / x["ms"] for x, y in zip(a, b, strict=True)]
        if a[0]["peak_mib"] is not None and b[0]["peak_mib"] is not None:
            ratios[f"mem_ratio_vs_{label}"] = [x["peak_mib"] / max(y["peak_mib"], 1e-9) for x, y in zip(a, b, strict=True)]
    return ratios


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def kernel_ratios(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """The issue's ratio names, per round: a geometric mean over the kernel's shapes (a shape
    whose side failed is left out of that ratio)."""
    out: dict[str, list[float]] = {}
    names = {
        "speedup_vs_liger": "{}_vs_liger",
        "mem_ratio_vs_liger": "{}_peak_mem_vs_liger",
        "speedup_vs_compile": "{}_vs_torch_compile",
        "speedup_vs_liger_compiled": "{}_compiled_vs_liger_compiled",
    }
    for kernel in KERNELS:
        kernel_rows = [row for row in rows if row["kernel"] == kernel]
        for key, template in names.items():
            series = [row["per_round_ratios"][key] for row in kernel_rows if key in row["per_round_ratios"]]
            if series:
                out[template.format(kernel)] = [geomean(list(values)) for values in zip(*series, strict=True)]
    return out


def describe(row: dict[str, Any]) -> str:
    shape = " ".join(
        f"{k}={row[k]}" for k in ("tokens", "seq", "batch", "heads", "head_dim", "hidden", "ffn", "vocab") if k in row
    )
    parts = [f"{row['kernel']:<16} {shape:<40}"]
    for name in (OURS, "liger", "eager", "compile", "triton_compile", "liger_compile"):
        if f"{name}_ms" in row:
            low, high = row[f"{name}_ms_range"]
            mem = f" {row[f'{name}_peak_mib']:.0f} MiB" if f"{name}_peak_mib" in row else ""
            ratio = ""
            if f"speedup_vs_{name}" in row:  # ours x faster, our memory x of this one's
                mem_ratio = f", mem x{row[f'mem_ratio_vs_{name}']:.2f}" if f"mem_ratio_vs_{name}" in row else ""
                ratio = f" (triton x{row[f'speedup_vs_{name}']:.2f} faster{mem_ratio})"
            parts.append(f"{name} {row[f'{name}_ms']:.3f} ms [{low:.3f}, {high:.3f}]{mem}{ratio}")
        elif f"{name}_error" in row:
            parts.append(f"{name} failed: {row[f'{name}_error']}")
        elif f"{name}_refused" in row:
            parts.append(f"{name} REFUSED (wrong result, not timed)")
    if "speedup_vs_liger_compiled" in row:
        parts.append(f"compiled: triton x{row['speedup_vs_liger_compiled']:.2f} vs liger")
    if "max_rel_diff_vs_eager" in row:
        parts.append(f"max rel diff {row['max_rel_diff_vs_eager']:.1e}")
    elif "check_error" in row:
        parts.append(row["check_error"])
    return " | ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(KERNELS), help="comma-separated subset of " + ",".join(KERNELS))
    parser.add_argument("--iters", type=int, default=20, help="timed iterations per implementation per round (median)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; ratios are per round, then median [min, max]")
    parser.add_argument("--quick", action="store_true", help="headline shape of each kernel only")
    parser.add_argument("--compile-all", action="store_true", help="torch.compile at every shape, not only the headline one")
    parser.add_argument("--dry-run-cpu", action="store_true", help="the harness on CPU, references standing in (no figures)")
    args = parser.parse_args()
    only = {name.strip() for name in args.only.split(",") if name.strip()}
    if unknown := only - set(KERNELS):
        parser.error(f"unknown kernels: {sorted(unknown)}")

    dry_run = args.dry_run_cpu
    if not dry_run and not torch.cuda.is_available():
        print("no CUDA device: the Triton kernels need a GPU to be benchmarked (tests run them in the interpreter)")
        print(json.dumps({"cuda": False, "skipped": "no CUDA device", "machine": machine(PACKAGES)}))
        return
    if not dry_run and os.environ.pop("TRITON_INTERPRET", "0") not in ("0", ""):
        print("TRITON_INTERPRET was set: unset for the benchmark (the interpreter is not a GPU kernel)")

    import triton

    device, dtype = ("cpu", torch.float32) if dry_run else ("cuda", DTYPE)
    shapes = TINY_SHAPES if dry_run else SHAPES
    if args.quick:
        shapes = {kernel: [cases[len(cases) // 2]] for kernel, cases in shapes.items()}
    name = "cpu (dry run, see --dry-run-cpu)" if dry_run else torch.cuda.get_device_name()
    print(f"device: {name}; torch {torch.__version__}, triton {triton.__version__}; {dtype}, forward + backward")
    print(f"{args.repeats} rounds x {args.iters} iterations; rounds alternate the order of the implementations")
    torch.manual_seed(0)
    clock = Clock(device)
    rows = []
    for case in make_cases(only, shapes, device, dtype, dry_run, args.compile_all):
        torch._dynamo.reset()  # each shape compiles afresh; no recompile limits carried over
        row = bench_case(case, args.iters, args.repeats, clock)
        print(describe(row), flush=True)
        rows.append(row)
        del case
        if clock.cuda:
            torch.cuda.empty_cache()
    summary = ratio_keys(kernel_ratios(rows))
    for ratio, value in summary["ratios"].items():
        low, high = summary["spread"][ratio]
        print(f"{ratio:<42} {value:.3f} [{low:.3f}, {high:.3f}]")
    record: dict[str, Any] = {"cuda": not dry_run, "device": name, "torch": torch.__version__, "triton": triton.__version__}
    if dry_run:
        ours_ran = "ours interpreted" if os.environ.get("TRITON_INTERPRET") == "1" else "references stood in for ours"
        record["dry_run_cpu"] = f"Liger's kernels not run (they need a GPU), {ours_ran}: the figures check the harness only"
    refused = [row[key] for row in rows for key in row if key.endswith("_refused")]
    record |= {"repeats": args.repeats, "iters": args.iters, "results": rows, **summary, "machine": machine(PACKAGES)}
    record["refused"] = refused
    for message in refused:
        print(f"REFUSED: {message}")
    print(json.dumps(record))
    if refused:  # after the JSON line, which stays the last: the figures of the kernels that matched are kept
        sys.exit(1)


if __name__ == "__main__":
    main()
