"""Checkpoints: megatron dist-checkpointing, staged locally, committed to the store.

``<store>/runs/<run>/checkpoints/step-NNNNNNN/`` holds

- ``model/``: the weights *and* the AdamW moments, in torch DCP format. The moments are
  sharded exactly like their parameters (megatron's optimizer-sharding helpers), so both
  reshard on load: a checkpoint written at TP=2 resumes at TP=1 or DP=2 with its optimizer
  state intact;
- ``rng/rank-NNNNN.pt``: each rank's random-number generator states, restored when the
  layout (world size, TP) is unchanged;
- ``meta.json``: step, layout, the history of layouts that trained the run's steps so far
  (``layouts``, a list of ``common.contracts.LayoutSpan``), configs, the loader state and the
  optimizer's step count.

A megatron optimizer (pipeline parallelism, the distributed optimizer: ``training.step``) saves
its own sharded state into ``model/`` instead of the moments above; it resumes on the same
layout only (``training.optimizer_state``).

The directory counts only once rank 0 has written ``_COMMITTED`` after every rank's files
are uploaded, so a crash at any point, or a store that goes away mid-upload, leaves nothing
that a resume would pick up.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from common.contracts import CHECKPOINT_META, CHECKPOINT_MODEL, checkpoint_prefix, checkpoints_prefix, step_of_checkpoint
from storage import Store
from training import optimizer_state
from training.model import checkpoint_group

OPTIMIZER_PREFIX = "optimizer.state"


def committed_steps(store: Store, run_prefix: str) -> list[int]:
    """The steps of the run's committed checkpoints, oldest first."""
    steps = (step_of_checkpoint(name) for name in store.children(checkpoints_prefix(run_prefix)))
    return sorted(s for s in steps if s is not None and store.is_committed(checkpoint_prefix(run_prefix, s)))


def _staging_dir(store: Store, key: str) -> Path:
    # The same path on every rank of a node (dist-checkpointing writes one directory), and a
    # different one per store: two stores can hold runs with the same id (tests, copies).
    where = hashlib.sha256(store.uri.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / "pretrain-staging" / where / key.replace("/", "_")


def _remove_staging(path: Path) -> None:
    """Delete a staging folder and the parents it leaves empty (one per store otherwise piles up)."""
    shutil.rmtree(path, ignore_errors=True)
    root = Path(tempfile.gettempdir()) / "pretrain-staging"
    for parent in path.parents:
        if parent == root or root not in parent.parents:
            break
        try:
            parent.rmdir()
        except OSError:
            break  # not empty: another step or run still stages there


def _local_leader() -> bool:
    return int(os.environ.get("LOCAL_RANK", "0")) == 0


def _barrier() -> None:
    dist.barrier(group=checkpoint_group())


# -- optimizer state, sharded like the model ------------------------------------------
def _optimizer_params(optimizer) -> list[torch.nn.Parameter]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _init_adam_state(optimizer) -> None:
    """Give every parameter an (empty) AdamW state, as a loaded checkpoint will fill it."""
    for p in _optimizer_params(optimizer):
        state = optimizer.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def _optimizer_sharded_state(model_state: dict, optimizer) -> dict:
    """``{key: ShardedTensor}`` of every per-parameter optimizer tensor, sharded like its parameter."""
    from megatron.core.dist_checkpointing.optimizer import get_param_id_to_sharded_param_map, make_sharded_optimizer_tensor

    params = _optimizer_params(optimizer)
    by_id = get_param_id_to_sharded_param_map(model_state, params)
    sharded = {}
    for i, p in enumerate(params):
        if i not in by_id:
            raise RuntimeError(f"optimizer parameter {i} {tuple(p.shape)} has no counterpart in the model's sharded state")
        for name, value in optimizer.state[p].items():
            if name == "step":  # one scalar shared by all parameters: kept in meta.json
                continue
            # Keyed by parameter index: the layers of a stack share one checkpoint key (the layer
            # is an offset along a prepended axis), so the checkpoint key cannot name the entry.
            sharded[f"{OPTIMIZER_PREFIX}.{i}.{name}"] = make_sharded_optimizer_tensor(
                by_id[i], value, prefix=f"{OPTIMIZER_PREFIX}.{name}"
            )
    return sharded


def _optimizer_step(optimizer) -> float:
    steps = {float(optimizer.state[p]["step"]) for p in _optimizer_params(optimizer) if "step" in optimizer.state[p]}
    if len(steps) > 1:
        raise RuntimeError(f"optimizer parameters are at different steps {sorted(steps)}")
    return steps.pop() if steps else 0.0


# -- random-number generators ------------------------------------------------------
def _rng_state() -> dict:
    from megatron.core import tensor_parallel

    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "megatron": tensor_parallel.get_cuda_rng_tracker().get_states(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }


def _set_rng_state(state: dict) -> None:
    from megatron.core import tensor_parallel

    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if state["megatron"]:
        tensor_parallel.get_cuda_rng_tracker().set_states(state["megatron"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


# -- save and load ----------------------------------------------------------------
def save(
    store: Store, run_prefix: str, step: int, model, optimizer, meta: dict, keep: int, files: dict[str, bytes] | None = None
) -> str:
    """Save on every rank (collective); returns the committed checkpoint's key prefix. ``files``
    (rank 0's) are committed with the checkpoint, e.g. the metrics up to this step, so that a
    resume finds them consistent with the weights whenever the crash came."""
    from megatron.core import dist_checkpointing

    rank = dist.get_rank()
    prefix = checkpoint_prefix(run_prefix, step)
    staging = _staging_dir(store, prefix)
    if _local_leader():
        shutil.rmtree(staging, ignore_errors=True)
        (staging / CHECKPOINT_MODEL).mkdir(parents=True)
        (staging / "rng").mkdir()
    _barrier()
    model_state = model.sharded_state_dict()
    if optimizer_state.is_megatron(optimizer):
        model_state[optimizer_state.KEY] = optimizer_state.sharded(optimizer, model, is_loading=False)
        meta = {**meta, **optimizer_state.checkpoint_meta(optimizer)}
    else:
        meta = {**meta, "optimizer_step": _optimizer_step(optimizer)}
        model_state |= _optimizer_sharded_state(model_state, optimizer)
    dist_checkpointing.save(model_state, str(staging / CHECKPOINT_MODEL))
    torch.save(_rng_state(), staging / "rng" / f"rank-{rank:05d}.pt")
    if rank == 0:
        (staging / CHECKPOINT_META).write_text(json.dumps(meta, indent=2, sort_keys=True))
        for name, data in (files or {}).items():
            (staging / name).write_bytes(data)
        if not store.is_committed(prefix):  # leftovers of an upload that never committed
            store.delete_prefix(prefix)
    _barrier()
    if _local_leader():
        store.upload_dir(staging, prefix)
    _barrier()
    if rank == 0:
        store.commit(prefix, {"step": step})
        for old in committed_steps(store, run_prefix)[:-keep] if keep > 0 else []:
            store.delete_prefix(checkpoint_prefix(run_prefix, old))
    _barrier()
    if _local_leader():
        _remove_staging(staging)
    return prefix


def fetch(store: Store, prefix: str, dest: Path, committed_at: str | None = None) -> Path:
    """Download a checkpoint to ``dest`` (once per node: call on local leaders). It must be
    committed, or ``committed_at`` (an enclosing directory, e.g. a registry entry) must be."""
    if not store.is_committed(committed_at or prefix):
        raise FileNotFoundError(f"checkpoint {store.url(prefix)} is not committed")
    shutil.rmtree(dest, ignore_errors=True)
    return store.download_dir(prefix, dest)


def load_model(model, local_dir: Path) -> None:
    """Load model weights saved at any TP or PP size into this rank's shard of ``model``."""
    from megatron.core import dist_checkpointing

    state = dist_checkpointing.load(model.sharded_state_dict(), str(local_dir / CHECKPOINT_MODEL))
    state.pop(optimizer_state.KEY, None)  # the common (unsharded) part of a megatron optimizer comes back too
    model.load_state_dict(state)


@contextmanager
def _fetched(store: Store, prefix: str, purpose: str, committed_at: str | None = None) -> Iterator[Path]:
    """The checkpoint downloaded once per node, readable by every local rank inside the block
    (collective); removed after all of them are done. Left in place if the block raises."""
    staging = _staging_dir(store, prefix) / purpose
    if _local_leader():
        fetch(store, prefix, staging, committed_at=committed_at)
    _barrier()
    yield staging
    _barrier()
    if _local_leader():
        _remove_staging(staging)


def load_weights(store: Store, prefix: str, model, committed_at: str) -> None:
    """Initialise ``model`` on every rank (collective) from a checkpoint's weights alone."""
    with _fetched(store, prefix, "weights", committed_at) as staging:
        load_model(model, staging)


def load(store: Store, prefix: str, model, optimizer, layout: dict) -> dict:
    """Resume on every rank (collective) at any layout: weights and optimizer moments reshard
    (a megatron optimizer's state only comes back on the same layout, see ``optimizer_state``);
    the RNG states are restored when ``layout`` matches the checkpoint's (otherwise the
    generators keep their seeded state). Returns the checkpoint's meta."""
    with _fetched(store, prefix, "resume") as staging:
        meta = json.loads((staging / CHECKPOINT_META).read_text())
        if not restores_optimizer(meta, optimizer, layout):
            load_model(model, staging)
        elif optimizer_state.is_megatron(optimizer):
            _load_megatron_optimizer(staging, model, optimizer, meta)
        else:
            _load_torch_optimizer(staging, model, optimizer, meta)
        rng_file = staging / "rng" / f"rank-{dist.get_rank():05d}.pt"
        if meta.get("layout") == layout and rng_file.exists():
            _set_rng_state(torch.load(rng_file, weights_only=False))
    return meta


def restores_optimizer(meta: dict, optimizer, layout: dict) -> bool:
    """Whether resuming the checkpoint of ``meta`` with ``optimizer`` on ``layout`` restores the
    optimizer state. Torch AdamW moments reshard to any layout; a megatron optimizer's state
    (pipeline parallelism, the distributed optimizer) comes back only to a megatron optimizer
    on the layout that saved it. Otherwise the weights load and the optimizer starts afresh."""
    if optimizer_state.is_megatron(optimizer) or optimizer_state.readable(meta):
        return optimizer_state.is_megatron(optimizer) and optimizer_state.readable(meta) and meta.get("layout") == layout
    return True


def _load_megatron_optimizer(staging: Path, model, optimizer, meta: dict) -> None:
    """Weights and a megatron optimizer's sharded state, saved by one on this layout."""
    from megatron.core import dist_checkpointing

    request = model.sharded_state_dict()
    request[optimizer_state.KEY] = optimizer_state.sharded(optimizer, model, is_loading=True)
    state = dist_checkpointing.load(request, str(staging / CHECKPOINT_MODEL))
    loaded = state.pop(optimizer_state.KEY)
    model.load_state_dict(state)
    optimizer_state.restore(optimizer, loaded, meta)


def _load_torch_optimizer(staging: Path, model, optimizer, meta: dict) -> None:
    """Weights and torch AdamW moments, both resharded to this layout."""
    from megatron.core import dist_checkpointing

    _init_adam_state(optimizer)
    model_state = model.sharded_state_dict()
    optim_state = _optimizer_sharded_state(model_state, optimizer)
    loaded = dist_checkpointing.load({**model_state, **optim_state}, str(staging / CHECKPOINT_MODEL))
    model.load_state_dict({k: v for k, v in loaded.items() if k not in optim_state})
    step = torch.tensor(float(meta["optimizer_step"]))
    for p in _optimizer_params(optimizer):
        optimizer.state[p]["step"] = step.clone()
    for key, sharded in optim_state.items():
        value = loaded[key]
        if value.untyped_storage().data_ptr() == sharded.data.untyped_storage().data_ptr():
            value = value.clone()  # loaded in place, possibly as a view: copy_ refuses overlaps
        sharded.data.copy_(value)
