"""What the train steps share (``LocalStep`` and ``MegatronStep`` in ``step.py``, ``FsdpStep`` in ``fsdp.py``):
the result of a step, the loss check before an update, AdamW with the trainer's settings, the parameter count
and the data-parallel mean. A module of its own so that ``step.py`` can build an ``FsdpStep`` and ``fsdp.py``
can use the helpers without either importing the other."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist

from training.config import TrainConfig
from training.model.gpt import mean_loss

BETAS = (0.9, 0.95)
EPS = 1e-8


class StepResult(NamedTuple):
    loss: float
    """Mean loss of the step's batch over all data-parallel ranks."""
    grad_norm: float
    """Global gradient norm before clipping (NaN when the update was refused)."""
    applied: bool
    """False when ``accept`` refused the loss: nothing was updated."""


Accept = Callable[[float], bool]
"""Shown the step's mean loss (the same on every rank) before the update: False drops the update."""


def accept_all(loss: float) -> bool:
    return True


def count_parameters(model: torch.nn.Module) -> int:
    """Model parameters over all TP and PP ranks: TP-sharded ones summed, TP-replicated ones
    once, and the output weight a last stage shares with the first stage's embedding once."""
    from megatron.core import parallel_state as ps

    tp_rank = ps.get_tensor_model_parallel_rank()
    params = [p for p in model.parameters() if p.requires_grad and not getattr(p, "shared", False)]
    local = sum(p.numel() for p in params if getattr(p, "tensor_model_parallel", False) or tp_rank == 0)
    total = torch.tensor(local, dtype=torch.int64, device=next(model.parameters()).device)
    dist.all_reduce(total, group=ps.get_model_parallel_group())
    return int(total.item())


def mean_over_data_parallel(value: torch.Tensor) -> float:
    from megatron.core import parallel_state as ps

    dist.all_reduce(value, group=ps.get_data_parallel_group())
    return value.item() / ps.get_data_parallel_world_size()


def adamw(params: list[torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.AdamW:
    """torch's AdamW with the trainer's settings, weight decay on matrices only."""
    return torch.optim.AdamW(
        [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=cfg.lr,
        betas=BETAS,
        eps=EPS,
        # One kernel over every parameter (CPU and CUDA; DTensors shard by shard); the default foreach
        # implementation launches several per tensor group. bench_train's plain peer steps this same optimizer.
        fused=True,
    )


def micro_batch_mean_loss(model: torch.nn.Module, batch: torch.Tensor, micro_batch_size: int) -> torch.Tensor:
    """The mean over ``batch``'s micro-batches of each one's mean token loss (forward only, on this rank); with
    document masking each weighted by its trained tokens (``token_weights``), this rank's share × DP size."""
    micros = batch.split(micro_batch_size)
    weights = token_weights(model, micros)
    total = torch.zeros((), device=next(model.parameters()).device)
    for i, micro in enumerate(micros):
        loss = mean_loss(model, micro).float()
        total += loss if weights is None else loss * weights[i]
    return total / len(micros) if weights is None else total


def token_weights(model: torch.nn.Module, micros: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> list[torch.Tensor] | None:
    """With document masking (``model.document_eod``), each micro-batch's weight in the step's loss: its
    trained tokens (those not predicting another document's first) × DP size ÷ those of the global batch
    (summed over the data-parallel ranks, collective). The step's loss is then the mean over every trained
    token of the global batch whatever the micro-batch size or data-parallel split, as megatron's
    per-token loss: averaging each micro-batch's own mean would weigh a token by its micro-batch's count.
    None without masking: every micro-batch counts ``seq_len`` tokens a row, the mean of the means is that mean."""
    from megatron.core import parallel_state as ps

    from training.model.documents import trained

    eod = getattr(model, "document_eod", None)
    if eod is None:
        return None
    device = next(model.parameters()).device
    counts = [trained(micro[:, :-1], eod).sum().to(device=device, dtype=torch.float64) for micro in micros]
    total = torch.stack(counts).sum()
    group = ps.get_data_parallel_group()
    if dist.get_world_size(group) > 1:
        dist.all_reduce(total, group=group)
    dp = dist.get_world_size(group)
    return [(count * dp / total.clamp(min=1)).float() for count in counts]
