"""Saving a checkpoint: a short synchronous snapshot, then the rest in the background.

``start_save`` (collective) returns once every rank holds a private copy of what the checkpoint
will hold: megatron's save plan (agreed by all ranks), the tensors to write copied to host memory,
the RNG states, ``meta.json`` and rank 0's files, all staged. That is the step loop's stall. A
thread then writes the tensors, finishes torch DCP's metadata, computes every file's sha256,
uploads each node's files and, on rank 0, writes ``digests.json`` and the commit marker last.
``PendingSave.wait`` joins it and re-raises what failed there.

Why it is safe:

- **the copy is the checkpoint**: the optimizer updates the live tensors in place while the
  thread writes, so every tensor the plan writes is copied first (on a GPU: the device-to-host
  copy megatron's own asynchronous save makes; on the CPU, where megatron's preload is a no-op,
  a clone);
- **its own collectives**: the thread's collectives (the DCP write results, the digests, the
  barriers around the upload) run on ``training.distributed.saver_group``, which nothing else
  uses, so they never interleave with the step loop's on another group;
- **one at a time**: the caller waits for the previous save before starting the next, and for
  the last one before the run ends (``CheckpointManager``);
- **nothing partial counts**: the commit marker is the last object written, after every node's
  upload; a crash at any point leaves an uncommitted prefix, which a resume ignores and the next
  save of that step deletes before uploading.

With ``background=False`` the same work runs inline, before ``start_save`` returns. A save kept on this node
only (``node_only``, ``train.local_checkpoint_every``) stops after the digests: its staged folder becomes the
node's newest copy (``local_copy``), nothing is uploaded or committed.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from common.contracts import CHECKPOINT_DIGESTS, CHECKPOINT_META, CHECKPOINT_MODEL, checkpoint_prefix, committed_steps, prunable
from common.digests import file_sha256, folder_files
from common.stages import mark_stage
from runs.staging import remove_job_folder
from storage import AlreadyCommitted, Store, open_store
from training.checkpointing import fsdp_state, local_copy, optimizer_state
from training.checkpointing.checkpoint import (
    DIGESTS_FORMAT,
    _job_folder,
    _local_leader,
    _optimizer_sharded_state,
    _optimizer_step,
    _rng_state,
)
from training.distributed import checkpoint_group, saver_group


class PendingSave:
    """A checkpoint being completed (in a thread, or already, inline). ``wait`` is local to this rank."""

    def __init__(self, step: int, prefix: str, complete: Callable[[], None] | None, background: bool) -> None:
        self.step, self.prefix = step, prefix
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if complete is None:
            return
        if not background:
            complete()
            return

        def run() -> None:
            try:
                complete()
            except BaseException as e:  # noqa: BLE001 - re-raised by wait() on the step loop's thread
                self._error = e

        # A daemon: a save stuck on a dead store must not keep a failed rank from exiting (it commits nothing).
        self._thread = threading.Thread(target=run, name=f"checkpoint-save-{step}", daemon=True)
        self._thread.start()

    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def wait(self) -> str:
        """Block until the save is committed on every rank's side; the committed key prefix. What failed in
        the background is raised here as it was raised there: a full store stays a StoreFullError, which the
        CLI reports in one line, and the watchdog's phase already names the save's step."""
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            self._error.add_note(f"raised in the background save of the checkpoint of step {self.step} ({self.prefix})")
            raise self._error
        return self.prefix


def start_save(
    store: Store,
    run_prefix: str,
    step: int,
    model,
    optimizer,
    meta: dict,
    keep: int,
    files: dict[str, bytes] | None = None,
    background: bool = True,
    keep_every: int = 0,
    keep_local: int = 0,
    node_only: bool = False,
) -> PendingSave:
    """Snapshot the checkpoint of ``step`` on every rank (collective) and complete it in the background
    (or inline): see the module docstring. ``files`` (rank 0's) are committed with it. Afterwards the run
    keeps its ``keep`` latest checkpoints and those whose step is a multiple of ``keep_every`` (0 = none).
    This node keeps its newest ``keep_local`` on local disk (``local_copy``). A ``node_only`` save is written
    and digested the same way but neither uploaded nor committed: it becomes this node's newest copy (one node
    only, ``keep_local`` >= 1; ``train.local_checkpoint_every``) and its PendingSave's prefix is ''."""
    prefix = checkpoint_prefix(run_prefix, step)
    if not node_only and _committed_already(store, run_prefix, prefix, keep, keep_every):
        return PendingSave(step, prefix, None, background)
    if dist.get_rank() == 0:
        mark_stage("checkpoint-node" if node_only else "checkpoint")
    job, write_tensors, finalize_dcp = _stage(store, model, optimizer, meta, files)
    target = None if node_only else store
    complete = functools.partial(
        _complete_save, target, store.uri, run_prefix, step, (keep, keep_every, keep_local), job, write_tensors, finalize_dcp
    )
    return PendingSave(step, "" if node_only else prefix, complete, background)


def _committed_already(store: Store, run_prefix: str, prefix: str, keep: int, keep_every: int) -> bool:
    """Whether ``prefix`` is committed already (by this run before a crash, or by an identical execution), so that
    nothing is uploaded or deleted and the committed files stay as they are; every rank learns it from rank 0."""
    rank = dist.get_rank()
    done = [store.is_committed(prefix) if rank == 0 else None]
    dist.broadcast_object_list(done, src=0, group=checkpoint_group())
    if done[0]:
        if rank == 0:
            _prune(store, run_prefix, keep, keep_every)
        dist.barrier(group=checkpoint_group())
    return bool(done[0])


def _stage(store: Store, model, optimizer, meta: dict, files: dict[str, bytes] | None) -> tuple[Path, Callable, Callable]:
    """The synchronous part (collective): the job's staging folder, this rank's tensors copied to host memory, its
    RNG state, rank 0's meta and files staged. Returns the job folder, the function that writes the tensors and
    the DCP finalisation."""
    from megatron.core import dist_checkpointing

    rank = dist.get_rank()
    job = _job_folder(store)
    staging = job / "save"
    if _local_leader():
        (staging / CHECKPOINT_MODEL).mkdir(parents=True)
        (staging / "rng").mkdir()
    dist.barrier(group=checkpoint_group())
    model_state, meta = _sharded_state(model, optimizer, meta)
    with _planning_on(saver_group()):
        request = dist_checkpointing.save(model_state, str(staging / CHECKPOINT_MODEL), async_sharded_save=True)
    write_tensors = _snapshot(request)
    torch.save(_rng_state(), staging / "rng" / f"rank-{rank:05d}.pt")
    if rank == 0:
        (staging / CHECKPOINT_META).write_text(json.dumps(meta, indent=2, sort_keys=True))
        for name, data in (files or {}).items():
            (staging / name).write_bytes(data)
    # The DCP finalisation (write results gathered, .metadata written by rank 0); megatron's other
    # finaliser writes metadata.json after a barrier on the default group: ours does it on the saver's.
    return job, write_tensors, request.finalize_fns[0]


def _sharded_state(model, optimizer, meta: dict) -> tuple[dict, dict]:
    """This rank's sharded state to save (weights and optimizer state) and the meta.json with the optimizer's
    own entries."""
    optimizer_state.gather_weights(optimizer)  # what overlap_param_gather left to the next forward
    model_state = fsdp_state.sharded_state_dict(model)
    if optimizer_state.is_megatron(optimizer):
        model_state[optimizer_state.KEY] = optimizer_state.sharded(optimizer, model, is_loading=False)
        return model_state, {**meta, **optimizer_state.checkpoint_meta(optimizer)}
    model_state |= _optimizer_sharded_state(model_state, optimizer)
    return model_state, {**meta, "optimizer_step": _optimizer_step(optimizer)}


def _complete_save(
    store: Store | None,
    store_uri: str,
    run_prefix: str,
    step: int,
    keeps: tuple[int, int, int],
    job: Path,
    write_tensors: Callable[[], None],
    finalize_dcp: Callable[[], None],
) -> None:
    """The rest of a save after its snapshot (in the background or inline): write the tensors, finish the DCP
    metadata, record the digests, upload and commit to ``store`` (``_upload_and_commit``; None: a save kept on this
    node only), and keep the staged folder as this node's copy if ``keep_local`` is not 0 (``local_copy``)."""
    keep_local = keeps[2]
    rank = dist.get_rank()
    staging = job / "save"
    if rank == 0 and store is not None:
        mark_stage("checkpoint-upload")
    write_tensors()
    finalize_dcp()
    if rank == 0:
        from megatron.core.dist_checkpointing.core import CheckpointingConfig, save_config

        save_config(CheckpointingConfig("torch_dist", 1), str(staging / CHECKPOINT_MODEL))
    dist.barrier(group=saver_group())
    digests = _gather_digests(staging, saver_group())  # rank 0's
    if store is not None:
        _upload_and_commit(open_store(store_uri), staging, run_prefix, step, digests, keeps)
    dist.barrier(group=saver_group())
    if rank == 0 and keep_local and local_copy.single_node():  # the node's only leader; it has every rank's files
        try:
            local_copy.keep(store_uri, run_prefix, step, staging, digests, DIGESTS_FORMAT, keep_local)
        except OSError as e:  # a copy is a convenience (a node-only one: the run goes back to the store's newest)
            print(f"WARNING: no local copy of the checkpoint of step {step} kept ({e})", file=sys.stderr, flush=True)
    if _local_leader():
        remove_job_folder(job)


def _upload_and_commit(
    target: Store, staging: Path, run_prefix: str, step: int, digests: dict[str, str] | None, keeps: tuple[int, int, int]
) -> None:
    """Upload every node's staged files (collective on the saver's group; ``target``: its own client, the step
    loop keeps using the trainer's), then on rank 0 the digests, the commit marker last, and the pruning."""
    prefix = checkpoint_prefix(run_prefix, step)
    rank = dist.get_rank()
    # Leftovers of an upload that never committed. The run's lease (runs.lease) makes this
    # job the run's only writer, so they are no one else's work in progress.
    if rank == 0 and not target.is_committed(prefix):
        target.delete_prefix(prefix)
    dist.barrier(group=saver_group())
    if _local_leader():
        target.upload_dir(staging, prefix)
    dist.barrier(group=saver_group())
    if rank == 0:
        target.put_json(f"{prefix}/{CHECKPOINT_DIGESTS}", {"format": DIGESTS_FORMAT, "files": digests})
        try:
            target.commit(prefix, {"step": step})
        except AlreadyCommitted:
            pass  # committed meanwhile by an identical writer: the same step of the same run counts as done
        _prune(target, run_prefix, keeps[0], keeps[1])


def save(
    store: Store, run_prefix: str, step: int, model, optimizer, meta: dict, keep: int, files: dict[str, bytes] | None = None
) -> str:
    """``start_save`` completed inline (collective): the committed checkpoint's key prefix."""
    return start_save(store, run_prefix, step, model, optimizer, meta, keep, files, background=False).wait()


@contextmanager
def _planning_on(group) -> Iterator[None]:
    """megatron's asynchronous torch_dist save plans on the default group and finalises on the group it
    planned on; ours plans on ``group`` (the saver's), so that the finalisation in the background uses it
    too. megatron looks the planner function up by module name in each call: replaced for this one."""
    from megatron.core.dist_checkpointing.strategies import torch as mcore_torch

    plan = mcore_torch.save_state_dict_async_plan

    @functools.wraps(plan)
    def on_group(state_dict, writer, _process_group, *args, **kwargs):
        return plan(state_dict, writer, group, *args, **kwargs)

    mcore_torch.save_state_dict_async_plan = on_group
    try:
        yield
    finally:
        mcore_torch.save_state_dict_async_plan = plan


def _snapshot(request) -> Callable[[], None]:
    """Copy every tensor megatron's plan writes to host memory (a clone where it is there already) and
    return the function that writes them, in this thread, as megatron's writer processes would, handing
    the results to the DCP finalisation through the writer's results queue."""
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync

    if request.async_fn is None:  # nothing to write on this rank
        return lambda: None
    transforms, _use_msc = request.async_fn.args
    _rank, buckets, results_queue = request.async_fn_args
    copied = [
        (file_name, key, (bytes_data, [(item, t.detach().to("cpu", copy=True)) for item, t in tensor_data]))
        for file_name, key, (bytes_data, tensor_data) in buckets
    ]

    def write() -> None:
        results: dict[int, list] = {}
        for i, bucket in enumerate(copied):
            out: queue.SimpleQueue = queue.SimpleQueue()
            count: queue.Queue = queue.Queue()
            count.put(i)
            FileSystemWriterAsync.write_preloaded_data(transforms, i, bucket, out, count, use_fsync=True)
            _, written = out.get()
            if isinstance(written, BaseException):
                raise written
            results[i] = written
        results_queue.put(results)

    return write


def _gather_digests(staging: Path, group) -> dict[str, str] | None:
    """Collective on ``group``: the sha256 of every file staged on every node, on rank 0 (None elsewhere).

    Each node stages only its own ranks' files and its local leader uploads them, so no rank
    sees all the files: the ranks of a node split their node's files between them (after the
    barrier that ends the writes), and rank 0 gathers every node's share. The digests are of
    the staged bytes, so a file that changes during or after the upload is caught at load.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    mine = folder_files(staging)[local_rank::local_world] if local_rank < local_world else []
    share = {rel: file_sha256(staging / rel) for rel in mine}
    shares: list[dict[str, str] | None] = [None] * dist.get_world_size(group) if dist.get_rank() == 0 else []
    dist.gather_object(share, shares if dist.get_rank() == 0 else None, dst=0, group=group)
    if dist.get_rank() != 0:
        return None
    digests: dict[str, str] = {}
    for part in shares:
        for rel, digest in (part or {}).items():
            if digests.setdefault(rel, digest) != digest:  # two nodes staged different bytes under one name
                raise RuntimeError(f"checkpoint file {rel} was staged with different contents on two nodes")
    return dict(sorted(digests.items()))


def _prune(store: Store, run_prefix: str, keep: int, keep_every: int = 0) -> None:
    """Delete all but the ``keep`` latest committed checkpoints of the run (``keep`` 0: none), sparing those
    whose step is a multiple of ``keep_every`` (0: none spared)."""
    for old in prunable(committed_steps(store, run_prefix), keep, keep_every):
        store.delete_prefix(checkpoint_prefix(run_prefix, old))


def write_weights(model, folder: Path, meta: dict) -> None:
    """A weights-only checkpoint of ``model`` (one process: TP=1, PP=1) in the local ``folder``, as a registry
    entry holds one: megatron's sharded ``model/`` (loadable at any layout), ``meta.json`` and the digests."""
    from megatron.core import dist_checkpointing

    (folder / CHECKPOINT_MODEL).mkdir(parents=True)
    dist_checkpointing.save(fsdp_state.sharded_state_dict(model), str(folder / CHECKPOINT_MODEL))
    (folder / CHECKPOINT_META).write_text(json.dumps(meta, indent=2, sort_keys=True))
    digests = {rel: file_sha256(folder / rel) for rel in folder_files(folder)}
    (folder / CHECKPOINT_DIGESTS).write_text(
        json.dumps({"format": DIGESTS_FORMAT, "files": dict(sorted(digests.items()))}, indent=2)
    )
