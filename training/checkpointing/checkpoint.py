"""Checkpoints: megatron dist-checkpointing, staged locally, committed to the store.

``<store>/runs/<run>/checkpoints/step-NNNNNNN/`` holds

- ``model/``: the weights *and* the AdamW moments, in torch DCP format. The moments are
  sharded exactly like their parameters (megatron's optimizer-sharding helpers), so both
  reshard on load: a checkpoint written at TP=2 resumes at TP=1, DP=2 or under FSDP with its
  optimizer state intact, and an FSDP one at any of those (``fsdp_state``: the same global tensors);
- ``rng/rank-NNNNN.pt``: each rank's random-number generator states, restored when the
  layout (world size, TP) is unchanged;
- ``meta.json``: step, layout, the history of layouts that trained the run's steps so far
  (``layouts``, a list of ``common.contracts.LayoutSpan``), configs, the loader state and the
  optimizer's step count;
- ``digests.json``: the sha256 of every other file, computed from the staged bytes before the
  upload and written by rank 0 just before the commit.

A megatron optimizer (pipeline parallelism, the distributed optimizer: ``training.model.step``) saves
its own sharded state into ``model/`` instead of the moments above; it resumes on the same
layout only (``training.checkpointing.optimizer_state``).

The directory counts only once rank 0 has written ``_COMMITTED`` after every rank's files
are uploaded, so a crash at any point, or a store that goes away mid-upload, leaves nothing
that a resume would pick up.

Nothing in a checkpoint runs code when it is loaded. After a download, before anything is
read, every file must be listed in ``digests.json`` with its sha256 (``verify``). Then the
files are read as data only: megatron's ``.metadata`` (a pickle) through an unpickler that
knows only the classes of torch's checkpoint metadata, ``common.pt``, the sharded objects and
the RNG states with ``torch.load(weights_only=True)``, ``metadata.json`` and ``meta.json`` as
JSON; the load strategies are ours, not chosen by the checkpoint's ``metadata.json``.
"""

from __future__ import annotations

import functools
import io
import json
import os
import pickle
import random
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from common.contracts import CHECKPOINT_DIGESTS, CHECKPOINT_META, CHECKPOINT_MODEL, Layout
from common.contracts import checkpoint_prefix as checkpoint_prefix  # re-exported: the names of the run's checkpoints
from common.contracts import committed_steps as committed_steps  # and which of them count
from common.digests import digest_problems
from common.errors import UserError
from runs.staging import make_job_folder, remove_job_folder, store_root
from storage import COMMIT_MARKER, Store
from training.checkpointing import fsdp_state, local_copy, optimizer_state
from training.distributed import checkpoint_group

OPTIMIZER_PREFIX = "optimizer.state"
DIGESTS_FORMAT = "sha256-v1"
DCP_METADATA = ".metadata"  # torch DCP's global metadata file, a pickle


class CheckpointIntegrityError(UserError, ValueError):
    """A checkpoint whose files are not those committed, or that would run code if loaded: nothing was loaded."""


def _job_folder(store: Store) -> Path:
    """Collective: a staging folder private to this job, the same path on every rank of it.

    Private because two identical executions on one machine save the same checkpoint keys of the
    same run: a shared folder had one delete the other's files mid-save. Shared by the ranks of a
    node, because dist-checkpointing writes one directory per node: global rank 0 names it and
    broadcasts the name; each node's local leader creates it with an owner record, after removing
    the leftovers of processes of this host that no longer exist (a SIGKILLed job never cleans up).
    """
    name = [uuid.uuid4().hex if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(name, src=0, group=checkpoint_group())
    folder = store_root(store.uri) / name[0]
    if _local_leader():
        make_job_folder(folder)
    return folder


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
    by_id = get_param_id_to_sharded_param_map(model_state, [fsdp_state.local(p) for p in params])
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


# -- digests: what was committed is what loads ----------------------------------------
def verify(folder: Path, where: str) -> None:
    """Raise CheckpointIntegrityError unless ``folder`` (a downloaded checkpoint, ``where`` its
    URL) holds exactly the files its ``digests.json`` lists, each with the listed sha256."""
    listing = folder / CHECKPOINT_DIGESTS
    if not listing.is_file():
        raise CheckpointIntegrityError(
            f"checkpoint {where} has no {CHECKPOINT_DIGESTS}: its files cannot be checked, so it is not loaded "
            "(written by a release that did not record digests, or modified); train or register it again"
        )
    try:
        recorded = json.loads(listing.read_bytes())
        expected = recorded["files"]
        if recorded.get("format") != DIGESTS_FORMAT or not all(isinstance(v, str) for v in expected.values()):
            raise ValueError(f"format {recorded.get('format')!r}")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointIntegrityError(
            f"checkpoint {where}: {CHECKPOINT_DIGESTS} is not a digest list ({e}); nothing was loaded"
        ) from e
    problems = digest_problems(folder, expected, CHECKPOINT_DIGESTS, skip=frozenset({CHECKPOINT_DIGESTS, COMMIT_MARKER}))
    if problems:
        raise CheckpointIntegrityError(
            f"checkpoint {where} is not the one committed: {'; '.join(problems)}. "
            "It was modified after it was committed; nothing was loaded"
        )


# -- reading as data only ------------------------------------------------------------
# The classes a torch DCP ``.metadata`` pickle refers to (torch 2.x, as megatron writes it),
# each a dataclass, enum or value type whose construction runs no code of the file's choosing.
_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.distributed.checkpoint.planner": {"SavePlan", "WriteItem", "WriteItemType", "TensorWriteData", "BytesIOWriteData"},
    "torch": {"Size"},
    "torch.serialization": {"_get_layout"},  # torch.layout by name, from a fixed table
    "collections": {"OrderedDict"},
}


_DTYPES = {name for name, value in vars(torch).items() if isinstance(value, torch.dtype)}  # torch.float32, ...


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles a DCP ``.metadata`` file, refusing every global outside the allow-list."""

    def find_class(self, module: str, name: str):
        if name in _METADATA_CLASSES.get(module, ()) or (module == "torch" and name in _DTYPES):
            return super().find_class(module, name)
        raise CheckpointIntegrityError(
            f"checkpoint metadata refers to {module}.{name}, which checkpoint metadata never holds: "
            "it could run code, so nothing was loaded"
        )

    def persistent_load(self, pid):
        raise CheckpointIntegrityError("checkpoint metadata holds a persistent reference: nothing was loaded")


def read_dcp_metadata(path: Path):
    """A DCP ``.metadata`` file, unpickled with the allow-list and checked to name only files
    beside it (``relative_path`` is where the reader will open tensor data)."""
    from torch.distributed.checkpoint.metadata import Metadata

    with open(path, "rb") as f:
        metadata = _MetadataUnpickler(f).load()
    if not isinstance(metadata, Metadata):
        raise CheckpointIntegrityError(f"{path} holds a {type(metadata).__name__}, not checkpoint metadata")
    for info in (metadata.storage_data or {}).values():
        rel = getattr(info, "relative_path", None)
        if not isinstance(rel, str) or not rel or "/" in rel or "\\" in rel or rel in (".", ".."):
            raise CheckpointIntegrityError(f"{path} points tensor data at {rel!r}, outside the checkpoint folder")
    return metadata


def metadata_to_load(path: Path, load_id: object):
    """``read_dcp_metadata`` as a DCP reader's ``read_metadata`` returns it: with the load id torch
    matches its reads against."""
    from torch.distributed.checkpoint.metadata import StorageMeta

    metadata = read_dcp_metadata(path)
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    metadata.storage_meta.load_id = load_id
    return metadata


def load_bytes_as_data(planner, read_item, value: io.BytesIO) -> None:
    """A DCP load planner's ``load_bytes``: torch's own loads sharded objects (byte items) with
    ``weights_only=False``, which runs whatever the pickle names; these load as data only."""
    from torch.distributed.checkpoint._traverse import set_element

    loaded = torch.load(value, map_location="cpu", weights_only=True)
    if planner.flatten_state_dict:
        set_element(planner.original_state_dict, planner.mappings[read_item.dest_index.fqn], loaded)
    else:
        planner.state_dict[read_item.dest_index.fqn] = loaded


@functools.cache
def _safe_strategies() -> tuple[type, type]:
    """megatron's torch_dist load strategies, reading data only (classes made on first use:
    megatron is heavy to import)."""
    from megatron.core.dist_checkpointing.mapping import CheckpointingException
    from megatron.core.dist_checkpointing.strategies import torch as mcore_torch
    from megatron.core.dist_checkpointing.strategies.cached_metadata_filesystem_reader import CachedMetadataFileSystemReader
    from megatron.core.dist_checkpointing.strategies.common import COMMON_STATE_FNAME, TorchCommonLoadStrategy

    class Reader(CachedMetadataFileSystemReader):
        """torch's FileSystemReader reads ``.metadata`` with a plain ``pickle.load``."""

        def read_metadata(self, *args, **kwargs):
            if self._cached_metadata is None:
                self._cached_metadata = metadata_to_load(Path(self._get_metadata_path(kwargs.get("rank"))), self.load_id)
            return self._cached_metadata

    class Planner(mcore_torch.MCoreLoadPlanner):
        """torch's planner loads sharded objects (bytes items) with ``weights_only=False``."""

        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            load_bytes_as_data(self, read_item, value)

    @contextmanager
    def ours() -> Iterator[None]:
        # megatron makes its reader and planner inside each call, by these module names: the one
        # place where ours replace them, for the duration of a call of the strategy below.
        saved = mcore_torch._get_filesystem_reader, mcore_torch.MCoreLoadPlanner
        mcore_torch._get_filesystem_reader = lambda path, cache_metadata=False: Reader(path)
        mcore_torch.MCoreLoadPlanner = Planner
        try:
            yield
        finally:
            mcore_torch._get_filesystem_reader, mcore_torch.MCoreLoadPlanner = saved

    class ShardedLoad(mcore_torch.TorchDistLoadShardedStrategy):
        def load(self, *args, **kwargs):
            with ours():
                return super().load(*args, **kwargs)

        def load_tensors_metadata(self, *args, **kwargs):
            with ours():
                return super().load_tensors_metadata(*args, **kwargs)

        def load_sharded_metadata(self, *args, **kwargs):
            with ours():
                return super().load_sharded_metadata(*args, **kwargs)

    class CommonLoad(TorchCommonLoadStrategy):
        """megatron's ``torch.load`` of ``common.pt`` does not say ``weights_only`` (an environment
        variable can turn it off); sharded objects load through ShardedLoad instead."""

        def load_common(self, checkpoint_dir):
            path = Path(checkpoint_dir) / COMMON_STATE_FNAME
            if not path.is_file():
                raise CheckpointingException(f"Common file {path} does not exist")
            return torch.load(path, map_location="cpu", weights_only=True)

        def load_sharded_objects(self, sharded_objects_state_dict, checkpoint_dir):
            raise CheckpointingException("sharded objects load through the torch_dist strategy")

    return ShardedLoad, CommonLoad


def _dist_load(request: dict, folder: Path) -> dict:
    """``dist_checkpointing.load`` of ``request`` from the verified ``folder``, data only."""
    from megatron.core import dist_checkpointing

    # Checked here first for a clear error: torch turns a failing read_metadata inside its load
    # into a warning and an AssertionError ("metadata is None") after trying other files.
    read_dcp_metadata(folder / DCP_METADATA)
    sharded, common = _safe_strategies()
    return dist_checkpointing.load(request, str(folder), sharded_strategy=sharded(), common_strategy=common())


# -- random-number generators ------------------------------------------------------
# Saved as tensors, lists, ints, floats and strings only, so that it loads with
# ``torch.load(weights_only=True)``: numpy's and Python's states are converted, exactly.
def _rng_state() -> dict:
    from megatron.core import tensor_parallel

    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    version, mt, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "megatron": tensor_parallel.get_cuda_rng_tracker().get_states(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),  # uint32 words
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "python": {"version": version, "state": list(mt), "gauss_next": gauss_next},
    }


def _set_rng_state(state: dict) -> None:
    from megatron.core import tensor_parallel

    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if state["megatron"]:
        tensor_parallel.get_cuda_rng_tracker().set_states(state["megatron"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))


def load_rng_state(path: Path) -> dict:
    """A rank's saved RNG states, as data only (``weights_only=True``: no pickle of the file's choosing runs)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's message goes on to suggest weights_only=False: keep only what it refused.
        refused = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        why = f"it refers to {refused.group(1)}, which could run code" if refused else str(e).splitlines()[0]
        raise CheckpointIntegrityError(f"{path} is not RNG state saved by this release ({why}); nothing was loaded") from e


# -- load (saving: training.checkpointing.saving) ------------------------------------
def fetch(store: Store, prefix: str, dest: Path, committed_at: str | None = None) -> Path:
    """Download a checkpoint to ``dest`` (once per node: call on local leaders) and check every
    file against its ``digests.json`` (CheckpointIntegrityError, nothing loaded, if one differs,
    is missing or was added). It must be committed, or ``committed_at`` (an enclosing
    directory, e.g. a registry entry) must be."""
    if not store.is_committed(committed_at or prefix):
        raise FileNotFoundError(f"checkpoint {store.url(prefix)} is not committed")
    shutil.rmtree(dest, ignore_errors=True)
    store.download_dir(prefix, dest)
    verify(dest, store.url(prefix))
    return dest


def load_model(model, local_dir: Path) -> None:
    """Load model weights saved at any TP or PP size into this rank's shard of ``model``
    (``local_dir``: a checkpoint ``fetch`` checked)."""
    request = fsdp_state.sharded_state_dict(model)
    state = _dist_load(request, local_dir / CHECKPOINT_MODEL)
    state.pop(optimizer_state.KEY, None)  # the common (unsharded) part of a megatron optimizer comes back too
    fsdp_state.load_into(model, request, state)


@contextmanager
def _fetched(store: Store, prefix: str, purpose: str, committed_at: str | None = None) -> Iterator[Path]:
    """The checkpoint downloaded once per node, readable by every local rank inside the block
    (collective); removed after all of them are done. Left in place if the block raises."""
    job = _job_folder(store)
    staging = job / purpose
    if _local_leader():
        fetch(store, prefix, staging, committed_at=committed_at)
    _barrier()
    yield staging
    _barrier()
    if _local_leader():
        remove_job_folder(job)


def load_weights(store: Store, prefix: str, model, committed_at: str) -> None:
    """Initialise ``model`` on every rank (collective) from a checkpoint's weights alone."""
    with _fetched(store, prefix, "weights", committed_at) as staging:
        load_model(model, staging)


@contextmanager
def _resume_folder(store: Store, prefix: str, run_prefix: str, step: int, node_copy: Path | None) -> Iterator[Path]:
    """The checkpoint to resume on local disk inside the block (collective): ``node_copy`` where the caller found
    one newer than the store's (``local_copy.newer_copy``), else this node's kept copy of the committed ``prefix``
    where it is usable (``local_copy``: rank 0 judges, on one node), else ``prefix`` downloaded (``_fetched``)."""
    if node_copy is not None:
        local, said = [str(node_copy)], f"this node's checkpoint of step {step} (saved here only, digests checked)"
    else:
        kept = local_copy.usable(store, prefix, step, run_prefix, verify) if run_prefix and dist.get_rank() == 0 else None
        local = [str(kept or "")]
        dist.broadcast_object_list(local, src=0, group=checkpoint_group())
        said = f"this node's copy of {store.url(prefix)} (digests checked)"
    if not local[0]:
        with _fetched(store, prefix, "resume") as staging:
            yield staging
        return
    if dist.get_rank() == 0:
        print(f"resuming from {said}: nothing downloaded", flush=True)
    _barrier()
    yield Path(local[0])
    _barrier()


def load(
    store: Store, prefix: str, model, optimizer, layout: dict, run_prefix: str = "", step: int = 0, node_copy: Path | None = None
) -> dict:
    """Resume on every rank (collective) at any layout: weights and optimizer moments reshard
    (a megatron optimizer's state only comes back on the same layout, see ``optimizer_state``);
    the RNG states are restored when ``layout`` matches the checkpoint's (otherwise the
    generators keep their seeded state). Returns the checkpoint's meta. With ``run_prefix`` and ``step`` (the
    run's checkpoint ``prefix`` is), a copy this node kept of it is read instead of a download (``local_copy``);
    with ``node_copy`` (the same on every rank), that folder: a checkpoint of ``step`` this node saved only."""
    with _resume_folder(store, prefix, run_prefix, step, node_copy) as staging:
        meta = json.loads((staging / CHECKPOINT_META).read_text())
        if not restores_optimizer(meta, optimizer, layout):
            load_model(model, staging)
        elif optimizer_state.is_megatron(optimizer):
            _load_megatron_optimizer(staging, model, optimizer, meta)
        else:
            _load_torch_optimizer(staging, model, optimizer, meta)
        rng_file = staging / "rng" / f"rank-{dist.get_rank():05d}.pt"
        if same_layout(meta, layout) and rng_file.exists():
            _set_rng_state(load_rng_state(rng_file))
    return meta


def restores_optimizer(meta: dict, optimizer, layout: dict) -> bool:
    """Whether resuming the checkpoint of ``meta`` with ``optimizer`` on ``layout`` restores the
    optimizer state. Torch AdamW moments reshard to any layout; a megatron optimizer's state
    (pipeline parallelism, the distributed optimizer) comes back only to a megatron optimizer
    on the layout that saved it, with the same gradient buckets. Otherwise the weights load and the
    optimizer starts afresh."""
    if optimizer_state.is_megatron(optimizer) or optimizer_state.readable(meta):
        return (
            optimizer_state.is_megatron(optimizer)
            and optimizer_state.readable(meta)
            and same_layout(meta, layout)
            and optimizer_state.same_buckets(meta, optimizer)
        )
    return True


def same_layout(meta: dict, layout: dict) -> bool:
    """Whether the checkpoint of ``meta`` was saved by ``layout`` (``asdict`` of a ``Layout``). A layout recorded
    before a field existed reads as that field's default (a checkpoint from before ``fsdp``: not FSDP)."""
    recorded = meta.get("layout")
    return recorded is not None and Layout(**recorded) == Layout(**layout)


def _load_megatron_optimizer(staging: Path, model, optimizer, meta: dict) -> None:
    """Weights and a megatron optimizer's sharded state, saved by one on this layout."""
    request = model.sharded_state_dict()
    request[optimizer_state.KEY] = optimizer_state.sharded(optimizer, model, is_loading=True)
    state = _dist_load(request, staging / CHECKPOINT_MODEL)
    loaded = state.pop(optimizer_state.KEY)
    model.load_state_dict(state)
    optimizer_state.restore(optimizer, loaded, meta)


def _load_torch_optimizer(staging: Path, model, optimizer, meta: dict) -> None:
    """Weights and torch AdamW moments, both resharded to this layout."""
    _init_adam_state(optimizer)
    model_state = fsdp_state.sharded_state_dict(model)
    optim_state = _optimizer_sharded_state(model_state, optimizer)
    loaded = _dist_load({**model_state, **optim_state}, staging / CHECKPOINT_MODEL)
    fsdp_state.load_into(model, model_state, {k: v for k, v in loaded.items() if k not in optim_state})
    step = torch.tensor(float(meta["optimizer_step"]))
    for p in _optimizer_params(optimizer):
        optimizer.state[p]["step"] = step.clone()
    for key, sharded in optim_state.items():
        value = loaded[key]
        if value.untyped_storage().data_ptr() == sharded.data.untyped_storage().data_ptr():
            value = value.clone()  # loaded in place, possibly as a view: copy_ refuses overlaps
        sharded.data.copy_(value)
