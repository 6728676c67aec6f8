"""One optimizer step of a parallel layout: build this rank's model and optimizer, then step it.

Three implementations behind one interface (``TrainStep``), chosen by ``build_step``:

- ``LocalStep`` (pipeline_parallel = 1, no distributed optimizer): a plain loop over the
  micro-batches, gradients summed over data-parallel ranks (and the sequence-parallel norm
  weights over tensor-parallel ranks) by hand, global-norm clipping, torch AdamW. The optimizer
  state is a torch ``state_dict`` per parameter.
- ``MegatronStep`` (pipeline_parallel > 1 or ``distributed_optimizer``): megatron's
  ``DistributedDataParallel`` (fp32 gradient buffers; with the distributed optimizer a
  reduce-scatter of gradients and an all-gather of weights), its 1F1B pipeline schedule over
  the micro-batches (``get_forward_backward_func``), ``finalize_model_grads`` (data-parallel
  reduction, sequence-parallel norm weights, the tied embedding shared by the first and last
  stages) and its optimizer (``get_megatron_optimizer``: AdamW, clipping over the
  model-parallel group; with ``use_distributed_optimizer`` the state sharded over
  data-parallel ranks). On a GPU this is megatron as shipped, in bf16 with fp32 main weights.
  ``parallel.overlap_grad_reduce`` / ``overlap_param_gather`` switch on its bucketed overlap of
  the gradient reduction with backward and of the weights' all-gather with the next forward.
- ``FsdpStep`` (``parallel.fsdp``, ``training.model.fsdp``): LocalStep's maths on a model
  sharded by torch FSDP2 (weights, gradients and Adam moments over data-parallel ranks).

Each step times its phases on the ``StepTimer`` it is given (forward+backward, collectives,
optimizer) and asks ``accept`` (the loss-health check) before it updates anything: a batch whose
loss is refused leaves weights and optimizer state untouched.

All compute the same thing: the mean over micro-batches of each micro-batch's mean token
loss, gradients averaged over data-parallel ranks, clipped to ``grad_clip`` by the global norm,
AdamW with betas (0.9, 0.95), eps 1e-8, weight decay on matrices only, the learning rate given
per step. Every rank returns the same loss and gradient norm.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch
import torch.distributed as dist

from common.settings import problems_error
from training import cpu_compat
from training.config import ModelConfig, ParallelConfig, Precision, TrainConfig, batch_problems
from training.model.compiling import compile_model, resolve_compile
from training.model.fsdp import FsdpStep
from training.model.gpt import build_gpt, mean_loss, model_inputs
from training.model.layers import TP_PARTIAL
from training.model.shared import (
    BETAS,
    EPS,
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


class TrainStep(Protocol):
    model: torch.nn.Module
    """This rank's model (its pipeline stage), unwrapped: what checkpoints save and load."""
    optimizer: object
    """torch AdamW, or a megatron optimizer (``sharded_state_dict``) for ``MegatronStep``."""

    def step(self, batch: torch.Tensor, lr: float, timer: StepTimer, accept: Accept = accept_all) -> StepResult:
        """One optimizer step on this rank's rows of the global batch."""
        ...

    def num_parameters(self) -> int:
        """Parameters of the whole model, over all tensor- and pipeline-parallel ranks."""
        ...

    def evaluate(self, batch: torch.Tensor) -> float:
        """Mean loss of this rank's rows of a global batch, forward only (no gradient, no state changed),
        averaged over the data-parallel ranks: the same number on every rank."""
        ...


def micro_batches(cfg: TrainConfig, dp_size: int) -> int:
    """Micro-batches per rank per step (gradient accumulation / pipeline micro-batches)."""
    problems = batch_problems(cfg, dp_size)
    if problems:
        raise problems_error(problems)
    return cfg.global_batch_size // (cfg.micro_batch_size * dp_size)


def build_step(
    model_cfg: ModelConfig, parallel: ParallelConfig, cfg: TrainConfig, vocab_size: int, seq_len: int, eod_id: int | None = None
) -> TrainStep:
    """This rank's model and optimizer for ``parallel`` (megatron's groups must be initialised); ``eod_id`` (the
    dataset's end-of-text id) is what ``train.document_masking`` splits documents at."""
    from megatron.core import parallel_state as ps

    accumulation = micro_batches(cfg, ps.get_data_parallel_world_size())
    model = build_gpt(
        model_cfg,
        vocab_size,
        seq_len,
        parallel.tensor_parallel,
        parallel.sequence_parallel,
        pipeline_parallel=parallel.pipeline_parallel,
        init_seed=cfg.seed,
        recompute=cfg.recompute,
        document_eod=eod_id if cfg.document_masking else None,
        fp8_recipe=cfg.fp8_recipe if cfg.precision == Precision.FP8 else "",
    )
    if resolve_compile(cfg.compile, next(model.parameters()).device.type):
        compile_model(model)
    if parallel.fsdp:
        return FsdpStep(model, cfg, accumulation)
    if parallel.pipeline_parallel > 1 or parallel.distributed_optimizer:
        return MegatronStep(
            model,
            cfg,
            accumulation,
            seq_len,
            parallel.distributed_optimizer,
            overlap_grad_reduce=parallel.overlap_grad_reduce,
            overlap_param_gather=parallel.overlap_param_gather,
        )
    return LocalStep(model, cfg, accumulation, parallel.sequence_parallel)


class LocalStep:
    """Pipeline-parallel size 1: micro-batch loop, hand-made reductions, torch AdamW."""

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig, accumulation: int, sequence_parallel: bool) -> None:
        self.model = model
        self.cfg = cfg
        self.accumulation = accumulation
        self.sequence_parallel = sequence_parallel
        self.params = [p for p in model.parameters() if p.requires_grad]
        # Replicated weights whose gradient each TP rank holds a part of: norm weights under sequence parallelism
        # (a slice of the sequence each) and the query/key norms (some of the heads each).
        self.tp_partial = [
            p
            for p in self.params
            if (sequence_parallel and getattr(p, "sequence_parallel", False)) or getattr(p, TP_PARTIAL, False)
        ]
        self.optimizer = adamw(self.params, cfg)
        model.train()

    def num_parameters(self) -> int:
        return count_parameters(self.model)

    @torch.no_grad()
    def evaluate(self, batch: torch.Tensor) -> float:
        return mean_over_data_parallel(micro_batch_mean_loss(self.model, batch, self.cfg.micro_batch_size))

    def step(self, batch: torch.Tensor, lr: float, timer: StepTimer, accept: Accept = accept_all) -> StepResult:
        from megatron.core import parallel_state as ps

        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=self.params[0].device)
        micros = batch.split(self.cfg.micro_batch_size)
        weights = token_weights(self.model, micros)
        with timer.phase("forward_backward"):
            for i, micro in enumerate(micros):
                loss = mean_loss(self.model, micro)
                loss = loss / self.accumulation if weights is None else loss * weights[i]
                loss.backward()
                loss_sum += loss.detach()
        tp_group = ps.get_tensor_model_parallel_group()
        with timer.phase("collective"):
            mean = mean_over_data_parallel(loss_sum)
        if not accept(mean):
            self.optimizer.zero_grad(set_to_none=True)
            return StepResult(mean, float("nan"), False)
        with timer.phase("collective"):
            _all_reduce_grads(self.params, ps.get_data_parallel_group(), average_over=ps.get_data_parallel_world_size())
            _all_reduce_grads(self.tp_partial, tp_group)
            norm = _grad_norm(self.params, tp_group, ps.get_tensor_model_parallel_rank())
        with timer.phase("optimizer"):
            if self.cfg.grad_clip > 0:
                scale = torch.clamp(self.cfg.grad_clip / (norm + 1e-6), max=1.0)
                torch._foreach_mul_([p.grad for p in self.params if p.grad is not None], scale)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return StepResult(mean, norm.item(), True)


def _all_reduce_grads(params: list[torch.nn.Parameter], group, average_over: int = 1) -> None:
    """Sum the gradients over ``group`` in one flat collective, divided by ``average_over``."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads or dist.get_world_size(group) == 1:
        return
    flat = torch._utils._flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=group)
    if average_over > 1:
        flat /= average_over
    for g, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
        g.copy_(synced)


def _grad_norm(params: list[torch.nn.Parameter], tp_group, tp_rank: int) -> torch.Tensor:
    """Global L2 norm: TP-sharded params count on every rank, replicated ones once.

    One ``_foreach_norm`` over the gradients (a kernel per dtype group, as torch's
    ``clip_grad_norm_``), not a reduction per parameter."""
    grads = [
        p.grad.detach() for p in params if p.grad is not None and (getattr(p, "tensor_model_parallel", False) or tp_rank == 0)
    ]
    total = torch.zeros((), dtype=torch.float32, device=params[0].device)
    if grads:
        norms = torch._foreach_norm(grads, 2.0, dtype=torch.float32)
        total += torch.stack(norms).square().sum()
    dist.all_reduce(total, group=tp_group)
    return total.sqrt()


class MegatronStep:
    """megatron's DDP, pipeline schedule and optimizer (distributed or not)."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: TrainConfig,
        accumulation: int,
        seq_len: int,
        distributed_optimizer: bool,
        overlap_grad_reduce: bool = False,
        overlap_param_gather: bool = False,
    ) -> None:
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        self.model = model
        self.cfg = cfg
        self.accumulation = accumulation
        self.seq_len = seq_len
        self.last_stage = ps.is_pipeline_last_stage()
        config = model.config
        ddp_config = DistributedDataParallelConfig(
            use_distributed_optimizer=distributed_optimizer,
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=overlap_grad_reduce,
            overlap_param_gather=overlap_param_gather,
        )
        self.ddp = DistributedDataParallel(config, ddp_config, model)
        if overlap_grad_reduce:
            # As megatron-lm's training loop: the schedules run every micro-batch but the last inside no_sync, so
            # a bucket's reduction starts once the last micro-batch's backward has filled it. (Without it megatron
            # 0.16 counts every micro-batch's gradients against the first step's counts and starts at the same point.)
            config.no_sync_func = self.ddp.no_sync
        # The schedule calls this after the last backward: DP reduction, tied embedding, SP norms.
        config.finalize_model_grads_func = self._finalize_grads
        self._finalize = finalize_model_grads
        self._timer: StepTimer | None = None
        optimizer_config = OptimizerConfig(
            optimizer="adam",
            lr=cfg.lr,
            min_lr=cfg.min_lr,
            weight_decay=cfg.weight_decay,
            adam_beta1=BETAS[0],
            adam_beta2=BETAS[1],
            adam_eps=EPS,
            clip_grad=cfg.grad_clip,
            bf16=config.bf16,
            params_dtype=config.params_dtype,
            use_distributed_optimizer=distributed_optimizer,
        )
        with cpu_compat.cuda_type_names():
            # megatron's default groups: no weight decay on biases and 1-D tensors (wd_mult 0).
            self.optimizer = get_megatron_optimizer(optimizer_config, [self.ddp])
        self.ddp.train()

    def num_parameters(self) -> int:
        return count_parameters(self.model)

    @torch.no_grad()
    def evaluate(self, batch: torch.Tensor) -> float:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        # With overlap_param_gather the last step updated each rank's own shard of the weights only; megatron's
        # finish_grad_sync marked their all-gather undispatched, so this forward's pre-hooks gather them first.
        micros = batch.split(self.cfg.micro_batch_size)
        losses = get_forward_backward_func()(
            forward_step_func=self._forward_step,
            data_iterator=self._weighted(micros),
            model=[self.ddp],
            num_microbatches=len(micros),
            seq_length=self.seq_len,
            micro_batch_size=self.cfg.micro_batch_size,
            forward_only=True,
        )
        return self._mean_loss(losses)

    def _mean_loss(self, losses: list[dict[str, torch.Tensor]]) -> float:
        """The last stage's mean over the micro-batches, told to the other stages, averaged over DP."""
        from megatron.core import parallel_state as ps

        loss = torch.zeros((), dtype=torch.float32, device=next(self.model.parameters()).device)
        if self.last_stage:
            loss += torch.stack([m["loss"] for m in losses]).float().mean()
        pp_group = ps.get_pipeline_model_parallel_group()
        if dist.get_world_size(pp_group) > 1:
            dist.broadcast(loss, src=ps.get_pipeline_model_parallel_last_rank(), group=pp_group)
        return mean_over_data_parallel(loss)

    def _weighted(self, micros: tuple[torch.Tensor, ...]) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        """The schedule's data: each micro-batch with the factor of its loss (None without masking): its
        ``token_weights`` share times the micro-batch count, by which the schedule divides every loss."""
        weights = token_weights(self.model, micros)
        factors = [w * len(micros) for w in weights] if weights is not None else [None] * len(micros)
        return iter(zip(micros, factors, strict=True))

    def _finalize_grads(self, *args, **kwargs):
        # Called inside the schedule: its time is the collectives', not forward+backward's.
        with self._timer.phase("collective"):
            return self._finalize(*args, **kwargs)

    def _forward_step(self, data: Iterator[torch.Tensor], model: torch.nn.Module):
        from training.model.layers import mean_token_loss

        tokens, factor = next(data)
        inputs, positions, labels, attention_mask, loss_mask = model_inputs(self.model, tokens)
        # The DDP wrapper only adds gradient hooks to the parameters: run the model itself.
        if self.last_stage:
            output = mean_token_loss(self.model, inputs, positions, labels, attention_mask, loss_mask)
            if factor is not None:  # its share of the global batch's trained tokens, not 1 / micro-batches
                output = output * factor
        else:  # hidden states for the next stage (this stage's input came via set_input_tensor)
            output = self.model(inputs, positions, attention_mask)
        return output, _report_loss

    def step(self, batch: torch.Tensor, lr: float, timer: StepTimer, accept: Accept = accept_all) -> StepResult:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_mult", 1.0)
            group["weight_decay"] = self.cfg.weight_decay * group.get("wd_mult", 1.0)
        self._timer = timer
        with timer.phase("forward_backward"):  # pipeline sends and receives included
            self.ddp.zero_grad_buffer()
            self.optimizer.zero_grad()
            losses = get_forward_backward_func()(
                forward_step_func=self._forward_step,
                data_iterator=self._weighted(batch.split(self.cfg.micro_batch_size)),
                model=[self.ddp],
                num_microbatches=self.accumulation,
                seq_length=self.seq_len,
                micro_batch_size=self.cfg.micro_batch_size,
                forward_only=False,
            )
        with timer.phase("collective"):  # only the last stage computed the loss: it tells the other stages
            mean = self._mean_loss(losses)
        if not accept(mean):
            return StepResult(mean, float("nan"), False)  # the next step zeroes the gradient buffers
        # The optimizer's own collectives (gradient norm, the distributed optimizer's all-gather) count here.
        with timer.phase("optimizer"), cpu_compat.cuda_type_names():
            _, norm, _ = self.optimizer.step()
            if norm is None:  # clipping off: the optimizer did not compute it
                norm = self.optimizer.get_grad_norm()
        return StepResult(mean, float(norm), True)


def _report_loss(loss: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    # The schedule divides the returned tensor in place by the micro-batch count: log a copy.
    return loss, {"loss": loss.detach().clone()}
