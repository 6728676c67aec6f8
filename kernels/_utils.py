"""Small helpers shared by the kernel modules (no Flyte, no GPU needed to import)."""

from __future__ import annotations

import functools
from typing import Literal

import torch
import triton
import triton.language as tl

Impl = Literal["triton", "torch"]
IMPLS: tuple[str, ...] = ("triton", "torch")

# Tensor dtypes the Triton paths accept. float64 is there for torch.autograd.gradcheck (it
# runs under TRITON_INTERPRET=1 and on GPUs, slowly); training uses bfloat16 or float32.
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def check_impl(impl: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def check_dtype(t: torch.Tensor, name: str) -> None:
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}: dtype {t.dtype} is not supported (expected one of {SUPPORTED_DTYPES})")


def acc_dtype(dtype: torch.dtype) -> tl.dtype:
    """The precision a kernel computes in: float32 for 16/32-bit inputs (bf16 has too few
    mantissa bits for sums and exps), float64 only for float64 inputs (gradcheck)."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def torch_acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The torch twin of `acc_dtype`: what the references compute in."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def num_warps_for(block: int) -> int:
    """Warps per program for a block of `block` elements: enough threads to keep each one to
    a few elements (fewer registers), without idling warps on small rows."""
    if block >= 8192:
        return 16
    if block >= 2048:
        return 8
    return 4


def num_programs(device: torch.device, work_items: int) -> int:
    """How many persistent programs to launch for a loop over `work_items` rows: one per SM on
    a GPU (each accumulates its partial sums in registers), a handful in the interpreter."""
    if device.type == "cuda":
        return max(1, min(work_items, _sm_count(device.index if device.index is not None else torch.cuda.current_device())))
    return max(1, min(work_items, 4))


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def next_power_of_2(n: int) -> int:
    return triton.next_power_of_2(max(1, n))
