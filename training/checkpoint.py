"""Checkpoints: megatron dist-checkpointing, staged locally, committed to the store.

``<store>/runs/<run>/checkpoints/step-NNNNNNN/`` holds the model (torch DCP format, which
megatron reshards on load), each rank's optimizer state and ``meta.json``. The directory
counts only once rank 0 has written ``_COMMITTED`` after every rank's files are uploaded,
so a crash at any point leaves nothing that a resume would pick up.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from storage import Store

CHECKPOINTS = "checkpoints"


def step_prefix(run_prefix: str, step: int) -> str:
    return f"{run_prefix}/{CHECKPOINTS}/step-{step:07d}"


def committed_steps(store: Store, run_prefix: str) -> list[int]:
    steps = []
    for name in store.children(f"{run_prefix}/{CHECKPOINTS}"):
        if name.startswith("step-") and store.is_committed(f"{run_prefix}/{CHECKPOINTS}/{name}"):
            steps.append(int(name.removeprefix("step-")))
    return sorted(steps)


def _staging_dir(run_prefix: str, step: int) -> Path:
    # The same path on every rank of a node: dist-checkpointing writes one directory.
    return Path(tempfile.gettempdir()) / "pretrain-staging" / run_prefix.replace("/", "_") / f"step-{step:07d}"


def _local_leader() -> bool:
    return int(os.environ.get("LOCAL_RANK", "0")) == 0


def save(store: Store, run_prefix: str, step: int, model, optimizer, meta: dict, keep: int) -> str:
    """Save on every rank (collective); returns the committed checkpoint's key prefix."""
    from megatron.core import dist_checkpointing

    rank = dist.get_rank()
    staging = _staging_dir(run_prefix, step)
    if _local_leader():
        shutil.rmtree(staging, ignore_errors=True)
        (staging / "model").mkdir(parents=True)
        (staging / "optim").mkdir()
    dist.barrier()
    dist_checkpointing.save(model.sharded_state_dict(), str(staging / "model"))
    torch.save(optimizer.state_dict(), staging / "optim" / f"rank-{rank:05d}.pt")
    if rank == 0:
        (staging / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    dist.barrier()
    prefix = step_prefix(run_prefix, step)
    if _local_leader():
        store.upload_dir(staging, prefix)
    dist.barrier()
    if rank == 0:
        store.commit(prefix, {"step": step})
        for old in committed_steps(store, run_prefix)[:-keep] if keep > 0 else []:
            store.delete_prefix(step_prefix(run_prefix, old))
    dist.barrier()
    if _local_leader():
        shutil.rmtree(staging, ignore_errors=True)
    return prefix


def fetch(store: Store, prefix: str, dest: Path, committed_at: str | None = None) -> Path:
    """Download a checkpoint to ``dest`` (once per node: call on local leaders). It must be
    committed, or ``committed_at`` (an enclosing directory, e.g. a registry entry) must be."""
    if not store.is_committed(committed_at or prefix):
        raise FileNotFoundError(f"checkpoint {store.url(prefix)} is not committed")
    shutil.rmtree(dest, ignore_errors=True)
    return store.download_dir(prefix, dest)


def load_model(model, local_dir: Path) -> None:
    """Load model weights saved at any TP size into this rank's shard of ``model``."""
    from megatron.core import dist_checkpointing

    state = dist_checkpointing.load(model.sharded_state_dict(), str(local_dir / "model"))
    model.load_state_dict(state)


def load_weights(store: Store, prefix: str, model, committed_at: str) -> None:
    """Initialise ``model`` on every rank (collective) from a checkpoint's weights alone."""
    staging = _staging_dir(prefix, 0).parent / "weights"
    if _local_leader():
        fetch(store, prefix, staging, committed_at=committed_at)
    dist.barrier()
    load_model(model, staging)
    dist.barrier()
    if _local_leader():
        shutil.rmtree(staging, ignore_errors=True)


def load(store: Store, prefix: str, model, optimizer, layout: dict) -> dict:
    """Resume on every rank (collective): weights, the meta, and this rank's optimizer
    state when the checkpoint was written with the same parallel ``layout`` (optimizer
    shards follow the rank layout; the weights reshard to any layout)."""
    staging = _staging_dir(prefix, 0).parent / "resume"
    if _local_leader():
        fetch(store, prefix, staging)
    dist.barrier()
    load_model(model, staging)
    meta = json.loads((staging / "meta.json").read_text())
    optim_file = staging / "optim" / f"rank-{dist.get_rank():05d}.pt"
    if meta.get("layout") == layout and optim_file.exists():
        optimizer.load_state_dict(torch.load(optim_file, weights_only=False))
    dist.barrier()
    if _local_leader():
        shutil.rmtree(staging, ignore_errors=True)
    return meta
