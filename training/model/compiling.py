"""``train.compile``: torch.compile of the megatron GPT's transformer layers and its loss head.

What is compiled, as torchtitan does it: each transformer layer on its own (``Module.compile``;
the layers share one graph, so compile time does not grow with depth), with the PyTorch references
of the norms, SwiGLU and RoPE inside (Inductor fuses them); and, where the loss runs on one rank
(tensor-parallel size 1) and ``kernels`` resolves to the PyTorch references (a CPU), the output
layer with its cross-entropy, which Inductor fuses so that the [tokens, vocab] log-softmax is not
written and read back in fp32. On CUDA the loss stays our fused linear + cross-entropy kernel. The
embedding, the optimizer and the collectives between layers stay eager.

Where it runs: CUDA; a CPU with a C++ compiler (Inductor's CPU backend builds C++). Not under
``TRITON_INTERPRET=1``: interpreted Triton kernels cannot be traced. ``auto`` compiles on CUDA
only: on the 2-core CPU a run pays 7–12 s per process to compile (warm cache) and gains about
10 % of a step (docs/performance.md), which short CPU runs never earn back.

Compiled graphs are cached by Inductor (``TORCHINDUCTOR_CACHE_DIR``, default
``/tmp/torchinductor_<user>``): the second process compiling the same layer shape loads them.
"""

from __future__ import annotations

import functools
import os
import shutil

import torch

from common.errors import ConfigError
from training.config import CompileMode


def compile_problem(device_type: str) -> str:
    """Why torch.compile cannot run here ('' when it can)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1 (interpreted Triton kernels cannot be compiled)"
    if device_type == "cpu" and not (shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")):
        return "no C++ compiler on this machine (Inductor's CPU backend needs one: install g++)"
    return ""


def resolve_compile(choice: str, device_type: str) -> bool:
    """``train.compile`` for this device: 'on' fails with the reason where compiling cannot run;
    'auto' compiles on CUDA where it can."""
    problem = compile_problem(device_type)
    if choice == CompileMode.ON and problem:
        raise ConfigError(f"train.compile is 'on' but torch.compile cannot run here: {problem}; set train.compile: off")
    if choice == CompileMode.AUTO:
        return device_type == "cuda" and not problem
    return choice == CompileMode.ON


def compile_model(model: torch.nn.Module) -> None:
    """Compile this rank's transformer layers in place, and mark the model compiled (the loss head and RoPE
    read the mark). Inside the compiled layers the norms, SwiGLU and RoPE run their PyTorch references,
    which Inductor fuses with their neighbours (into Triton kernels of its own on CUDA): our hand-written
    kernels are opaque to it and would cut its fusions. Outside them (the final norm; on CUDA the fused
    linear + cross-entropy, which never builds the logits) ``model.kernels`` decides as in eager mode."""
    from training.model.layers import COMPILE_ATTR, RMSNorm, SwiGLU  # megatron's classes: loaded when a model is built

    _megatron_without_graph_breaks()
    for layer in model.decoder.layers:
        for module in layer.modules():
            if isinstance(module, (RMSNorm, SwiGLU)):
                module.impl = "torch"
        layer.compile()
    setattr(model.config, COMPILE_ATTR, True)


@functools.cache
def _megatron_without_graph_breaks() -> None:
    """megatron-core 0.16's RowParallelLinear passes ``tp_group=None`` to its linear, whose
    resolution warns (rank 0, every call) that the group will be mandatory; Dynamo cannot trace
    ``warnings.warn`` with a category and splits each layer into four graphs around it. Resolve
    the group the same way, without the warning."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import layers

    resolve = layers.get_tensor_model_parallel_group_if_none

    def quiet(tp_group=None, is_expert: bool = False, check_initialized: bool = True):
        if tp_group is None and not is_expert and parallel_state.is_initialized():
            return parallel_state.get_tensor_model_parallel_group(check_initialized=check_initialized)
        return resolve(tp_group, is_expert=is_expert, check_initialized=check_initialized)

    layers.get_tensor_model_parallel_group_if_none = quiet
