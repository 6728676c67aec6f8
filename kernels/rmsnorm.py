"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, over the last dimension.

The same function as torch.nn.RMSNorm (what megatron-core's local spec builds for
normalization="RMSNorm"). Statistics and the weight product are computed in float32 (float64
for float64 inputs) and the result is rounded once to the input dtype; in bf16, torch rounds
x / rms to bf16 before multiplying by the weight, so the two can differ by a bf16 step.

Forward: one program per row; the whole row sits in registers (hidden <= 65536), so x is read
once and y written once. The per-row 1/rms is saved for backward (4 bytes per row).

Backward, with x_hat = x * rstd and g = dy * weight:
    dx = rstd * (g - x_hat * mean(g * x_hat))
    dw = sum over rows of dy * x_hat
dw is a reduction over all rows: each persistent program (one per SM) loops over a slab of
rows, accumulates its partial dw in float32 registers and writes one row of a
[programs, hidden] buffer that torch sums at the end -- no atomics, deterministic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._tl import row_sum
from kernels._utils import (
    Impl,
    acc_dtype,
    check_dtype,
    check_impl,
    next_power_of_2,
    num_programs,
    num_warps_for,
    torch_acc_dtype,
)

MAX_HIDDEN = 65536  # one row must fit in one program's registers


@triton.jit
def _rmsnorm_fwd_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    rstd_ptr,
    x_row_stride,
    y_row_stride,
    n_cols,
    eps,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # int64: rows * stride can pass 2^31 elements
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(ACC)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(ACC)
    # Masked lanes load 0, so they add nothing to the sum; divide by the true width.
    rstd = 1.0 / tl.sqrt(row_sum(x * x) / n_cols + eps)
    tl.store(rstd_ptr + row, rstd)
    y = x * rstd * w
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_bwd_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    rstd_ptr,
    dx_ptr,
    dw_partial_ptr,
    dy_row_stride,
    x_row_stride,
    dx_row_stride,
    n_rows,
    n_cols,
    rows_per_program,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(ACC)
    dw_acc = tl.full([BLOCK], 0.0, dtype=ACC)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    for row in range(row_start, row_end):
        x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(ACC)
        dy = tl.load(dy_ptr + row * dy_row_stride + cols, mask=mask, other=0.0).to(ACC)
        rstd = tl.load(rstd_ptr + row)
        x_hat = x * rstd
        g = dy * w
        # Projection of g onto x_hat: the part of the gradient that only rescales the row,
        # which normalisation removes.
        dot = row_sum(g * x_hat) / n_cols
        dx = rstd * (g - x_hat * dot)
        tl.store(dx_ptr + row * dx_row_stride + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw_acc += dy * x_hat
    tl.store(dw_partial_ptr + pid * n_cols + cols, dw_acc, mask=mask)


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    """[..., hidden] -> [rows, hidden] with unit stride along hidden (a view when possible)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        n_cols = x.shape[-1]
        if weight.shape != (n_cols,):
            raise ValueError(f"weight must have shape ({n_cols},), got {tuple(weight.shape)}")
        if n_cols > MAX_HIDDEN:
            raise ValueError(f"hidden size {n_cols} > {MAX_HIDDEN} is not supported by the Triton RMSNorm")
        check_dtype(x, "x")
        check_dtype(weight, "weight")
        x2 = _as_rows(x)
        w = weight.contiguous()
        n_rows = x2.shape[0]
        y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
        rstd = torch.empty(n_rows, dtype=torch_acc_dtype(x.dtype), device=x.device)
        block = next_power_of_2(n_cols)
        if n_rows > 0:
            _rmsnorm_fwd_kernel[(n_rows,)](
                x2,
                w,
                y,
                rstd,
                x2.stride(0),
                y.stride(0),
                n_cols,
                eps,
                ACC=acc_dtype(x.dtype),
                BLOCK=block,
                num_warps=num_warps_for(block),
            )
        ctx.save_for_backward(x2, w, rstd)
        ctx.x_shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x2, w, rstd = ctx.saved_tensors
        n_rows, n_cols = x2.shape
        dy2 = _as_rows(dy)
        dx = torch.empty_like(x2)
        programs = num_programs(x2.device, n_rows)
        rows_per_program = triton.cdiv(n_rows, programs) if n_rows else 0
        dw_partial = torch.empty((programs, n_cols), dtype=torch_acc_dtype(x2.dtype), device=x2.device)
        block = next_power_of_2(n_cols)
        if n_rows > 0:
            _rmsnorm_bwd_kernel[(programs,)](
                dy2,
                x2,
                w,
                rstd,
                dx,
                dw_partial,
                dy2.stride(0),
                x2.stride(0),
                dx.stride(0),
                n_rows,
                n_cols,
                rows_per_program,
                ACC=acc_dtype(x2.dtype),
                BLOCK=block,
                num_warps=num_warps_for(block),
            )
            dw = dw_partial.sum(0).to(w.dtype)
        else:
            dw = torch.zeros_like(w)
        return dx.view(ctx.x_shape), dw, None


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Plain PyTorch RMSNorm with the same precision policy as the kernel (autograd for grads).

    torch's own ``F.rms_norm`` (one fused op on CPU and CUDA, one node for torch.compile) in the
    accumulation dtype, rounded once."""
    acc = torch_acc_dtype(x.dtype)
    return torch.nn.functional.rms_norm(x.to(acc), (x.shape[-1],), weight.to(acc), eps).to(x.dtype)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5, impl: Impl = "triton") -> torch.Tensor:
    """RMSNorm over the last dimension of x ([..., hidden]) with weight [hidden].

    Returns a tensor of x's shape and dtype. impl="triton" runs the kernels (CUDA, or CPU under
    TRITON_INTERPRET=1); impl="torch" runs `rmsnorm_reference`.
    """
    check_impl(impl)
    if impl == "torch":
        return rmsnorm_reference(x, weight, eps)
    return RMSNormFunction.apply(x, weight, eps)
