"""Run megatron-core on a machine without CUDA. Applied only when CUDA is absent.

megatron-core assumes a GPU in a handful of places that have nothing to do with the maths
(see ``../shared/FIELD_NOTES.md``, measured on 0.16 and 0.19). Rather than fork megatron,
this module redirects exactly those calls to the CPU:

- ``torch.cuda.current_device()`` used as a ``device=`` argument → ``"cpu"``;
- ``torch.cuda.synchronize()`` (dist-checkpoint save) → no-op;
- megatron's CUDA RNG state get/set (activation recompute) → the CPU generator;
- ``Tensor.cuda()`` (pipeline stages with tied embeddings) → identity;
- ``torch.cuda.manual_seed`` → no-op (the CPU generator is seeded separately);
- the default causal attention mask, built with ``device="cuda"`` → built on the CPU.

Configuration-level fixes live with the model code (``use_cpu_initialization=True``, the
no-op inference RNG tracker). On a CUDA machine ``apply()`` does nothing and megatron runs
exactly as shipped.
"""

from __future__ import annotations

import functools

import torch

_applied = False


def cuda_available() -> bool:
    return torch.cuda.is_available()


def apply() -> bool:
    """Patch megatron-core for CPU if CUDA is absent. Idempotent; returns True if patched."""
    global _applied
    if cuda_available():
        return False
    if _applied:
        return True
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    torch.cuda.manual_seed = lambda *a, **k: None  # type: ignore[assignment]
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]

    from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import random as mp_random
    from megatron.core.transformer import utils as transformer_utils

    @functools.lru_cache(maxsize=8)
    def causal_mask(sq: int) -> torch.Tensor:
        return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)

    transformer_utils.get_default_causal_mask = causal_mask
    fused_softmax.get_default_causal_mask = causal_mask
    mp_random._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mp_random._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    _applied = True
    return True
