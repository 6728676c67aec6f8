"""Shared helpers for the kernel tests (tests/test_kernels_*.py).

Without a GPU the Triton kernels run on the CPU through Triton's interpreter, which
@triton.jit chooses when a kernel is defined, i.e. when its module is imported. So the
kernel test modules load the kernel modules with `load_kernels()`, which sets
TRITON_INTERPRET=1 only while it (re-)imports them: `kernels.*` modules that something else
imported earlier without the interpreter are reloaded (importlib.reload re-executes a module
in its own namespace, so functions already imported elsewhere pick up the interpreted kernels
too). The variable is restored afterwards, so that it does not leak into the rest of the test
session: the training tests' ranks would otherwise run every kernel interpreted. The kernels do not
depend on when `triton` itself was imported (see kernels/_tl.py).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pytest
import torch
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import KernelInterface

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1" or not torch.cuda.is_available()


@contextmanager
def _interpreter_mode() -> Iterator[None]:
    saved = os.environ.get("TRITON_INTERPRET")
    if INTERPRET:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


# Tolerances, relative to the largest magnitude of the expected tensor (see `assert_close`).
# float32: both sides compute in float32, only summation order differs.
# bfloat16: both sides compute in float32 and round once; a value that lands near a rounding
#   boundary can round the other way: one bf16 step = 2^-8 of the leading binade, so 2^-7
#   relative per element plus 2^-8 of the tensor's max absolute value.
# float64: both sides compute in float64.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {  # dtype -> (rtol, atol as a fraction of max|expected|)
    torch.float32: (1e-5, 1e-6),
    torch.bfloat16: (2**-7, 2**-8),
    torch.float16: (2**-10, 2**-11),  # the same, with float16's 10 mantissa bits
    torch.float64: (1e-12, 1e-13),
}


def kernels_of(module: ModuleType) -> dict[str, KernelInterface]:
    """The @triton.jit functions defined in `module` (not the helpers it imports)."""
    return {
        name: value
        for name, value in vars(module).items()
        if isinstance(value, KernelInterface) and getattr(value.fn, "__module__", None) == module.__name__
    }


def _interpreted(module: ModuleType) -> bool:
    return all(isinstance(k, InterpretedFunction) for k in kernels_of(module).values())


def load_kernels(name: str) -> ModuleType:
    """`kernels.<name>`, with its @triton.jit functions built for the interpreter if
    TRITON_INTERPRET=1 (re-importing it, and the helpers it uses, if it was imported before
    the variable was set)."""
    module = None
    with _interpreter_mode():
        for dependency in ("kernels._tl", f"kernels.{name}"):  # helpers first: the kernel module binds them
            module = importlib.import_module(dependency)
            if INTERPRET and not _interpreted(module):
                module = importlib.reload(module)
    assert module is not None and kernels_of(module), f"kernels.{name} defines no Triton kernel"
    assert _interpreted(module) == INTERPRET, f"kernels.{name}: interpreter mode does not match TRITON_INTERPRET"
    return module


def device() -> str:
    """Where the tests run the kernels: the CPU under the interpreter, else a GPU."""
    if INTERPRET:
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("TRITON_INTERPRET=0 and no CUDA device: the Triton kernels cannot run here")
    return "cuda"


@dataclass
class Launches:
    """What `count_launches` saw: kernel name -> number of launches, and each launch's args."""

    counts: dict[str, int] = field(default_factory=dict)
    calls: list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)  # name, grid, args, kwargs

    def total(self) -> int:
        return sum(self.counts.values())


class _Spy:
    """Stands in for a Triton kernel: `spy[grid](*args)` records the launch, then runs it."""

    def __init__(self, name: str, kernel: KernelInterface, launches: Launches) -> None:
        self.name, self.kernel, self.launches = name, kernel, launches

    def __getitem__(self, grid: Any):
        def launch(*args: Any, **kwargs: Any) -> Any:
            self.launches.counts[self.name] = self.launches.counts.get(self.name, 0) + 1
            self.launches.calls.append((self.name, grid, args, kwargs))
            return self.kernel[grid](*args, **kwargs)

        return launch


@contextmanager
def count_launches(module: ModuleType) -> Iterator[Launches]:
    """Count the Triton launches of `module`'s kernels inside the block: proof that a result
    came from the Triton path and not silently from torch."""
    launches = Launches()
    originals = kernels_of(module)
    for name, kernel in originals.items():
        setattr(module, name, _Spy(name, kernel, launches))
    try:
        yield launches
    finally:
        for name, kernel in originals.items():
            setattr(module, name, kernel)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None, scale: float = 1.0) -> None:
    """Elementwise |actual - expected| <= rtol * |expected| + atol * max|expected|, with the
    tolerances of `dtype` (default: expected's dtype) multiplied by `scale`."""
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
    rtol, atol_frac = TOLERANCES[dtype or expected.dtype]
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    atol = atol_frac * max(e.abs().max().item() if e.numel() else 0.0, 1e-30)
    torch.testing.assert_close(a, e, rtol=rtol * scale, atol=atol * scale)


def forward_backward(
    fn, inputs: list[torch.Tensor], grad_out: torch.Tensor | None = None, n_grad: int | None = None
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """fn(*inputs), then backward with grad_out (None: a scalar output). The first `n_grad`
    inputs (default: the floating-point ones) are leaves that require grad; returns the
    output and their gradients."""
    n_grad = sum(x.is_floating_point() for x in inputs) if n_grad is None else n_grad
    leaves = [x.detach().clone().requires_grad_(i < n_grad) for i, x in enumerate(inputs)]
    out = fn(*leaves)
    out.backward(grad_out)
    return out.detach(), [x.grad for x in leaves[:n_grad]]
