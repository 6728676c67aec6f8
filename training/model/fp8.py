"""FP8 matmuls in the transformer layers (``train.precision: fp8``), through torchao's float8 training.

torchao's recipe swaps ``nn.Linear`` modules (``convert_to_float8_training``); megatron's parallel linears
are not ``nn.Linear``, so the layer spec names subclasses of them (``fp8_linears``) whose matmul is the
autograd function torchao's ``Float8Linear`` runs (``matmul_with_hp_or_float8_args``): the input and the
weight cast to e4m3 under dynamic scales, the output gradient to e5m2 (``tensorwise``) or e4m3 with
power-of-two row scales (``rowwise``), each of a linear layer's three GEMMs one ``torch._scaled_mm``. The
tensor-parallel communication is megatron's own: the sequence all-gathered before the matmul under sequence
parallelism (its gradient reduce-scattered), the input's gradient all-reduced under plain tensor parallelism,
the row-parallel layer's output reduced after it. The weights, the optimizer and the checkpoints stay what
they are in bf16: a checkpoint does not know the precision it was trained in.

In FP8: the query/key/value and output projections, the MLP's two linears, of every layer. In bf16, as
torchao's and torchtitan's recipes leave them: the embedding, the output layer and the loss, the norms and
attention's own maths.

FP8 GEMMs need an NVIDIA GPU of compute capability 8.9 or newer (``hardware_problem``: a run refuses
elsewhere before anything starts). On a CPU the same casts and ``torch._scaled_mm`` run (slowly) for the
tests and the GPU checks' dry run.
"""

from __future__ import annotations

import functools

import torch

from common.errors import ConfigError
from training.config import FP8_NEEDS, Fp8Recipe

MIN_CAPABILITY = (8, 9)
"""FP8 tensor cores (``FP8_NEEDS``): Ada (L4, L40S) 8.9, Hopper (H100, H200) 9.0, Blackwell 10.0."""


def hardware_problem() -> str:
    """'' where FP8 GEMMs run on tensor cores here, else why not (one clause)."""
    if not torch.cuda.is_available():
        return "this machine has no CUDA GPU"
    capability = torch.cuda.get_device_capability()
    if capability < MIN_CAPABILITY:
        name = torch.cuda.get_device_name()
        return f"its GPU, {name}, is compute capability {capability[0]}.{capability[1]}"
    return ""


def refuse_without_hardware(where: str) -> None:
    """Raise the one-line ConfigError of ``train.precision: fp8`` on a machine without FP8 GEMMs."""
    problem = hardware_problem()
    if problem:
        raise ConfigError(
            f"train.precision is 'fp8' but {where} cannot run it: {problem}; {FP8_NEEDS}: set train.precision: bf16"
        )


@functools.cache
def _torchao_config(recipe: str):
    """torchao's config of ``recipe`` and the GEMM settings its ``Float8Linear`` derives from it (taken from one,
    so that they stay what torchao builds)."""
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear

    config = Float8LinearConfig.from_recipe_name(Fp8Recipe(recipe).value)
    probe = Float8Linear.from_float(torch.nn.Linear(16, 16, bias=False, device="meta"), config=config)
    return config, probe.linear_mm_config


def fp8_matmul(input: torch.Tensor, weight: torch.Tensor, recipe: str) -> torch.Tensor:
    """``input @ weight.t()`` with torchao's FP8 linear under ``recipe``, differentiable in both."""
    from torchao.float8.float8_linear import matmul_with_hp_or_float8_args

    config, mm = _torchao_config(recipe)
    return matmul_with_hp_or_float8_args.apply(input, weight.t(), mm, config)


FP8_ATTR = "pretrain_fp8_recipe"
"""Set on megatron's TransformerConfig by ``build_gpt`` under ``train.precision: fp8``: the recipe."""


class _Fp8Matmul:
    """megatron's linear with its matmul in FP8: ``_forward_impl`` is the one place both parallel linears multiply."""

    def _forward_impl(
        self,
        input,
        weight,
        bias=None,
        gradient_accumulation_fusion=False,
        allreduce_dgrad=False,
        sequence_parallel=False,
        grad_output_buffer=None,
        wgrad_deferral_limit=None,
        tp_group=None,
    ):
        from megatron.core.tensor_parallel.mappings import (
            copy_to_tensor_model_parallel_region,
            gather_from_sequence_parallel_region,
        )

        if not weight.requires_grad:  # frozen: megatron's own path, which keeps no gradient
            return super()._forward_impl(
                input=input,
                weight=weight,
                bias=bias,
                gradient_accumulation_fusion=gradient_accumulation_fusion,
                allreduce_dgrad=allreduce_dgrad,
                sequence_parallel=sequence_parallel,
                grad_output_buffer=grad_output_buffer,
                wgrad_deferral_limit=wgrad_deferral_limit,
                tp_group=tp_group,
            )
        if gradient_accumulation_fusion or grad_output_buffer is not None:
            raise ConfigError("train.precision 'fp8' does not fuse gradient accumulation into the weight-gradient GEMM")
        if sequence_parallel:
            input = gather_from_sequence_parallel_region(input, tensor_parallel_output_grad=True, group=tp_group)
        elif allreduce_dgrad:
            input = copy_to_tensor_model_parallel_region(input, group=tp_group)
        output = fp8_matmul(input, weight, getattr(self.config, FP8_ATTR))
        return output if bias is None else output + bias


@functools.cache
def fp8_linears() -> tuple[type, type]:
    """(column-parallel, row-parallel) linears whose matmul runs in FP8 (the recipe from their config)."""
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    class Fp8ColumnParallelLinear(_Fp8Matmul, ColumnParallelLinear):
        pass

    class Fp8RowParallelLinear(_Fp8Matmul, RowParallelLinear):
        pass

    return Fp8ColumnParallelLinear, Fp8RowParallelLinear
