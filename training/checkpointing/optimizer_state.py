"""A megatron optimizer's state in a checkpoint (``training.checkpointing.checkpoint`` calls this).

A megatron optimizer (``training.model.step.MegatronStep``: pipeline parallelism, the distributed
optimizer) is saved through its own ``sharded_state_dict``, into the model's DCP directory
under ``optimizer``. The format is megatron's default for the distributed optimizer,
``dp_reshardable``: every rank writes its own shard of the fp32 main weights and Adam moments
as laid out in its gradient buffers, with no gather on one rank; without the distributed
optimizer megatron writes each parameter's moments sharded like the parameter.
``meta.json`` records the AdamW step count and the format.

Resume: the optimizer state comes back exactly when the layout (world size, TP, PP,
distributed optimizer) and the gradient buckets (``parallel.overlap_grad_reduce`` splits the
buffers into buckets of megatron's default size; off, one bucket) are the ones it was written with.
After such a change the weights reshard as always and the optimizer starts afresh (zero moments,
step 0): the buffers' layout depends on the data-parallel size, on which parameters a stage holds
and on the bucket boundaries.
"""

from __future__ import annotations

import torch

from training import cpu_compat

KEY = "optimizer"
FORMAT = "megatron-dp_reshardable"


def is_megatron(optimizer) -> bool:
    """A megatron optimizer saves its state sharded, next to the model, not per rank."""
    return hasattr(optimizer, "sharded_state_dict")


def readable(meta: dict) -> bool:
    """Whether a checkpoint's meta says it holds a megatron optimizer state of our format."""
    return meta.get("optimizer_format") == FORMAT and "optimizer_step" in meta


def checkpoint_meta(optimizer) -> dict:
    """What meta.json records besides the shards."""
    return {"optimizer_step": _adam_step(optimizer), "optimizer_format": FORMAT, "optimizer_bucket_size": _bucket_size(optimizer)}


def same_buckets(meta: dict, optimizer) -> bool:
    """Whether the checkpoint of ``meta`` was written with ``optimizer``'s gradient buckets. A checkpoint from
    before the bucket size was recorded had one bucket (no ``overlap_grad_reduce``): it reads as None."""
    return meta.get("optimizer_bucket_size") == _bucket_size(optimizer)


def _bucket_size(optimizer) -> int | None:
    """megatron DDP's bucket size (elements; None: a single bucket), the same for every model chunk."""
    sizes = {chunk.ddp_config.bucket_size for chunk in getattr(optimizer, "model_chunks", [])}
    return sizes.pop() if len(sizes) == 1 else None


def gather_weights(optimizer) -> None:
    """Collective: finish the all-gather of the updated weights that ``parallel.overlap_param_gather`` leaves to
    the next forward. Until then each rank's model holds the step's update in its own shard of the weights
    only, and a checkpoint (written by data-parallel rank 0) would save the other shards from the step before."""
    for chunk in getattr(optimizer, "model_chunks", []):
        if chunk.ddp_config.use_distributed_optimizer and chunk.ddp_config.overlap_param_gather:
            chunk.start_param_sync(force_sync=True)


def sharded(optimizer, model, is_loading: bool) -> dict:
    """The optimizer's sharded state dict: to save, or (``is_loading``) to load into."""
    if is_loading:
        _init_adam_state(optimizer)
    metadata = {"distrib_optim_sharding_type": "dp_reshardable"}  # 0.16 refuses its model-space format
    with cpu_compat.cuda_type_names():
        return optimizer.sharded_state_dict(model.sharded_state_dict(), is_loading=is_loading, metadata=metadata)


def restore(optimizer, loaded: dict, meta: dict) -> None:
    """Load what ``dist_checkpointing.load`` returned for ``sharded(..., is_loading=True)``."""
    # fp32 main weights (CPU) are views of the parameters, which autograd guards from copies.
    with cpu_compat.cuda_type_names(), torch.no_grad():
        optimizer.load_state_dict(loaded)
    _set_adam_steps(optimizer, meta["optimizer_step"])


def _inner_adam_states(optimizer) -> list[dict]:
    chained = getattr(optimizer, "chained_optimizers", [optimizer])
    return [state for part in chained for state in part.optimizer.state.values()]


def _init_adam_state(optimizer) -> None:
    """Give every parameter an AdamW state (zero moments, step 0) for the checkpoint to fill:
    with torch's AdamW (no Apex/TE) megatron reads the step count off that state while it
    prepares to load, and a fresh optimizer has none."""
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = part.optimizer
        for group in inner.param_groups:
            for p in group["params"]:
                if not inner.state[p]:
                    inner.state[p].update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))


def _adam_step(optimizer) -> float:
    """The AdamW step count (bias correction) every parameter is at."""
    steps = {float(state["step"]) for state in _inner_adam_states(optimizer) if "step" in state}
    if len(steps) > 1:
        raise RuntimeError(f"optimizer parameters are at different steps {sorted(steps)}")
    return steps.pop() if steps else 0.0


def _set_adam_steps(optimizer, step: float) -> None:
    """Restore the step count, one tensor per parameter. megatron 0.16 with torch's AdamW does
    not: its dp_reshardable load copies the placeholder step over the loaded one, into a single
    tensor shared by all parameters (which AdamW's in-place increment would then advance once
    per parameter per step)."""
    for state in _inner_adam_states(optimizer):
        state["step"] = torch.tensor(step)
