"""Rotary embedding: the Triton kernels (under the interpreter on CPU) against the PyTorch
reference and megatron-core's own `_apply_rotary_pos_emb_bshd`."""

import pytest
import torch

from tests.helpers import assert_close, count_launches, device, forward_backward, load_kernels

K = load_kernels("rotary")
DEV = device()


def megatron_freqs(seq: int, rot_dim: int, base: float = 10000.0, offset: int = 0) -> torch.Tensor:
    """The angles megatron's RotaryEmbedding.get_emb builds (non-interleaved): [seq, 1, 1, rot_dim]."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32) + offset, inv_freq)
    return torch.cat((freqs, freqs), dim=-1)[:, None, None, :].to(DEV)


def _randn(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(DEV, dtype)


# (seq, batch, heads, head_dim, rot_dim): full rotary, partial rotary, one position/head,
# a head_dim whose half (6) is not a power of two, a long position offset.
CASES = [(6, 2, 3, 16, 16), (5, 1, 2, 24, 16), (1, 1, 1, 8, 8), (4, 3, 5, 12, 12)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES)
def test_matches_reference(case: tuple[int, ...], dtype: torch.dtype) -> None:
    seq, batch, heads, head_dim, rot_dim = case
    t = _randn((seq, batch, heads, head_dim), dtype)
    freqs = megatron_freqs(seq, rot_dim, offset=1000)
    dy = _randn(t.shape, dtype, seed=1)
    with count_launches(K) as launches:
        y, (dt,) = forward_backward(lambda a: K.apply_rotary(a, freqs), [t], dy)
    assert launches.counts == {"_rope_kernel": 2}
    assert [kw["BACKWARD"] for *_, kw in launches.calls] == [False, True]
    y_ref, (dt_ref,) = forward_backward(lambda a: K.rotary_reference(a, freqs), [t], dy)
    assert_close(y, y_ref)
    assert_close(dt, dt_ref)
    # The pass-through tail of a partial rotary is copied bit for bit, forward and backward.
    assert torch.equal(y[..., rot_dim:], t[..., rot_dim:])
    assert torch.equal(dt[..., rot_dim:], dy[..., rot_dim:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_megatron(dtype: torch.dtype) -> None:
    rope_utils = pytest.importorskip("megatron.core.models.common.embeddings.rope_utils")
    t = _randn((7, 2, 4, 32), dtype)
    freqs = megatron_freqs(7, 32)
    expected = rope_utils._apply_rotary_pos_emb_bshd(t, freqs, rotary_interleaved=False, mscale=1.0)
    y = K.apply_rotary(t, freqs)
    # Megatron rounds cos/sin to t's dtype and computes in it: in bf16 that is a few bf16
    # steps away from the single final rounding of the kernel.
    assert_close(y, expected, scale=1.0 if dtype == torch.float32 else 4.0)


def test_arbitrary_freqs() -> None:
    """Halves with different angles (megatron's repeat theirs): each half uses its own."""
    t = _randn((4, 2, 3, 12), torch.float32)
    freqs = _randn((4, 1, 1, 12), torch.float32, seed=5) * 3
    dy = _randn(t.shape, torch.float32, seed=6)
    y, (dt,) = forward_backward(lambda a: K.apply_rotary(a, freqs), [t], dy)
    y_ref, (dt_ref,) = forward_backward(lambda a: K.rotary_reference(a, freqs), [t], dy)
    assert_close(y, y_ref)
    assert_close(dt, dt_ref)


def test_mscale_and_freqs_layouts() -> None:
    t = _randn((5, 2, 3, 8), torch.float32)
    freqs = megatron_freqs(5, 8)
    y4 = K.apply_rotary(t, freqs, mscale=0.7)
    y2 = K.apply_rotary(t, freqs[:, 0, 0, :], mscale=0.7)
    assert torch.equal(y4, y2)
    assert_close(y4, K.rotary_reference(t, freqs, mscale=0.7))


def test_strided_q_from_fused_qkv() -> None:
    # Megatron splits q, k, v out of one projection: q is a view whose head stride is 3 * head_dim.
    qkv = _randn((4, 2, 3, 3 * 8), torch.float32)
    q = qkv[..., :8]
    assert not q.is_contiguous()
    freqs = megatron_freqs(4, 8)
    dy = _randn((4, 2, 3, 8), torch.float32, seed=1)
    y, (dq,) = forward_backward(lambda a: K.apply_rotary(a[..., :8], freqs), [qkv], dy)
    y_ref, (dq_ref,) = forward_backward(lambda a: K.rotary_reference(a[..., :8], freqs), [qkv], dy)
    assert_close(y, y_ref)
    assert_close(dq, dq_ref)


def test_heads_loop(monkeypatch) -> None:
    # More heads than fit in one tile: the kernel loops over blocks of heads (5 = 2 + 2 + 1).
    monkeypatch.setattr(K, "MAX_TILE", 8)
    t = _randn((3, 2, 5, 8), torch.float32)
    freqs = megatron_freqs(3, 8)
    with count_launches(K) as launches:
        y, (dt,) = forward_backward(lambda a: K.apply_rotary(a, freqs), [t], torch.ones_like(t))
    assert {kw["BLOCK_H"] for *_, kw in launches.calls} == {2}
    y_ref, (dt_ref,) = forward_backward(lambda a: K.rotary_reference(a, freqs), [t], torch.ones_like(t))
    assert_close(y, y_ref)
    assert_close(dt, dt_ref)


def test_gradcheck_float64() -> None:
    t = _randn((2, 1, 2, 8), torch.float64).requires_grad_()
    freqs = _randn((2, 1, 1, 6), torch.float64, seed=3)  # partial rotary, unrelated halves
    with count_launches(K) as launches:
        assert torch.autograd.gradcheck(lambda a: K.apply_rotary(a, freqs, mscale=1.3), (t,), eps=1e-6, atol=1e-8)
    assert launches.counts["_rope_kernel"] >= 2


def test_dispatch_and_validation() -> None:
    t = _randn((2, 1, 1, 8), torch.float32)
    freqs = megatron_freqs(2, 8)
    with count_launches(K) as launches:
        K.apply_rotary(t, freqs, impl="torch")
    assert launches.total() == 0
    with pytest.raises(ValueError, match="impl"):
        K.apply_rotary(t, freqs, impl="te")
    with pytest.raises(ValueError, match="positions"):
        K.apply_rotary(t, megatron_freqs(3, 8))
    with pytest.raises(ValueError, match="rot_dim"):
        K.apply_rotary(t, megatron_freqs(2, 10))
