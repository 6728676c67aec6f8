"""Fused output projection + cross-entropy that never materialises the [tokens, vocab] logits.

    loss = reduce_t( lse_t - logits_t[target_t] + z_loss * lse_t^2 ),  logits = hidden @ weight.T
    over tokens whose target != ignore_index; reduce = mean (over those tokens) or sum.

With a 128k vocabulary, 16k tokens of float32 logits are 8 GiB, and autograd keeps them (and
their gradient) alive between forward and backward. Here the tokens are processed in chunks
(the design of Liger-Kernel's fused linear cross-entropy):

    for each chunk of c tokens:
        logits = h_c @ W.T                        # [c, vocab], the only logits that exist
        Triton kernel, one program per row:       # in place, in the logits buffer
            lse, loss_t; logits <- d loss_t / d logits = softmax * (1 + 2 z lse) - onehot
        grad_hidden[c] = dlogits @ W              # [c, hidden]
        grad_weight   += dlogits.T @ h_c          # [vocab, hidden]

so the gradients are finished during forward, and backward only scales them by grad_output
(nothing to do for the usual 1). The mean's 1/n_valid is a device tensor the kernel reads (no
host sync to count tokens). The matmuls stay in torch/cuBLAS; the Triton part is the per-row
softmax/loss/gradient, done in two passes over the row (online max/sum-exp, then the
gradient), in float32 whatever the dtype.

Trade-offs: grad_weight ([vocab, hidden], weight's dtype) and grad_hidden are allocated in
forward and held until backward; with bf16 weights grad_weight is rounded to bf16 once per
chunk (cuBLAS accumulates within a chunk in float32), so fewer, larger chunks are more exact.
Only reduction "mean" or "sum": per-token losses would need per-token gradient scaling that a
precomputed grad_weight cannot take. No bias, no label smoothing, no vocab-parallel (TP) split.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._tl import row_max, row_sum
from kernels._utils import Impl, acc_dtype, check_dtype, check_impl, next_power_of_2, num_warps_for, torch_acc_dtype

MAX_BLOCK_V = 4096  # vocabulary columns per loop step of the per-row kernel
REDUCTIONS = ("mean", "sum")


@triton.jit
def _ce_fwd_bwd_kernel(
    logits_ptr,  # [rows, vocab], overwritten with d loss_row / d logits
    targets_ptr,  # [rows]
    loss_ptr,  # [rows], per-row loss (0 where ignored)
    grad_scale_ptr,  # 0-dim: 1 / n_valid for a mean, 1 for a sum
    logits_row_stride,
    vocab,
    ignore_index,
    z_loss,
    ACC: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * logits_row_stride
    target = tl.load(targets_ptr + row)

    if target == ignore_index:
        # The buffer holds this row's logits: zero it so the matmuls that follow add nothing.
        if COMPUTE_GRAD:
            for start in range(0, vocab, BLOCK_V):
                cols = start + tl.arange(0, BLOCK_V)
                zeros = tl.full([BLOCK_V], 0.0, dtype=logits_ptr.dtype.element_ty)
                tl.store(row_ptr + cols, zeros, mask=cols < vocab)
        tl.store(loss_ptr + row, 0.0)
        return

    # Pass 1: online logsumexp. m is the running max, d the sum of exp(x - m); when the max
    # grows, the old sum is rescaled by exp(m_old - m_new). Masked lanes are -inf -> exp = 0.
    m = tl.full([], float("-inf"), dtype=ACC)
    d = tl.full([], 0.0, dtype=ACC)
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(ACC)
        m_new = tl.maximum(m, row_max(x))
        d = d * tl.exp(m - m_new) + row_sum(tl.exp(x - m_new))
        m = m_new
    lse = m + tl.log(d)
    # An out-of-range target makes the loss NaN (F.cross_entropy raises) instead of reading
    # out of bounds: checking on the host would cost a device sync.
    in_range = (target >= 0) & (target < vocab)
    target_logit = tl.load(row_ptr + target, mask=in_range, other=float("nan")).to(ACC)
    tl.store(loss_ptr + row, lse - target_logit + z_loss * lse * lse)

    # Pass 2: d/dlogits of (lse - x_target + z lse^2) = softmax * (1 + 2 z lse) - onehot,
    # times the reduction's 1/n_valid, applied here in float32 before the store rounds to the
    # logits' dtype (scaling a bf16 gradient afterwards would round twice).
    if COMPUTE_GRAD:
        grad_scale = tl.load(grad_scale_ptr).to(ACC)
        scale = 1.0 + 2.0 * z_loss * lse
        for start in range(0, vocab, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            mask = cols < vocab
            x = tl.load(row_ptr + cols, mask=mask, other=0.0).to(ACC)
            g = tl.exp(x - lse) * scale
            g = tl.where(cols == target, g - 1.0, g) * grad_scale
            tl.store(row_ptr + cols, g.to(logits_ptr.dtype.element_ty), mask=mask)


def _ce_rows(
    logits: torch.Tensor,
    targets: torch.Tensor,
    loss: torch.Tensor,
    grad_scale: torch.Tensor,
    ignore_index: int,
    z_loss: float,
    compute_grad: bool,
) -> None:
    """Run the per-row kernel on one chunk: writes each row's loss into `loss` and, if
    compute_grad, grad_scale * d loss_row / d logits into `logits`."""
    rows, vocab = logits.shape
    block_v = min(MAX_BLOCK_V, next_power_of_2(vocab))
    if rows:
        _ce_fwd_bwd_kernel[(rows,)](
            logits,
            targets,
            loss,
            grad_scale,
            logits.stride(0),
            vocab,
            ignore_index,
            z_loss,
            ACC=acc_dtype(logits.dtype),
            COMPUTE_GRAD=compute_grad,
            BLOCK_V=block_v,
            num_warps=num_warps_for(block_v),
        )


def default_chunk_size(tokens: int, hidden: int, vocab: int) -> int:
    """Liger's heuristic: a chunk of logits about as large as the hidden states themselves
    (tokens * hidden elements), rounded to a power of two for well-shaped matmuls."""
    chunks = triton.cdiv(vocab, hidden)
    return next_power_of_2(triton.cdiv(tokens, chunks))


class FusedLinearCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        ignore_index: int,
        z_loss: float,
        reduction: str,
        chunk_size: int | None,
        grad_enabled: bool,
    ) -> torch.Tensor:
        tokens, hidden_size = hidden.shape
        vocab = weight.shape[0]
        # needs_input_grad is True under torch.no_grad() too: skip the gradient work in eval.
        need_dh = grad_enabled and ctx.needs_input_grad[0]
        need_dw = grad_enabled and ctx.needs_input_grad[1]
        chunk = chunk_size or default_chunk_size(tokens, hidden_size, vocab)
        acc = torch_acc_dtype(hidden.dtype)

        losses = torch.empty(tokens, dtype=acc, device=hidden.device)
        valid = targets != ignore_index
        # 1/n_valid as a device tensor: the kernel folds it into the gradient, no host sync.
        n_tokens = valid.sum().to(acc) if reduction == "mean" else torch.ones((), dtype=acc, device=hidden.device)
        grad_scale = 1.0 / n_tokens
        # Contiguous buffers (hidden may be a strided view): chunk slices stay contiguous.
        grad_hidden = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device) if need_dh else None
        grad_weight = torch.zeros(weight.shape, dtype=weight.dtype, device=weight.device) if need_dw else None
        # One [chunk, vocab] buffer for every chunk's logits: a fresh one per chunk is allocated while the last is
        # still referenced, two at the peak (62.6 MiB of bf16 at 4,096 × 128,256: our excess over Liger's peak).
        logits_buffer = torch.empty(min(chunk, tokens), vocab, dtype=hidden.dtype, device=hidden.device)
        for start in range(0, tokens, chunk):
            end = min(start + chunk, tokens)
            h = hidden[start:end]
            logits = torch.mm(h, weight.t(), out=logits_buffer[: end - start])  # the inputs' dtype; the kernel upcasts
            _ce_rows(logits, targets[start:end], losses[start:end], grad_scale, ignore_index, z_loss, need_dh or need_dw)
            dlogits = logits  # the kernel overwrote the logits with their gradient
            if need_dh:
                torch.mm(dlogits, weight, out=grad_hidden[start:end])
            if need_dw:
                grad_weight.addmm_(dlogits.t(), h)

        ctx.save_for_backward(grad_hidden, grad_weight)
        # A mean over zero valid tokens is 0/0 = nan, as with F.cross_entropy.
        return losses.sum() * grad_scale

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        # The gradients are complete up to the upstream factor. For loss.backward() that is 1:
        # hand over the buffers themselves (autograd adopts them as .grad, no copy); one host
        # sync of a scalar is cheap next to a [vocab, hidden] multiply. Not in place: the graph
        # may be backpropagated again (retain_graph=True).
        if not torch.equal(grad_output, torch.ones_like(grad_output)):
            grad_hidden = None if grad_hidden is None else grad_hidden * grad_output
            grad_weight = None if grad_weight is None else grad_weight * grad_output
        return grad_hidden, grad_weight, None, None, None, None, None, None


def fused_linear_cross_entropy_reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    z_loss: float = 0.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """Plain PyTorch: full [tokens, vocab] logits, F.cross_entropy in float32, plus the z-loss."""
    logits = (hidden @ weight.t()).to(torch_acc_dtype(hidden.dtype))
    total = torch.nn.functional.cross_entropy(logits, targets, ignore_index=ignore_index, reduction="sum")
    valid = targets != ignore_index
    if z_loss:
        lse = torch.logsumexp(logits, dim=-1)
        total = total + z_loss * torch.where(valid, lse.square(), 0.0).sum()
    if reduction == "mean":
        total = total / valid.sum()
    return total


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    z_loss: float = 0.0,
    reduction: str = "mean",
    chunk_size: int | None = None,
    impl: Impl = "triton",
) -> torch.Tensor:
    """Cross-entropy of `hidden @ weight.T` against `targets`, without the full logits.

    hidden [..., hidden_size] and weight [vocab, hidden_size] of the same float dtype; targets
    [...] integer class ids (ignore_index marks tokens that count for nothing). Returns a 0-dim
    float32 loss (float64 for float64 inputs): the mean over non-ignored tokens, or the sum.
    impl="torch" computes the same thing with the full logits (`..._reference`).
    """
    check_impl(impl)
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden [..., {hidden.shape[-1]}] does not match weight {tuple(weight.shape)}")
    if hidden.dtype != weight.dtype:
        raise TypeError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must have the same dtype")
    if targets.shape != hidden.shape[:-1]:
        raise ValueError(f"targets {tuple(targets.shape)} must match hidden's leading dims {tuple(hidden.shape[:-1])}")
    if targets.is_floating_point():
        raise TypeError("targets must be integer class ids")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    hidden2 = hidden.reshape(-1, hidden.shape[-1])
    targets1 = targets.reshape(-1)
    if impl == "torch":
        return fused_linear_cross_entropy_reference(hidden2, weight, targets1, ignore_index, z_loss, reduction)
    check_dtype(hidden, "hidden")
    return FusedLinearCrossEntropyFunction.apply(
        hidden2, weight, targets1.contiguous(), ignore_index, float(z_loss), reduction, chunk_size, torch.is_grad_enabled()
    )
