"""RMSNorm: the Triton kernels (under the interpreter on CPU) against the PyTorch reference."""

import pytest
import torch

from tests.helpers import assert_close, count_launches, device, forward_backward, load_kernels

K = load_kernels("rmsnorm")
DEV = device()


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3 + 0.5).to(DEV, dtype)
    w = (1 + 0.3 * torch.randn(shape[-1], generator=g)).to(DEV, dtype)
    return x, w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(5, 37), (1, 96), (2, 3, 64), (7, 3)])
def test_matches_reference(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x, w = _inputs(shape, dtype)
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(DEV, dtype)
    with count_launches(K) as launches:
        y, (dx, dw) = forward_backward(lambda a, b: K.rmsnorm(a, b, eps=1e-5), [x, w], dy)
    assert launches.counts == {"_rmsnorm_fwd_kernel": 1, "_rmsnorm_bwd_kernel": 1}
    y_ref, (dx_ref, dw_ref) = forward_backward(lambda a, b: K.rmsnorm_reference(a, b, eps=1e-5), [x, w], dy)
    assert_close(y, y_ref)
    assert_close(dx, dx_ref)
    assert_close(dw, dw_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_function_as_torch_rmsnorm(dtype: torch.dtype) -> None:
    """torch.nn.RMSNorm is what megatron-core builds for RMSNorm. In bf16 torch rounds twice
    (x / rms, then the weight product), the kernel once: allow two bf16 steps."""
    x, w = _inputs((4, 40), dtype)
    expected = torch.nn.functional.rms_norm(x, (40,), w, eps=1e-6)
    scale = 1.0 if dtype == torch.float32 else 2.0
    assert_close(K.rmsnorm_reference(x, w, eps=1e-6), expected, scale=scale)
    assert_close(K.rmsnorm(x, w, eps=1e-6), expected, scale=scale)


def test_strided_and_mixed_dtype_inputs() -> None:
    # A row-strided view (every other row of a wider buffer) and a transposed one (copied),
    # a bf16 input with a float32 weight (the weight's grad stays float32).
    base, w = _inputs((6, 80), torch.bfloat16)
    w32 = w.float()
    for x in (base[:, :40], base[::2, 40:], base.t()[:40, :3].t()):
        y, (dx, dw) = forward_backward(K.rmsnorm, [x, w32[: x.shape[-1]]], torch.ones_like(x))
        y_ref, (dx_ref, dw_ref) = forward_backward(K.rmsnorm_reference, [x, w32[: x.shape[-1]]], torch.ones_like(x))
        assert y.dtype == torch.bfloat16 and dw.dtype == torch.float32
        assert_close(y, y_ref)
        assert_close(dx, dx_ref)
        assert_close(dw, dw_ref, dtype=torch.bfloat16)


def test_more_rows_than_programs() -> None:
    # The backward's persistent programs each loop over a slab of rows; 11 rows over 4
    # programs leaves the last slab short.
    x, w = _inputs((11, 24), torch.float32)
    dy = torch.randn_like(x)
    _, grads = forward_backward(K.rmsnorm, [x, w], dy)
    _, grads_ref = forward_backward(K.rmsnorm_reference, [x, w], dy)
    for got, ref in zip(grads, grads_ref, strict=True):
        assert_close(got, ref)


def test_gradcheck_float64() -> None:
    x, w = _inputs((3, 7), torch.float64)
    x.requires_grad_()
    w.requires_grad_()
    with count_launches(K) as launches:
        assert torch.autograd.gradcheck(lambda a, b: K.rmsnorm(a, b, 1e-5), (x, w), eps=1e-6, atol=1e-8)
    assert launches.counts["_rmsnorm_bwd_kernel"] >= 1


def test_dispatch() -> None:
    x, w = _inputs((2, 8), torch.float32)
    with count_launches(K) as launches:
        K.rmsnorm(x, w, impl="torch")
    assert launches.total() == 0
    with pytest.raises(ValueError, match="impl"):
        K.rmsnorm(x, w, impl="cuda")
    with pytest.raises(ValueError, match="weight"):
        K.rmsnorm(x, w[:4])
