"""An FSDP-sharded model's state in a checkpoint (``parallel.fsdp``, ``training.model.fsdp``).

Under torch FSDP2 every parameter is a DTensor whose local tensor holds this rank's equal slice of
dimension 0. megatron's ``sharded_state_dict`` describes most of them right: its checkpoint helpers
read the DTensor's local tensor and place it at offset ``dp_rank`` of ``dp_size`` along dimension 0
of the global tensor. The checkpoint then holds the same global tensors as at any other layout, so it
reshards to and from them. Two things need help:

- the SwiGLU ``linear_fc1`` weight: megatron's factory (``apply_swiglu_sharded_factory``) splits the
  local tensor in two halves and files them as this rank's gate rows and up rows, which is right for a
  tensor-parallel shard (``[gate_i; up_i]``) and wrong for an FSDP shard, a contiguous row range of the
  whole ``[gate; up]`` (at DP=2 rank 0 holds every gate row, rank 1 every up row). At TP=1 the global
  tensor in the checkpoint is that whole ``[gate; up]``, so a plain slice of dimension 0 is exact;
- loading: the load fills the local tensors in place, and ``model.load_state_dict`` would refuse them
  (it expects DTensors of the whole shape), so what did not land in place is copied in instead.

Optimizer moments are matched to their parameters by the identity of the local tensor (``local``):
``DTensor.to_local()`` returns a new view at each call, so megatron's mapping finds nothing through it.
"""

from __future__ import annotations

import torch


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a root FSDP2 unit (``parallel.fsdp``)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def local(param: torch.Tensor) -> torch.Tensor:
    """The tensor a checkpoint entry of ``param`` holds: a DTensor's own local tensor (the same object at every
    call), any other tensor itself."""
    from torch.distributed.tensor import DTensor

    return param._local_tensor if isinstance(param, DTensor) else param


def sharded_state_dict(model: torch.nn.Module) -> dict:
    """megatron's ``sharded_state_dict`` of ``model``; under FSDP with the fc1 factories replaced by slices of
    dimension 0 (see the module docstring)."""
    state = model.sharded_state_dict()
    if not is_sharded(model):
        return state
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    if ps.get_tensor_model_parallel_world_size() != 1:  # ParallelConfig refuses it; the slice below assumes it
        raise RuntimeError("an FSDP checkpoint is written at tensor_parallel 1 only")
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    for key, value in list(state.items()):
        if not isinstance(value, ShardedTensorFactory):
            continue
        if not key.endswith("mlp.linear_fc1.weight"):
            raise RuntimeError(f"{key}: a checkpoint factory FSDP does not know how to shard ({value.key})")
        built, _ = value.build()  # the gate half: its leading (layer) axes are the whole tensor's
        n = built.prepend_axis_num
        layer_axes = [(axis, built.global_offset[axis], built.global_shape[axis]) for axis in range(n)]
        state[key] = ShardedTensor.from_rank_offsets(
            value.key, value.data, *layer_axes, (n, dp_rank, dp), replica_id=value.replica_id, prepend_axis_num=n
        )
    return state


def load_into(model: torch.nn.Module, request: dict, loaded: dict) -> None:
    """Put what ``dist_checkpointing.load(request)`` returned into ``model``."""
    if not is_sharded(model):
        model.load_state_dict(loaded)
        return
    with torch.no_grad():
        for key, entry in request.items():
            target = getattr(entry, "data", None)
            if not isinstance(target, torch.Tensor):  # megatron's extra-state objects: nothing FSDP holds
                continue
            value = loaded[key]
            if value.data_ptr() != target.data_ptr():
                target.copy_(value)
