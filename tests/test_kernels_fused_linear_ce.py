"""Fused linear + cross-entropy: the chunked Triton path (under the interpreter on CPU)
against F.cross_entropy on the full logits (+ z-loss)."""

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import assert_close, count_launches, device, forward_backward, load_kernels

K = load_kernels("fused_linear_ce")
DEV = device()
IGNORE = -100


def _problem(tokens: int, hidden: int, vocab: int, dtype: torch.dtype, n_ignored: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=g).to(DEV, dtype)
    w = (torch.randn(vocab, hidden, generator=g) / hidden**0.5 * 2).to(DEV, dtype)
    targets = torch.randint(0, vocab, (tokens,), generator=g)
    targets[torch.randperm(tokens, generator=g)[:n_ignored]] = IGNORE
    targets[0] = vocab - 1  # the last class, in the vocabulary's tail block
    return h, w, targets.to(DEV)


def _plain(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, z_loss: float = 0.0, reduction: str = "mean") -> torch.Tensor:
    """What the loss means, written out independently of the module (float64)."""
    logits = h.double() @ w.double().t()
    valid = targets != IGNORE
    loss = F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum")
    loss = loss + z_loss * (torch.logsumexp(logits, -1)[valid] ** 2).sum()
    return loss / valid.sum() if reduction == "mean" else loss


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("tokens", "chunk_size", "z_loss", "reduction"),
    [(13, 4, 0.0, "mean"), (13, None, 1e-2, "mean"), (9, 1, 1e-3, "sum"), (1, None, 0.0, "mean"), (7, 64, 0.5, "mean")],
)
def test_matches_reference(monkeypatch, tokens: int, chunk_size: int | None, z_loss: float, reduction: str, dtype) -> None:
    # A 300-word vocabulary in blocks of 64: four full blocks and a partial one.
    monkeypatch.setattr(K, "MAX_BLOCK_V", 64)
    h, w, targets = _problem(tokens, 24, 300, dtype, n_ignored=min(3, tokens - 1))
    chunk = chunk_size or K.default_chunk_size(tokens, 24, 300)
    with count_launches(K) as launches:
        loss, (dh, dw) = forward_backward(
            lambda a, b: K.fused_linear_cross_entropy(a, b, targets, IGNORE, z_loss, reduction, chunk_size), [h, w]
        )
    # One kernel launch per chunk, each on at most `chunk` rows of logits: the full
    # [tokens, vocab] logits never exist.
    assert launches.counts == {"_ce_fwd_bwd_kernel": -(-tokens // chunk)}
    logits_shapes = [tuple(args[0].shape) for _, _, args, _ in launches.calls]
    assert all(rows <= chunk and vocab == 300 for rows, vocab in logits_shapes)
    assert sum(rows for rows, _ in logits_shapes) == tokens
    assert all(kw["COMPUTE_GRAD"] and kw["BLOCK_V"] == 64 for *_, kw in launches.calls)

    loss_ref, (dh_ref, dw_ref) = forward_backward(
        lambda a, b: K.fused_linear_cross_entropy(a, b, targets, IGNORE, z_loss, reduction, impl="torch"), [h, w]
    )
    assert loss.dtype == loss_ref.dtype == torch.float32
    assert_close(loss, loss_ref, dtype=torch.float32)
    assert_close(dh, dh_ref)
    # bf16: grad_weight is rounded to bf16 once per chunk (the reference: once).
    assert_close(dw, dw_ref, scale=1.0 if dtype == torch.float32 else 2.0)
    if dtype == torch.float32:
        assert_close(loss.double(), _plain(h, w, targets, z_loss, reduction), dtype=torch.float32)


def test_one_buffer_of_logits_serves_every_chunk() -> None:
    # Peak memory: one [chunk, vocab] buffer, reused. A new one per chunk held two at once (the last one is still
    # referenced while the next is computed): 62.6 MiB over Liger's peak at 4,096 × 128,256 in bf16 on the H200.
    h, w, targets = _problem(13, 24, 300, torch.float32)
    with count_launches(K) as launches:
        K.fused_linear_cross_entropy(h, w, targets, IGNORE, 0.0, "mean", 4)
    chunks = [args[0] for _, _, args, _ in launches.calls]
    assert [tuple(c.shape) for c in chunks] == [(4, 300), (4, 300), (4, 300), (1, 300)]
    assert len({c.untyped_storage().data_ptr() for c in chunks}) == 1


def test_reference_is_cross_entropy_plus_z_loss() -> None:
    h, w, targets = _problem(10, 16, 50, torch.float64)
    for z_loss, reduction in [(0.0, "mean"), (1e-3, "mean"), (0.1, "sum")]:
        got = K.fused_linear_cross_entropy_reference(h, w, targets, IGNORE, z_loss, reduction)
        assert_close(got, _plain(h, w, targets, z_loss, reduction))


def test_leading_dims_int32_targets_and_upstream_grad() -> None:
    # Megatron-like [batch, seq, hidden] hidden states, int32 labels, a scaled loss.
    h, w, targets = _problem(12, 16, 70, torch.float32)
    h3, t3 = h.view(3, 4, 16), targets.view(3, 4).int()
    loss, (dh, dw) = forward_backward(
        lambda a, b: 0.25 * K.fused_linear_cross_entropy(a, b, t3, IGNORE, 1e-3, chunk_size=5), [h3, w]
    )
    loss_ref, (dh_ref, dw_ref) = forward_backward(
        lambda a, b: 0.25 * K.fused_linear_cross_entropy(a, b, t3.long(), IGNORE, 1e-3, impl="torch"), [h3, w]
    )
    assert dh.shape == (3, 4, 16)
    assert_close(loss, loss_ref)
    assert_close(dh, dh_ref)
    assert_close(dw, dw_ref)


def test_only_the_needed_gradients() -> None:
    h, w, targets = _problem(6, 8, 40, torch.float32)
    # Frozen weight: only grad_hidden.
    loss, (dh,) = forward_backward(lambda a, b: K.fused_linear_cross_entropy(a, b, targets, chunk_size=4), [h, w], n_grad=1)
    _, (dh_ref,) = forward_backward(lambda a, b: K.fused_linear_cross_entropy(a, b, targets, impl="torch"), [h, w], n_grad=1)
    assert_close(dh, dh_ref)
    # No grad mode (evaluation): the kernel skips the gradient pass.
    with torch.no_grad(), count_launches(K) as launches:
        loss_eval = K.fused_linear_cross_entropy(h.requires_grad_(), w, targets, chunk_size=4)
    assert [kw["COMPUTE_GRAD"] for *_, kw in launches.calls] == [False, False]
    assert_close(loss_eval, loss)


def test_all_ignored() -> None:
    h, w, _ = _problem(4, 8, 40, torch.float32)
    targets = torch.full((4,), IGNORE, device=DEV)
    loss, (dh, dw) = forward_backward(lambda a, b: K.fused_linear_cross_entropy(a, b, targets, reduction="sum"), [h, w])
    assert loss.item() == 0.0 and not dh.any() and not dw.any()
    mean = K.fused_linear_cross_entropy(h, w, targets)
    assert torch.isnan(mean) and torch.isnan(F.cross_entropy(h @ w.t(), targets, ignore_index=IGNORE))


def test_large_logits_are_stable() -> None:
    # Logits of several hundred: a naive exp overflows float32; the online max keeps it finite.
    h, w, targets = _problem(5, 8, 90, torch.float32)
    h = h * 200
    loss, (dh, dw) = forward_backward(lambda a, b: K.fused_linear_cross_entropy(a, b, targets, z_loss=1e-4), [h, w])
    loss_ref, (dh_ref, dw_ref) = forward_backward(
        lambda a, b: K.fused_linear_cross_entropy(a, b, targets, z_loss=1e-4, impl="torch"), [h, w]
    )
    assert torch.isfinite(loss)
    assert_close(loss, loss_ref)
    assert_close(dh, dh_ref)
    assert_close(dw, dw_ref)


def test_gradcheck_float64(monkeypatch) -> None:
    monkeypatch.setattr(K, "MAX_BLOCK_V", 8)
    h, w, targets = _problem(4, 5, 19, torch.float64, n_ignored=1)
    h.requires_grad_()
    w.requires_grad_()
    fn = lambda a, b: K.fused_linear_cross_entropy(a, b, targets, IGNORE, 0.05, chunk_size=3)  # noqa: E731
    with count_launches(K) as launches:
        # fast_mode: checks v^T J u for random u, v instead of every Jacobian entry (each
        # entry costs two interpreted forwards); a wrong gradient still fails it.
        assert torch.autograd.gradcheck(fn, (h, w), eps=1e-6, atol=1e-8, fast_mode=True)
        assert torch.autograd.gradcheck(lambda a: fn(a, w.detach()) * 3, (h,), eps=1e-6, atol=1e-8)
    assert launches.total() >= 2


def test_dispatch_and_validation() -> None:
    h, w, targets = _problem(4, 8, 40, torch.float32)
    with count_launches(K) as launches:
        K.fused_linear_cross_entropy(h, w, targets, impl="torch")
    assert launches.total() == 0
    with pytest.raises(ValueError, match="impl"):
        K.fused_linear_cross_entropy(h, w, targets, impl="liger")
    with pytest.raises(ValueError, match="reduction"):
        K.fused_linear_cross_entropy(h, w, targets, reduction="none")
    with pytest.raises(TypeError, match="same dtype"):
        K.fused_linear_cross_entropy(h, w.double(), targets)
    with pytest.raises(ValueError, match="targets"):
        K.fused_linear_cross_entropy(h, w, targets[:3])
    out_of_range = targets.clone()
    out_of_range[1] = 40  # == vocab: F.cross_entropy raises; the kernel (no host sync) gives NaN
    assert torch.isnan(K.fused_linear_cross_entropy(h, w, out_of_range))
