"""SwiGLU: y = silu(gate) * up, where the input's last dimension is [gate, up] concatenated.

That is megatron-core's gated_linear_unit layout: fc1 produces [..., 2 * ffn] and the MLP does
`gate, up = torch.chunk(x, 2, dim=-1)`; with tensor parallelism each rank's local fc1 output
has that layout too, so the kernel applies per rank unchanged.

Elementwise and memory-bound: the win over eager PyTorch is one read of x and one write of y
(eager materialises sigmoid/silu intermediates), and a backward that recomputes sigmoid from
the saved input instead of saving activations:
    s = sigmoid(gate), silu = gate * s
    d_up   = dy * silu
    d_gate = dy * up * s * (1 + gate * (1 - s))
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._tl import sigmoid
from kernels._utils import Impl, acc_dtype, check_dtype, check_impl, next_power_of_2, num_warps_for, torch_acc_dtype

MAX_BLOCK = 1024  # columns per program; rows wider than this use several programs


@triton.jit
def _swiglu_fwd_kernel(
    x_ptr,
    y_ptr,
    x_row_stride,
    y_row_stride,
    n_cols,  # width of gate (= width of up = width of y)
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x_row = x_ptr + row * x_row_stride
    gate = tl.load(x_row + cols, mask=mask, other=0.0).to(ACC)
    up = tl.load(x_row + n_cols + cols, mask=mask, other=0.0).to(ACC)
    y = gate * sigmoid(gate) * up
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(
    dy_ptr,
    x_ptr,
    dx_ptr,
    dy_row_stride,
    x_row_stride,
    dx_row_stride,
    n_cols,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x_row = x_ptr + row * x_row_stride
    gate = tl.load(x_row + cols, mask=mask, other=0.0).to(ACC)
    up = tl.load(x_row + n_cols + cols, mask=mask, other=0.0).to(ACC)
    dy = tl.load(dy_ptr + row * dy_row_stride + cols, mask=mask, other=0.0).to(ACC)
    s = sigmoid(gate)
    silu = gate * s
    d_gate = dy * up * s * (1.0 + gate * (1.0 - s))
    d_up = dy * silu
    dx_row = dx_ptr + row * dx_row_stride
    tl.store(dx_row + cols, d_gate.to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(dx_row + n_cols + cols, d_up.to(dx_ptr.dtype.element_ty), mask=mask)


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _grid(n_rows: int, n_cols: int) -> tuple[tuple[int, int], int]:
    block = min(MAX_BLOCK, next_power_of_2(n_cols))
    return (n_rows, triton.cdiv(n_cols, block)), block


class SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] % 2:
            raise ValueError(f"the last dimension holds [gate, up] and must be even, got {x.shape[-1]}")
        check_dtype(x, "x")
        x2 = _as_rows(x)
        n_rows, n_cols = x2.shape[0], x2.shape[1] // 2
        y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
        grid, block = _grid(n_rows, n_cols)
        if n_rows and n_cols:
            _swiglu_fwd_kernel[grid](
                x2, y, x2.stride(0), y.stride(0), n_cols, ACC=acc_dtype(x.dtype), BLOCK=block, num_warps=num_warps_for(block)
            )
        ctx.save_for_backward(x2)
        ctx.x_shape = x.shape
        return y.view(*x.shape[:-1], n_cols)

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> torch.Tensor:
        (x2,) = ctx.saved_tensors
        n_rows, n_cols = x2.shape[0], x2.shape[1] // 2
        dy2 = _as_rows(dy)
        dx = torch.empty_like(x2)
        grid, block = _grid(n_rows, n_cols)
        if n_rows and n_cols:
            _swiglu_bwd_kernel[grid](
                dy2,
                x2,
                dx,
                dy2.stride(0),
                x2.stride(0),
                dx.stride(0),
                n_cols,
                ACC=acc_dtype(x2.dtype),
                BLOCK=block,
                num_warps=num_warps_for(block),
            )
        return dx.view(ctx.x_shape)


def swiglu_reference(x: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch SwiGLU, megatron's chunk convention, computed in float32 and rounded once."""
    gate, up = torch.chunk(x.to(torch_acc_dtype(x.dtype)), 2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)


def swiglu(x: torch.Tensor, impl: Impl = "triton") -> torch.Tensor:
    """silu(gate) * up for x = [..., 2 * ffn] holding [gate, up]; returns [..., ffn] in x's dtype."""
    check_impl(impl)
    if impl == "torch":
        return swiglu_reference(x)
    return SwiGLUFunction.apply(x)
