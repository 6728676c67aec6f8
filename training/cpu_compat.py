"""Run megatron-core on a machine without CUDA. Applied only when CUDA is absent.

megatron-core assumes a GPU in a handful of places that have nothing to do with the maths
(see ``../shared/FIELD_NOTES.md``, measured on 0.16 and 0.19). Rather than fork megatron,
this module redirects exactly those calls to the CPU:

- ``torch.cuda.current_device()`` used as a ``device=`` argument → ``"cpu"``;
- ``torch.cuda.synchronize()`` (dist-checkpoint save) → no-op;
- megatron's CUDA RNG state get/set (activation recompute) → the CPU generator;
- ``Tensor.cuda()`` (pipeline stages with tied embeddings) → identity;
- ``torch.cuda.manual_seed`` → no-op (the CPU generator is seeded separately);
- the default causal attention mask, built with ``device="cuda"`` → built on the CPU;
- tensors created with a hard-coded ``device="cuda"`` in the pipeline schedules, the
  optimizer, gradient clipping and ``utils.local_multi_tensor_l2_norm`` → created on the CPU
  (those modules see a ``torch`` whose factory functions map a CUDA device to the CPU);
- the dist-checkpoint writers' results queue, a ``Manager`` megatron starts with ``spawn`` (safe
  beside CUDA; 2–3 s of a fresh interpreter in every rank process that saves) → a ``fork``
  ``Manager``, as megatron's own writer processes are forked, that first closes the rank's sockets
  it inherited (a killed rank's peers must see its connections close);
- the device mesh megatron's torch FSDP2 wrapper builds with a literal ``"cuda"``
  (``TorchFullyShardedDataParallel``, ``parallel.fsdp``) → built on the CPU (``DeviceMeshOnCpu``);
- the optimizers' dtype checks ``param.type() == "torch.cuda.FloatTensor"`` (mixed-precision
  and distributed optimizer construction, ``clip_grad_by_total_norm_fp32``) → accepted for
  CPU tensors, but only inside ``cuda_type_names()``, which the trainer wraps around
  megatron-optimizer calls.

gloo implements every collective megatron's DDP and distributed optimizer and FSDP2 use here
(``all_gather_into_tensor``, ``reduce_scatter_tensor`` and ``ReduceOp.AVG`` included, torch 2.13),
so none is shimmed. Configuration-level fixes live with the model code (``use_cpu_initialization=True``,
the no-op inference RNG tracker, ``batch_p2p_sync=False``). On a CUDA machine ``apply()``
and ``cuda_type_names()`` do nothing and megatron runs exactly as shipped.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import multiprocessing
import os
import signal
import stat
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import torch

from common.forking import inherited_objects_frozen

_applied = False


def cuda_available() -> bool:
    return torch.cuda.is_available()


def apply() -> bool:
    """Patch megatron-core for CPU if CUDA is absent. Idempotent; returns True if patched."""
    global _applied
    if cuda_available():
        return False
    if _applied:
        return True
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    torch.cuda.manual_seed = lambda *a, **k: None  # type: ignore[assignment]
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]

    with fusions_uncompiled():
        from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import random as mp_random
    from megatron.core.transformer import utils as transformer_utils

    @functools.lru_cache(maxsize=8)
    def causal_mask(sq: int) -> torch.Tensor:
        return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)

    transformer_utils.get_default_causal_mask = causal_mask
    fused_softmax.get_default_causal_mask = causal_mask
    mp_random._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mp_random._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)

    import megatron.core.utils as megatron_utils
    from megatron.core.optimizer import clip_grads, optimizer
    from megatron.core.pipeline_parallel import schedules

    for module in (schedules, optimizer, clip_grads, megatron_utils):
        module.torch = TorchOnCpu()

    from megatron.core.distributed import torch_fully_sharded_data_parallel

    torch_fully_sharded_data_parallel.DeviceMesh = DeviceMeshOnCpu

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if hasattr(filesystem_async, "_get_write_results_queue"):
        filesystem_async._get_write_results_queue = _forked_results_queue
    _applied = True
    return True


@contextlib.contextmanager
def fusions_uncompiled() -> Iterator[None]:
    """Import megatron-core inside this block, where CUDA is absent, without compiling its fusions.

    megatron-core decorates its fused kernels (bias + GeLU/SwiGLU, cross-entropy pieces, ...) with
    ``megatron.core.jit.jit_fuser``, which is ``torch.compile`` on torch >= 2.2: the first decoration imports
    Dynamo and Inductor, 2.2 s of CPU in every process that imports megatron on the 2-core machine (5.2 s
    with it, 3.0 s without). On a CPU none of those fusions runs (a run with ``train.compile: off`` compiles
    nothing: its ``compile_s`` is 0), so they are left plain functions, as megatron's own
    ``disable_jit_fuser`` would leave them, which it cannot do before its package has imported them. With
    CUDA, or once megatron is imported, nothing changes."""
    if cuda_available() or "megatron.core" in sys.modules:
        yield
        return
    compile_ = torch.compile
    torch.compile = _leave_uncompiled  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.compile = compile_


def _leave_uncompiled(model: Any = None, **_: Any) -> Any:
    """``torch.compile``'s signature, compiling nothing: the function itself, or a decorator returning it."""
    return model if model is not None else (lambda fn: fn)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@functools.cache
def _forked_results_queue():
    from multiprocessing.managers import SyncManager

    manager = SyncManager(address=_manager_address(), ctx=multiprocessing.get_context("fork"))
    with inherited_objects_frozen():
        manager.start(initializer=_as_the_ranks_own, initargs=(os.getpid(),))
    return manager.Queue()


def _manager_address() -> str | None:
    """A Linux abstract socket (no file, so no path limit): multiprocessing's default is a file under
    ``$TMPDIR``, and a socket path longer than 107 bytes cannot be bound; the manager then died at its
    start and the rank's checkpoint save failed with an EOFError (a test's TMPDIR under pytest's
    numbered temporary folders crossed the limit at run 100). The manager still checks the
    rank's authkey on every connection. Elsewhere: multiprocessing's default."""
    return f"\0pretrain-checkpoint-results-{os.getpid()}-{uuid.uuid4().hex}" if sys.platform == "linux" else None


def _as_the_ranks_own(rank_pid: int) -> None:
    """In the forked manager, before it listens: it dies with the rank, and the rank's sockets stay the rank's.

    A rank the launcher kills (its peer failed first) runs no exit handler, so nothing would stop its
    manager, which holds the rank's standard output and error: a ``pretrain run`` whose output is read
    through a pipe would never see it end. Linux sends the parent-death signal when the thread that
    forked this process ends; that is the rank's main thread, which saves checkpoints. A copy of the
    rank's sockets (its gloo connections, the c10d store) held here would keep a killed rank's
    connections open, and its peers would wait out a collective timeout instead of seeing them close."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed in the checkpoint results manager")
        if os.getppid() != rank_pid:  # the rank died before the signal was armed
            os._exit(0)
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, gone already
            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                os.close(int(name))


# Tensor factories megatron calls with a literal device="cuda".
_FACTORIES = frozenset({"tensor", "zeros", "ones", "empty", "full", "arange"})


def _is_cuda(device: Any) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def _on_cpu(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    @functools.wraps(factory)
    def make(*args: Any, **kwargs: Any) -> torch.Tensor:
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        return factory(*args, **kwargs)

    return make


class TorchOnCpu:
    """``torch`` as a megatron module sees it on a CPU machine: the same module, except that
    tensor factories asked for a CUDA device build on the CPU."""

    def __getattr__(self, name: str) -> Any:
        value = getattr(torch, name)
        return _on_cpu(value) if name in _FACTORIES else value


class DeviceMeshOnCpu:
    """``torch.distributed.DeviceMesh`` as megatron's FSDP2 wrapper sees it on a CPU machine: its
    ``DeviceMesh.from_group(group, "cuda")`` builds the mesh of the CPU (gloo) instead."""

    @staticmethod
    def from_group(group: Any, device_type: str, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.device_mesh import DeviceMesh

        return DeviceMesh.from_group(group, "cpu" if device_type == "cuda" else device_type, *args, **kwargs)


@contextlib.contextmanager
def cuda_type_names() -> Iterator[None]:
    """Inside, ``tensor.type()`` of a CPU tensor names its CUDA twin (``torch.cuda.FloatTensor``),
    the only types megatron's optimizers accept. Scoped, not global: nothing else is told a
    CPU tensor lives on a GPU. A no-op where CUDA is present."""
    if cuda_available():
        yield
        return
    original = torch.Tensor.type

    def type_name(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        if dtype is None and not kwargs and self.device.type == "cpu":
            return original(self).replace("torch.", "torch.cuda.", 1)
        return original(self, dtype, non_blocking, **kwargs)

    torch.Tensor.type = type_name  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.type = original  # type: ignore[method-assign]
