"""Our Triton kernels against Liger-Kernel's (the peer, PyPI liger-kernel), outputs and gradients.

Both sides run their Triton kernels: under TRITON_INTERPRET=1 on CPU (as the other kernel
tests do), compiled on a GPU. Launch counts prove that each result came from a Triton kernel
on both sides, not from a PyTorch fallback.

Liger's side runs in a fresh interpreter (this file run as a module), with TRITON_INTERPRET=1
set before triton is imported: Liger's kernels call tl.sum, tl.max, tl.sigmoid, which are
themselves @triton.jit functions, built in compiled mode when triton.language was imported
before the variable was set, as it is in a pytest session; the interpreter then refuses them
(ours avoid them, see kernels/_tl.py). It saves its outputs, gradients and launch counts; the
test compares them with ours, computed here on the same inputs.

Conventions matched (ours -> Liger):
- RMSNorm: ours computes in float32 and rounds once, which is Liger's casting_mode="gemma"
  with offset=0 (Liger's default "llama" rounds x * rstd to the input dtype before the weight
  product, as HF Llama does). in_place=False: Liger's default writes dx into dy.
- SwiGLU: ours takes x = [gate, up] (megatron's fc1 layout). Liger's LigerSiLUMulFunction takes
  gate and up apart (it gets x.chunk(2, -1)); its LigerFusedGateUpSiLUMulFunction takes our
  layout as is, but only 2-D (for [batch, seq, 2 * ffn] its backward returns a [rows, 2 * ffn]
  gradient, which autograd rejects: a Liger 0.8.5 bug; we flatten the rows). Liger rounds
  silu(gate) to the input dtype before multiplying by up: in 16-bit dtypes two roundings
  against our one.
- RoPE: ours takes t [seq, batch, heads, head_dim] and megatron's angles freqs [seq, 1, 1, rot];
  Liger takes q and k as [batch, heads, seq, head_dim] views of [batch, seq, heads, head_dim]
  storage (HF's layout) with cos/sin [seq, rot] precomputed (HF's layout, both halves
  repeated). Liger gets t.transpose(0, 1) made contiguous, viewed as [batch, heads, seq, dim],
  and cos(freqs), sin(freqs) in float32; its outputs and gradients are transposed back. It
  rotates q and k (fewer heads: GQA) in one call, ours in two. Liger rotates in place: it gets
  clones.
- Fused linear cross-entropy: ignore_index, z_loss = Liger's lse_square_scale, reduction mean
  and sum, a loss scaled before backward. Label smoothing is not compared: ours has none. Same
  chunking on both sides (ours took Liger's chunk-size heuristic), so bf16 weight gradients are
  rounded at the same points.

Three gaps of Triton 3.9's interpreter that Liger's kernels hit (not Liger bugs: they run
compiled on GPUs) are bridged around the Liger calls, on CPU only:
- a Python float kernel argument (eps, offset, gate_multiplier) stays a Python float in the
  interpreter, where the compiler passes an fp32 scalar; Liger calls `.to(tl.float32)` on it.
  We convert it to an fp32 scalar, as the compiler does.
- Liger's RMSNorm calls libdevice's `rsqrt` bound as a module global, which the interpreter
  does not replace by its numpy version (it patches `tl.math` only). We point that global at
  `tl.math.rsqrt`, which is what Liger itself imports on Triton < 3.
- bf16 x bf16 arithmetic (Liger's SwiGLU multiplies silu(gate), rounded to bf16, by up in
  bf16): the interpreter holds bf16 as uint16 bits and multiplies the bits as integers
  (garbage, ~1e36). We compute such + - * / in float32 and round once to bf16, which is the
  correctly rounded bf16 result a GPU gives. Ours never does bf16 arithmetic (float32 inside).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT, assert_close, count_all_launches, count_launches, device, interpret, load_kernels, load_liger

DEV = device()
Result = tuple[list[torch.Tensor], dict[str, int]]  # output(s) then gradients; launches per kernel


def _randn(shape: tuple[int, ...], dtype: torch.dtype, seed: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale + shift).to(DEV, dtype)


def _grads(
    out: torch.Tensor | list[torch.Tensor], leaves: list[torch.Tensor], grad_out: list[torch.Tensor] | None
) -> list[torch.Tensor]:
    outs = out if isinstance(out, list) else [out]
    torch.autograd.backward(outs, grad_out)
    return [o.detach() for o in outs] + [leaf.grad for leaf in leaves]


def _leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_() for t in tensors]


# ----------------------------------------------------------------------------------------------
# The cases: inputs, our side, Liger's side (each a function of the case's parameters)


def _rmsnorm_inputs(shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
    return [_randn(shape, dtype, 0, 3, 0.5), _randn(shape[-1:], dtype, 1, 0.3, 1), _randn(shape, dtype, 2)]


def ours_rmsnorm(shape: tuple[int, ...], dtype: torch.dtype) -> Result:
    x, w, dy = _rmsnorm_inputs(shape, dtype)
    ours = load_kernels("rmsnorm")
    leaves = _leaves(x, w)
    with count_launches(ours) as launches:
        tensors = _grads(ours.rmsnorm(*leaves, eps=1e-5), leaves, [dy])
    return tensors, launches.counts


def liger_rmsnorm(shape: tuple[int, ...], dtype: torch.dtype) -> Result:
    x, w, dy = _rmsnorm_inputs(shape, dtype)
    rms = load_liger("rms_norm")
    leaves = _leaves(x, w)
    with count_all_launches(rms, ("_rms_norm_forward_kernel", "_rms_norm_backward_kernel")) as launches:
        tensors = _grads(rms.LigerRMSNormFunction.apply(*leaves, 1e-5, 0.0, "gemma", False), leaves, [dy])
    return tensors, launches.counts


SWIGLU_PARTS = ("forward", "backward", "fused_gate_up_forward", "fused_gate_up_backward")


def _swiglu_inputs(dtype: torch.dtype) -> list[torch.Tensor]:
    return [_randn((2, 3, 2 * 40), dtype, 0, 2), _randn((2, 3, 40), dtype, 1)]


def ours_swiglu(dtype: torch.dtype) -> Result:
    x, dy = _swiglu_inputs(dtype)
    ours = load_kernels("swiglu")
    leaves = _leaves(x)
    with count_launches(ours) as launches:
        tensors = _grads(ours.swiglu(*leaves), leaves, [dy])
    return tensors + tensors, launches.counts  # compared with Liger's two functions


def liger_swiglu(dtype: torch.dtype) -> Result:
    x, dy = _swiglu_inputs(dtype)
    swiglu = load_liger("swiglu")
    split, fused = _leaves(x), _leaves(x)
    with count_all_launches(swiglu, tuple(f"_swiglu_{part}_kernel" for part in SWIGLU_PARTS)) as launches:
        tensors = _grads(swiglu.LigerSiLUMulFunction.apply(*split[0].chunk(2, dim=-1)), split, [dy])
        # Rows flattened: for a 3-D input Liger 0.8.5's backward returns the gradient as [rows, 2 * ffn],
        # which autograd rejects (its forward does restore the leading dimensions).
        y = swiglu.LigerFusedGateUpSiLUMulFunction.apply(fused[0].reshape(-1, x.shape[-1])).view(dy.shape)
        tensors += _grads(y, fused, [dy])
    return tensors, launches.counts


def _rotary_inputs(head_dim: int, rot_dim: int, dtype: torch.dtype) -> list[torch.Tensor]:
    seq, batch, q_heads, k_heads = 5, 2, 4, 2
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32) + 100, inv_freq)
    freqs = torch.cat((freqs, freqs), dim=-1).to(DEV)  # [seq, rot]: megatron's and HF's angles
    q, k = _randn((seq, batch, q_heads, head_dim), dtype, 0), _randn((seq, batch, k_heads, head_dim), dtype, 1)
    return [q, k, _randn(q.shape, dtype, 2), _randn(k.shape, dtype, 3), freqs]


def ours_rotary(head_dim: int, rot_dim: int, dtype: torch.dtype) -> Result:
    q, k, dq, dk, freqs = _rotary_inputs(head_dim, rot_dim, dtype)
    ours = load_kernels("rotary")
    leaves = _leaves(q, k)
    with count_launches(ours) as launches:
        outs = [ours.apply_rotary(t, freqs[:, None, None, :]) for t in leaves]
        tensors = _grads(outs, leaves, [dq, dk])
    return tensors, launches.counts


def liger_rotary(head_dim: int, rot_dim: int, dtype: torch.dtype) -> Result:
    q, k, dq, dk, freqs = _rotary_inputs(head_dim, rot_dim, dtype)
    rope = load_liger("rope")
    leaves = _leaves(q.transpose(0, 1).contiguous(), k.transpose(0, 1).contiguous())  # HF's storage [b, s, h, d]
    cos, sin = torch.cos(freqs), torch.sin(freqs)
    with count_all_launches(rope, ("_triton_rope",)) as launches:
        # Clones: Liger rotates in place. Views [b, h, s, d] in, the same views out.
        q_out, k_out = rope.LigerRopeFunction.apply(
            leaves[0].clone().transpose(1, 2), leaves[1].clone().transpose(1, 2), cos, sin
        )
        tensors = _grads([q_out.transpose(1, 2), k_out.transpose(1, 2)], leaves, [dq.transpose(0, 1), dk.transpose(0, 1)])
    return [t.transpose(0, 1) for t in tensors], launches.counts  # back to [s, b, h, d]


def _flce_inputs(ignore_index: int, dtype: torch.dtype) -> list[torch.Tensor]:
    tokens, hidden, vocab = 12, 16, 40  # 3 chunks of 4 tokens on both sides
    targets = torch.randint(1, vocab, (tokens,), generator=torch.Generator().manual_seed(2))
    targets[[1, 6, 7]] = ignore_index
    return [_randn((tokens, hidden), dtype, 0), _randn((vocab, hidden), dtype, 1, 2 / hidden**0.5), targets.to(DEV)]


def ours_flce(ignore_index: int, z_loss: float, reduction: str, loss_scale: float, dtype: torch.dtype) -> Result:
    h, w, targets = _flce_inputs(ignore_index, dtype)
    ours = load_kernels("fused_linear_ce")
    leaves = _leaves(h, w)
    with count_launches(ours) as launches:
        loss = ours.fused_linear_cross_entropy(*leaves, targets, ignore_index=ignore_index, z_loss=z_loss, reduction=reduction)
        tensors = _grads(loss * loss_scale, leaves, None)
    return tensors, launches.counts


def liger_flce(ignore_index: int, z_loss: float, reduction: str, loss_scale: float, dtype: torch.dtype) -> Result:
    h, w, targets = _flce_inputs(ignore_index, dtype)
    flce = load_liger("fused_linear_cross_entropy")
    leaves = _leaves(h, w)
    with count_all_launches(flce, ("liger_cross_entropy_kernel", "element_mul_kernel")) as launches:
        # (input, weight, target, bias, ce_weight, ignore_index, lse_square_scale, label_smoothing, reduction)
        loss = flce.LigerFusedLinearCrossEntropyFunction.apply(
            *leaves, targets, None, None, ignore_index, z_loss, 0.0, reduction
        )[0]
        tensors = _grads(loss * loss_scale, leaves, None)
    return tensors, launches.counts


F32, BF16 = torch.float32, torch.bfloat16
# name -> (ours, Liger's, arguments, tolerance scale, our launches, Liger's launches)
CASES: dict[str, tuple[Callable[..., Result], Callable[..., Result], tuple, float, dict[str, int], dict[str, int]]] = {}
for _dtype, _name in ((F32, "fp32"), (BF16, "bf16")):
    for _shape in ((5, 37), (2, 3, 64)):
        CASES[f"rmsnorm-{'x'.join(map(str, _shape))}-{_name}"] = (
            ours_rmsnorm,
            liger_rmsnorm,
            (_shape, _dtype),
            1.0,
            {"_rmsnorm_fwd_kernel": 1, "_rmsnorm_bwd_kernel": 1},
            {"_rms_norm_forward_kernel": 1, "_rms_norm_backward_kernel": 1},
        )
    # Liger's extra rounding of silu(gate) in 16-bit dtypes: two bf16 steps.
    CASES[f"swiglu-{_name}"] = (
        ours_swiglu,
        liger_swiglu,
        (_dtype,),
        1.0 if _dtype == F32 else 2.0,
        {"_swiglu_fwd_kernel": 1, "_swiglu_bwd_kernel": 1},
        {f"_swiglu_{part}_kernel": 1 for part in SWIGLU_PARTS},
    )
    for _head_dim, _rot_dim in ((16, 16), (24, 16)):
        CASES[f"rotary-d{_head_dim}-rot{_rot_dim}-{_name}"] = (
            ours_rotary,
            liger_rotary,
            (_head_dim, _rot_dim, _dtype),
            1.0,
            {"_rope_kernel": 4},  # q and k, forward and backward
            {"_triton_rope": 2},  # q and k together, forward and backward
        )
    for _ignore, _z, _reduction in ((-100, 0.0, "mean"), (-100, 1e-2, "mean"), (0, 1e-3, "sum")):
        CASES[f"flce-ignore{_ignore}-z{_z}-{_reduction}-{_name}"] = (
            ours_flce,
            liger_flce,
            (_ignore, _z, _reduction, 1.0, _dtype),
            1.0,
            {"_ce_fwd_bwd_kernel": 3},
            {"liger_cross_entropy_kernel": 3},  # backward of a loss used as is: no rescaling kernel
        )
# A scaled loss: both rescale their gradients, computed in forward, in backward (Liger in Triton).
CASES["flce-scaled-fp32"] = (
    ours_flce,
    liger_flce,
    (-100, 0.0, "mean", 3.0, F32),
    1.0,
    {"_ce_fwd_bwd_kernel": 3},
    {"liger_cross_entropy_kernel": 3, "element_mul_kernel": 2},  # grad_input and grad_weight
)


# ----------------------------------------------------------------------------------------------
# Liger's side, in a fresh interpreter


@contextmanager
def liger_on_interpreter() -> Iterator[None]:
    """Bridge the two interpreter gaps of the module docstring (nothing to do on a GPU)."""
    if not interpret():
        yield
        return
    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as triton_interpreter

    convert = triton_interpreter._implicit_cvt

    def implicit_cvt(arg):
        if isinstance(arg, float):  # what the compiler makes of a float argument: an fp32 scalar
            return tl.tensor(triton_interpreter.TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
        return convert(arg)

    builder = triton_interpreter.InterpreterBuilder
    binary_op = builder.binary_op

    def bf16_binary_op(self, lhs, rhs, op):
        # bf16 is held as its uint16 bits: numpy would do integer arithmetic on them. In float32
        # and rounded once: the correctly rounded bf16 result (24 >= 2 * 8 + 2 bits: no double
        # rounding error for + - * /), what the GPU computes.
        if lhs.dtype.scalar == rhs.dtype.scalar == tl.bfloat16 and op in (np.add, np.subtract, np.multiply, np.divide):
            return self.cast_impl(
                binary_op(self, self.cast_impl(lhs, tl.float32), self.cast_impl(rhs, tl.float32), op), tl.bfloat16
            )
        return binary_op(self, lhs, rhs, op)

    rms = load_liger("rms_norm")
    saved_rsqrt = rms.rsqrt
    triton_interpreter._implicit_cvt = implicit_cvt
    rms.rsqrt = lambda x: tl.math.rsqrt(x)  # looked up at call time, when the interpreter has patched tl.math
    builder.binary_op = bf16_binary_op
    try:
        yield
    finally:
        triton_interpreter._implicit_cvt, rms.rsqrt, builder.binary_op = convert, saved_rsqrt, binary_op


def run_liger_cases(out: Path) -> None:
    results = {}
    with liger_on_interpreter():
        for name, (_, liger, args, *_rest) in CASES.items():
            tensors, counts = liger(*args)
            results[name] = {"tensors": [t.detach().cpu() for t in tensors], "launches": counts}
    torch.save(results, out)


@pytest.fixture(scope="module")
def liger_results(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("liger") / "results.pt"
    env = {**os.environ, "TRITON_INTERPRET": "1" if interpret() else "0"}
    result = subprocess.run(
        [sys.executable, "-m", "tests.test_kernels_liger", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return torch.load(out, weights_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_matches_liger(name: str, liger_results: dict) -> None:
    ours, _, args, scale, ours_expected, liger_expected = CASES[name]
    tensors, counts = ours(*args)
    liger = liger_results[name]
    assert counts == ours_expected, "our result did not come from our Triton kernels alone"
    assert liger["launches"] == liger_expected, "Liger's result did not come from its Triton kernels alone"
    assert len(tensors) == len(liger["tensors"])
    for i, (got, expected) in enumerate(zip(tensors, liger["tensors"], strict=True)):
        diff = (got.detach().double().cpu() - expected.double()).abs().max().item()
        print(f"{name}[{i}] max abs diff {diff:.3g}, relative to max|Liger| {diff / max(expected.abs().max().item(), 1e-30):.3g}")
        assert_close(got.detach().cpu(), expected, scale=scale)


if __name__ == "__main__":
    run_liger_cases(Path(sys.argv[1]))
