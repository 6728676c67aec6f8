"""SwiGLU: the Triton kernels (under the interpreter on CPU) against the PyTorch reference."""

import pytest
import torch

from tests.helpers import assert_close, count_launches, device, forward_backward, load_kernels

K = load_kernels("swiglu")
DEV = device()


def _randn(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return (2 * torch.randn(shape, generator=torch.Generator().manual_seed(seed))).to(DEV, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(4, 2 * 45), (1, 2 * 48), (2, 3, 2 * 33), (3, 2)])
def test_matches_reference(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = _randn(shape, dtype)
    dy = _randn((*shape[:-1], shape[-1] // 2), dtype, seed=1)
    with count_launches(K) as launches:
        y, (dx,) = forward_backward(K.swiglu, [x], dy)
    assert launches.counts == {"_swiglu_fwd_kernel": 1, "_swiglu_bwd_kernel": 1}
    y_ref, (dx_ref,) = forward_backward(K.swiglu_reference, [x], dy)
    assert y.shape == (*shape[:-1], shape[-1] // 2)
    assert_close(y, y_ref)
    assert_close(dx, dx_ref)


def test_megatron_chunk_convention() -> None:
    """gate is the first half of the last dimension, up the second (megatron's gated_linear_unit)."""
    x = _randn((3, 2 * 20), torch.float32)
    gate, up = x[:, :20], x[:, 20:]
    assert_close(K.swiglu(x), torch.nn.functional.silu(gate) * up)


def test_several_column_blocks(monkeypatch) -> None:
    # Rows wider than a block use a second grid axis; 45 columns in blocks of 16 ends on a
    # partial block.
    monkeypatch.setattr(K, "MAX_BLOCK", 16)
    x = _randn((3, 2 * 45), torch.float32)
    dy = _randn((3, 45), torch.float32, seed=2)
    with count_launches(K) as launches:
        y, (dx,) = forward_backward(K.swiglu, [x], dy)
    assert [(grid, kw["BLOCK"]) for _, grid, _, kw in launches.calls] == [((3, 3), 16), ((3, 3), 16)]
    y_ref, (dx_ref,) = forward_backward(K.swiglu_reference, [x], dy)
    assert_close(y, y_ref)
    assert_close(dx, dx_ref)


def test_strided_input() -> None:
    base = _randn((5, 2 * 24 + 8), torch.float32)
    x = base[1:4, 8:]  # a row-strided view: no copy needed
    dy = torch.ones(3, 24, device=DEV)
    y, (dx,) = forward_backward(K.swiglu, [x], dy)
    y_ref, (dx_ref,) = forward_backward(K.swiglu_reference, [x], dy)
    assert_close(y, y_ref)
    assert_close(dx, dx_ref)


def test_gradcheck_float64() -> None:
    x = _randn((3, 2 * 7), torch.float64).requires_grad_()
    with count_launches(K) as launches:
        assert torch.autograd.gradcheck(K.swiglu, (x,), eps=1e-6, atol=1e-8)
    assert launches.counts["_swiglu_bwd_kernel"] >= 1


def test_dispatch() -> None:
    x = _randn((2, 8), torch.float32)
    with count_launches(K) as launches:
        K.swiglu(x, impl="torch")
    assert launches.total() == 0
    with pytest.raises(ValueError, match="impl"):
        K.swiglu(x, impl="fast")
    with pytest.raises(ValueError, match="even"):
        K.swiglu(_randn((2, 7), torch.float32))
