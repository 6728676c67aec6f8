"""The few Triton library functions the kernels need, defined here instead of taken from
triton.language.

Why: tl.sum, tl.max, tl.sigmoid and tl.zeros are themselves @triton.jit functions, built when
`triton.language` is first imported. If that import happened before TRITON_INTERPRET=1 was
set (another module in the process imported triton first), they are compiled-mode functions
and the interpreter refuses to call them from an interpreted kernel. Helpers defined in this
package are built together with our kernels, so our kernels work in whichever mode they were
imported in. On a GPU the generated code is the same as with tl.sum / tl.max / tl.sigmoid.
(Builtins such as tl.load, tl.exp, tl.maximum, tl.full and tl.reduce are not affected.)
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _maximum(a, b):
    return tl.maximum(a, b)


@triton.jit
def row_sum(x):
    """Sum of a 1-D block (tl.sum(x, axis=0))."""
    return tl.reduce(x, 0, _add)


@triton.jit
def row_max(x):
    """Max of a 1-D block (tl.max(x, axis=0))."""
    return tl.reduce(x, 0, _maximum)


@triton.jit
def sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))
