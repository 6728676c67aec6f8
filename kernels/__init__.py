"""Triton kernels for the model's hot paths, each beside a plain PyTorch reference.

One module per kernel; import the function from its module:

    from kernels.rmsnorm import rmsnorm                                   # [..., hidden]
    from kernels.swiglu import swiglu                                     # [..., 2 * ffn] -> [..., ffn]
    from kernels.rotary import apply_rotary                               # [seq, batch, heads, head_dim]
    from kernels.fused_linear_ce import fused_linear_cross_entropy        # hidden @ W.T -> CE loss

Every public function takes impl="triton" (default) or impl="torch" (the reference). The
Triton path needs a CUDA device, or TRITON_INTERPRET=1 set before these modules are imported
(the tests do that to run the kernels on a CPU). Importing works anywhere, GPU or not.

This package deliberately imports no submodule: `kernels.rmsnorm` must stay the module,
not be shadowed by the function of the same name.
"""

__all__ = ["fused_linear_ce", "rmsnorm", "rotary", "swiglu"]
