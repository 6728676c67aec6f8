"""Fully sharded data parallelism (``parallel.fsdp``): LocalStep's maths on a model sharded by torch FSDP2.

megatron-core's ``TorchFullyShardedDataParallel`` applies ``fully_shard`` to every transformer layer and then to
the whole model (the root unit: embedding, final norm, the output weight). Every parameter becomes a DTensor
holding this rank's rows (dimension 0, split evenly over the data-parallel ranks). Before a unit runs, FSDP2
all-gathers its weights; after its backward it reduce-scatters its gradients, averaged over the ranks, and frees
the gathered weights again. So each rank keeps 1/DP of the weights, the gradients and (torch AdamW stepping the
DTensor shards) the Adam moments.

Why megatron's torch FSDP2 wrapper and not Megatron-FSDP (``megatron.core.distributed.fsdp``): see
docs/scaling.md. In short, Megatron-FSDP hard-codes CUDA devices and streams and its checkpoints need its own
format, while FSDP2 runs on gloo and the CPU once its device mesh is built there (``cpu_compat.apply``).

The step: the mean over micro-batches of each micro-batch's mean token loss; gradients stay unsharded and
accumulate over the micro-batches (``set_requires_gradient_sync`` off) and the last backward reduce-scatters
them, averaged over data-parallel ranks; the global norm is the square root of the sum of the squares of every
rank's shards (the shards are disjoint); clipping to ``grad_clip``; torch AdamW on the shards.

FSDP2 issues its collectives from hooks inside forward and backward, so the step timer counts them in
``forward_backward`` (on a GPU they run on their own streams, overlapped with the layers' compute); its
``collective`` phase holds the loss mean and the gradient norm's all-reduce.

On a GPU the parameters are bf16 and AdamW steps their shards directly, as LocalStep steps its bf16
parameters; FSDP2's mixed precision (fp32 shards, bf16 compute) would need a policy megatron's wrapper
does not pass.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from common.settings import problems_error
from training.config import TrainConfig
from training.model.gpt import mean_loss
from training.model.shared import (
    Accept,
    StepResult,
    accept_all,
    adamw,
    count_parameters,
    mean_over_data_parallel,
    micro_batch_mean_loss,
    token_weights,
)
from training.observe.timing import StepTimer


def unshardable_parameters(model: torch.nn.Module, data_parallel: int) -> list[str]:
    """One line per parameter whose first dimension does not split evenly over ``data_parallel`` ranks.

    FSDP2 would pad such a parameter's last shard, while the checkpoint describes every shard as an equal
    slice of dimension 0 (megatron's ShardedTensor offsets): the padded rows would be saved as weights."""
    return [
        f"parallel.fsdp splits every parameter's first dimension over the {data_parallel} data-parallel ranks, but "
        f"{name} has shape {tuple(p.shape)} ({p.shape[0]} rows): choose a data-parallel size (world size) that "
        f"divides {p.shape[0]}, change the model dimension behind it, or set parallel.fsdp: false"
        for name, p in model.named_parameters()
        if p.ndim == 0 or p.shape[0] % data_parallel
    ]


class FsdpStep:
    """Pipeline-parallel 1, tensor-parallel 1: FSDP2 units per transformer layer, torch AdamW on the shards."""

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig, accumulation: int) -> None:
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import TorchFullyShardedDataParallel, TorchFullyShardedDataParallelConfig
        from megatron.core.transformer.transformer_layer import TransformerLayer

        self.dp_group = ps.get_data_parallel_group()
        problems = unshardable_parameters(model, dist.get_world_size(self.dp_group))
        if problems:
            raise problems_error(problems)
        fsdp_config = TorchFullyShardedDataParallelConfig(
            # None: FSDP2's default, each layer frees its gathered weights after its forward (and gathers them
            # again for backward), the root unit keeps them: the loss reads the output weight after the model's
            # forward (training.model.layers.mean_token_loss). megatron's default (True for every unit) would hand
            # it the sharded DTensor.
            reshard_after_forward=None,
        )
        # Units: each transformer layer, then the root (the embedding, the final norm, the tied output weight).
        # Not megatron's default set: it also makes the embedding a unit of its own, which would free the weight
        # the loss reads after the forward, and every ColumnParallelLinear, on which FSDP2 fails to build here
        # (TypeError: "value was None").
        self.fsdp = TorchFullyShardedDataParallel(model.config, fsdp_config, model, sub_modules_to_wrap={TransformerLayer})
        self.model = model
        self.cfg = cfg
        self.accumulation = accumulation
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = adamw(self.params, cfg)  # fused: it steps the DTensors shard by shard
        model.train()

    def num_parameters(self) -> int:
        # A DTensor's numel is the whole parameter's: counted as LocalStep counts at TP=1.
        return count_parameters(self.model)

    @torch.no_grad()
    def evaluate(self, batch: torch.Tensor) -> float:
        loss = micro_batch_mean_loss(self.model, batch, self.cfg.micro_batch_size)
        # Without a backward the root unit keeps its gathered weights: shard them again, or a checkpoint
        # saved next would see whole tensors where it expects this rank's shards.
        self.model.reshard()
        return mean_over_data_parallel(loss)

    def step(self, batch: torch.Tensor, lr: float, timer: StepTimer, accept: Accept = accept_all) -> StepResult:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=self.params[0].device)
        micros = batch.split(self.cfg.micro_batch_size)
        weights = token_weights(self.model, micros)
        with timer.phase("forward_backward"):  # the all-gathers, and the reduce-scatter in the last backward
            for i, micro in enumerate(micros):
                # Gradients accumulate unsharded until the last micro-batch, whose backward reduce-scatters the sum.
                self.model.set_requires_gradient_sync(i == len(micros) - 1)
                loss = mean_loss(self.model, micro)
                loss = loss / self.accumulation if weights is None else loss * weights[i]
                loss.backward()
                loss_sum += loss.detach()
        with timer.phase("collective"):
            mean = mean_over_data_parallel(loss_sum)
        if not accept(mean):
            self.optimizer.zero_grad(set_to_none=True)
            return StepResult(mean, float("nan"), False)
        grads = [p.grad.to_local() for p in self.params if p.grad is not None]
        with timer.phase("collective"):
            norm = _sharded_grad_norm(grads, self.dp_group, self.params[0].device)
        with timer.phase("optimizer"):
            if self.cfg.grad_clip > 0:
                scale = torch.clamp(self.cfg.grad_clip / (norm + 1e-6), max=1.0)
                torch._foreach_mul_(grads, scale)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return StepResult(mean, norm.item(), True)


def _sharded_grad_norm(local_grads: list[torch.Tensor], dp_group, device: torch.device) -> torch.Tensor:
    """Global L2 norm of gradients sharded over ``dp_group``: every rank holds disjoint rows of every parameter
    (TP=1), so the sum of the squares of the local shards, summed over the ranks, is the norm's square."""
    total = torch.zeros((), dtype=torch.float32, device=device)
    if local_grads:
        norms = torch._foreach_norm(local_grads, 2.0, dtype=torch.float32)
        total += torch.stack(norms).square().sum()
    dist.all_reduce(total, group=dp_group)
    return total.sqrt()
