"""Rotary position embedding (RoPE) in megatron-core's layout and convention.

t is [seq, batch, heads, head_dim] (megatron's "sbhd"); freqs holds the rotation angles,
[seq, 1, 1, rot_dim] as megatron's RotaryEmbedding returns them (or [seq, rot_dim]). As in
megatron's non-interleaved `_apply_rotary_pos_emb_bshd`, with h = rot_dim / 2:
    out[..., :h]       = t1 * cos(f1) * mscale - t2 * sin(f1) * mscale      (t1 = t[..., :h])
    out[..., h:rot]    = t2 * cos(f2) * mscale + t1 * sin(f2) * mscale      (t2 = t[..., h:rot])
    out[..., rot:]     = t[..., rot:]                                       (partial rotary)
i.e. t * cos + rotate_half(t) * sin. Megatron's freqs repeat their halves (f1 == f2); the
kernel reads both halves anyway, so it agrees with the reference for any freqs.

One program per (position, batch) pair handles all heads: cos/sin are computed once per
program in float32 and reused for every head, and t can be a strided view (megatron's q/k
come out of the fused QKV projection as views) as long as head_dim is contiguous.

The backward is the transposed rotation (the Jacobian is block-diagonal in (t1, t2)):
    dt1 = g1 * cos(f1) + g2 * sin(f2),   dt2 = g2 * cos(f2) - g1 * sin(f1)
No gradient flows to freqs (megatron's are a buffer).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._utils import Impl, acc_dtype, check_dtype, check_impl, next_power_of_2, num_warps_for, torch_acc_dtype

MAX_TILE = 4096  # elements per half-tile (heads x rot_dim/2) of one loop step


@triton.jit
def _rope_kernel(
    t_ptr,
    freqs_ptr,
    out_ptr,
    batch,
    n_heads,
    half,  # rot_dim // 2
    t_stride_s,
    t_stride_b,
    t_stride_h,
    out_stride_s,
    out_stride_b,
    out_stride_h,
    freqs_stride_s,
    mscale,
    BACKWARD: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    s = pid // batch
    b = pid % batch
    d = tl.arange(0, BLOCK_D)
    d_mask = d < half
    # Angles in float32 whatever t's dtype: cos/sin of large angles (long sequences) need it.
    # On NVIDIA GPUs tl.cos/tl.sin lower to libdevice's cosf/sinf (full range reduction, like
    # torch.cos), not the .approx instructions.
    f_row = freqs_ptr + s * freqs_stride_s
    f1 = tl.load(f_row + d, mask=d_mask, other=0.0).to(ACC)
    f2 = tl.load(f_row + half + d, mask=d_mask, other=0.0).to(ACC)
    cos1 = tl.cos(f1) * mscale
    sin1 = tl.sin(f1) * mscale
    cos2 = tl.cos(f2) * mscale
    sin2 = tl.sin(f2) * mscale
    if BACKWARD:
        # Transposed rotation: swap which sine multiplies which half, and its sign.
        sin1, sin2 = -sin2, -sin1
    t_base = t_ptr + s * t_stride_s + b * t_stride_b
    o_base = out_ptr + s * out_stride_s + b * out_stride_b
    for h_start in range(0, n_heads, BLOCK_H):
        h = h_start + tl.arange(0, BLOCK_H)
        mask = (h < n_heads)[:, None] & d_mask[None, :]
        t_offs = h[:, None] * t_stride_h + d[None, :]
        o_offs = h[:, None] * out_stride_h + d[None, :]
        x1 = tl.load(t_base + t_offs, mask=mask, other=0.0).to(ACC)
        x2 = tl.load(t_base + t_offs + half, mask=mask, other=0.0).to(ACC)
        y1 = x1 * cos1[None, :] - x2 * sin1[None, :]
        y2 = x2 * cos2[None, :] + x1 * sin2[None, :]
        tl.store(o_base + o_offs, y1.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(o_base + o_offs + half, y2.to(out_ptr.dtype.element_ty), mask=mask)


def _freqs_2d(freqs: torch.Tensor, seq: int) -> torch.Tensor:
    """[seq, 1, 1, rot] or [seq, rot] -> [seq, rot] with unit stride along rot."""
    if freqs.dim() == 4:
        if freqs.shape[1] != 1 or freqs.shape[2] != 1:
            raise ValueError(f"freqs must be [seq, 1, 1, rot_dim], got {tuple(freqs.shape)}")
        freqs = freqs[:, 0, 0, :]
    elif freqs.dim() != 2:
        raise ValueError(f"freqs must be [seq, 1, 1, rot_dim] or [seq, rot_dim], got {tuple(freqs.shape)}")
    if freqs.shape[0] != seq:
        raise ValueError(f"freqs cover {freqs.shape[0]} positions, t has {seq}")
    return freqs if freqs.stride(-1) == 1 else freqs.contiguous()


def _launch(t: torch.Tensor, freqs2: torch.Tensor, mscale: float, backward: bool) -> torch.Tensor:
    seq, batch, n_heads, head_dim = t.shape
    rot_dim = freqs2.shape[-1]
    if t.stride(-1) != 1:
        t = t.contiguous()
    out = torch.empty((seq, batch, n_heads, head_dim), dtype=t.dtype, device=t.device)
    if rot_dim < head_dim:  # partial rotary: the tail passes through unchanged
        out[..., rot_dim:] = t[..., rot_dim:]
    half = rot_dim // 2
    block_d = next_power_of_2(half)
    # Bound a program's tile (registers); loop over heads beyond it.
    block_h = min(next_power_of_2(n_heads), max(1, MAX_TILE // block_d))
    if seq * batch and n_heads and half:
        _rope_kernel[(seq * batch,)](
            t,
            freqs2,
            out,
            batch,
            n_heads,
            half,
            t.stride(0),
            t.stride(1),
            t.stride(2),
            out.stride(0),
            out.stride(1),
            out.stride(2),
            freqs2.stride(0),
            mscale,
            BACKWARD=backward,
            ACC=acc_dtype(t.dtype),
            BLOCK_H=block_h,
            BLOCK_D=block_d,
            num_warps=num_warps_for(block_h * block_d),
        )
    return out


class RotaryFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t: torch.Tensor, freqs: torch.Tensor, mscale: float) -> torch.Tensor:
        if t.dim() != 4:
            raise ValueError(f"t must be [seq, batch, heads, head_dim], got {tuple(t.shape)}")
        check_dtype(t, "t")
        freqs2 = _freqs_2d(freqs, t.shape[0])
        rot_dim = freqs2.shape[-1]
        if rot_dim % 2 or rot_dim > t.shape[-1]:
            raise ValueError(f"rot_dim={rot_dim} must be even and <= head_dim={t.shape[-1]}")
        ctx.save_for_backward(freqs2)
        ctx.mscale = mscale
        return _launch(t, freqs2, mscale, backward=False)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (freqs2,) = ctx.saved_tensors
        return _launch(grad, freqs2, ctx.mscale, backward=True), None, None


def rotary_reference(t: torch.Tensor, freqs: torch.Tensor, mscale: float = 1.0) -> torch.Tensor:
    """Plain PyTorch RoPE, megatron's rotate_half formula, computed in float32 and rounded once.

    Each half is written into one output tensor (no ``rotate_half`` and no ``cat``: eager makes
    no extra copies, and torch.compile fuses the whole rotation into one kernel).
    (Megatron itself rounds cos/sin to t's dtype first; in bf16 the two differ by about one
    bf16 step, see the tests.)"""
    acc = torch_acc_dtype(t.dtype)
    freqs2 = _freqs_2d(freqs, t.shape[0]).to(acc)[:, None, None, :]
    rot_dim = freqs2.shape[-1]
    half = rot_dim // 2
    cos, sin = torch.cos(freqs2) * mscale, torch.sin(freqs2) * mscale
    x1, x2 = t[..., :half].to(acc), t[..., half:rot_dim].to(acc)
    out = torch.empty_like(t)
    out[..., :half] = x1 * cos[..., :half] - x2 * sin[..., :half]
    out[..., half:rot_dim] = x2 * cos[..., half:] + x1 * sin[..., half:]
    if rot_dim < t.shape[-1]:
        out[..., rot_dim:] = t[..., rot_dim:]
    return out


def apply_rotary(t: torch.Tensor, freqs: torch.Tensor, mscale: float = 1.0, impl: Impl = "triton") -> torch.Tensor:
    """RoPE on t [seq, batch, heads, head_dim] with angles freqs [seq, 1, 1, rot_dim] (or
    [seq, rot_dim]); returns a new contiguous tensor of t's shape and dtype."""
    check_impl(impl)
    if impl == "torch":
        return rotary_reference(t, freqs, mscale)
    return RotaryFunction.apply(t, freqs, mscale)
