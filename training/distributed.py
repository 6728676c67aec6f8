"""Process groups: the world (NCCL on GPUs, gloo on CPU), megatron's model-parallel groups, and a gloo
group for the long waits around checkpoint transfers. Every collective has a timeout."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from common.settings import problems_error
from training import cpu_compat
from training.config import ModelConfig, ParallelConfig, layout_problems, world_problems
from training.observe.diagnostics import enable_flight_recorder

# Gloo groups with their own, longer timeout for waits around checkpoint uploads (see checkpoint_group),
# and for the collectives of a checkpoint saved in the background (see saver_group).
_checkpoint_group = None
_saver_group = None


def init_distributed(parallel: ParallelConfig, seed: int, standalone: bool = False) -> None:
    """Join the process group and set up megatron's groups.

    Ranks launched by torchrun or Elastic rendezvous through the env:// variables. A
    ``standalone`` process (evaluation, a notebook) gets a world of one on an in-memory
    store, ignoring any RANK/MASTER_PORT left in its environment by an earlier launch.
    """
    global _checkpoint_group, _saver_group
    cpu_compat.apply()
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        local_rank = 0 if standalone else int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
        # Every collective gives up after this long: a dead or stuck peer becomes an error, not a hang.
        timeout = timedelta(seconds=parallel.collective_timeout_s)
        if standalone or "RANK" not in os.environ:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        else:
            enable_flight_recorder()
            if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True):
                rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
                dist.init_process_group(backend, store=_attempt_store(timeout), rank=rank, world_size=world, timeout=timeout)
            else:
                dist.init_process_group(backend=backend, timeout=timeout)
        _checkpoint_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=parallel.checkpoint_timeout_s))
        _saver_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=parallel.checkpoint_timeout_s))
    world = dist.get_world_size()
    tp, pp = parallel.tensor_parallel, parallel.pipeline_parallel
    check_parallel(parallel)
    _raise(world_problems(parallel, world, "; the world of this launch"))
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    # megatron's own groups (TP, DP, …) carry the same timeout; its default is 30 minutes.
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        distributed_timeout_minutes=parallel.collective_timeout_s / 60,
    )
    torch.manual_seed(seed)
    # On CPU the no-op tracker stands in for CUDA RNG streams (dropout is off anyway).
    model_parallel_cuda_manual_seed(seed, inference_rng_tracker=not torch.cuda.is_available())


def _attempt_store(timeout: timedelta) -> dist.Store:
    """The torch elastic agent's store, with this attempt's keys under a prefix of their own. The agent's store
    outlives its ranks, and torch (2.13) reuses it across restarts of the ranks (``train.max_restarts``) without
    one (its env:// rendezvous assumes a new store per restart): a restarted rank read the address a dead rank had
    published for a process group and failed to connect ("Connection refused") whenever it looked before the new
    rank republished it."""
    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    return dist.PrefixStore(f"/worker/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", client)


def checkpoint_group():
    """All ranks, on gloo, with ``parallel.checkpoint_timeout_s``: for the waits while one rank
    uploads or downloads a checkpoint, which may outlast the collective timeout."""
    return _checkpoint_group


def saver_group():
    """All ranks, on gloo, with ``parallel.checkpoint_timeout_s``, used only by the thread that completes a
    checkpoint save in the background: collectives of two threads on one group would interleave differently
    on different ranks, so the step loop's collectives and the saver's never share a group."""
    return _saver_group


def _raise(problems: list[str]) -> None:
    if problems:
        raise problems_error(problems)


def check_parallel(parallel: ParallelConfig, model: ModelConfig | None = None) -> None:
    """Raise ConfigError for a parallel layout that cannot work, before anything is built: the
    sections' own rules (``PipelineConfig`` applies the same ones when a config is loaded)."""
    problems = parallel.problems()
    if model is not None:
        problems += model.problems() + layout_problems(model, parallel)
    _raise(problems)


def shutdown_distributed() -> None:
    global _checkpoint_group, _saver_group
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
    _checkpoint_group = _saver_group = None
