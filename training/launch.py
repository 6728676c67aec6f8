"""Run a function on N local ranks, as torchrun would: for tests, benchmarks and the CLI.

Flyte's ``Elastic`` plays this part inside the workflow; both go through
``torch.distributed.elastic``, so the library code cannot tell them apart. A failed job raises a
``training.observe.failures.JobFailed`` (a ``ChildFailedError``) that names the rank that failed first; a
``RankUserError`` (also a ``UserError``) where that rank's error was one the user can fix.

Ranks start from a fork server that has loaded what every rank needs once (``forkserver``,
``training.rank_preload``): a spawned rank spends 5–12 s importing torch and megatron-core and
walking the code's import graph, every launch. A forked rank is a fresh process all the same (its
own pid, exit and signals, as the launcher expects). What it would inherit from the server instead
of the launching process is set from that process when the rank starts, before the function and
its arguments are unpickled there (so what they import sees what a spawned rank would see): its
standard output and error (the launcher's own file descriptors, passed to the rank), the
environment, the working folder and ``tempfile``'s folder (``from_fork_server``).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys
import tempfile
import uuid
from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import dynamic_rendezvous
from torch.distributed.launcher import api as launcher_api
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from common.net import free_port
from training.observe.failures import job_failure
from training.restarts import RestartingAgent

_SERVER_ENV = dict(os.environ)  # the fork server's own environment, as a rank inherits it


def _method_name(depth: int = 2) -> str:
    """torch's ``dynamic_rendezvous.get_method_name``, which names the caller of each rendezvous event it
    records, without ``inspect.stack()``: that builds, twice per event, the source context of every frame
    and scans ``sys.modules`` for frames of files it cannot place. With torch, megatron, flytekit and pytest
    loaded, 18 events took 2.4 s of CPU per launch; the same name from the frame itself takes microseconds."""
    frame = sys._getframe(1)
    for _ in range(depth - 1):
        frame = frame.f_back
        if frame is None:
            return "no_method_name"
    return frame.f_code.co_name


dynamic_rendezvous.get_method_name = _method_name
# torch's launch_agent builds its agent by this module-level name; both our launchers (``launch`` here, the
# workflow's ``tasks.elastic``) go through it: a failed attempt restarts only where a restart may help.
launcher_api.LocalElasticAgent = RestartingAgent


def launch(fn: Callable[..., Any], nproc: int, *args: Any, max_restarts: int = 0, start_method: str = "forkserver") -> Any:
    """Run ``fn(*args)`` on ``nproc`` local processes; returns rank 0's result.

    ``start_method="spawn"`` starts each rank as a fresh interpreter, a child of this process: as fast
    where this process launches once, and then the launcher sees a rank's death first hand rather than
    through the fork server (which reports it a moment later, sometimes after a peer's own failure).

    A failure raises ``JobFailed``: its first line names the rank that failed first and its own error,
    not a peer's collective error (torch reports the rank whose process exited first). Where that error
    was a ``UserError``, a ``RankUserError`` (a UserError and a JobFailed) whose message is that one line."""
    if start_method not in ("forkserver", "spawn"):
        raise ValueError(f"start_method must be 'forkserver' or 'spawn', not {start_method!r}")
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        max_restarts=max_restarts,
        monitor_interval=0.1,  # a failed rank is seen before the peers that fail because of it exit too
        start_method=start_method,
    )
    try:
        if start_method == "spawn":
            return elastic_launch(config, fn)(*args)[0]
        return elastic_launch(config, from_fork_server)(*fork_server_args(fn, *args))[0]
    except ChildFailedError as e:
        failed = job_failure(e)
        # The same report with the right rank first: nothing to chain, except under a rank's user error (the report).
        raise failed from failed.__cause__


def fork_server_args(fn: Callable[..., Any], *args: Any, preload: tuple[str, ...] = ()) -> tuple[Any, ...]:
    """The arguments with which ``from_fork_server``, started by torch's elastic agent with
    ``start_method="forkserver"``, runs ``fn(*args)`` in each rank as a spawned rank would run it.

    The first call in a process names what the fork server loads (``training.rank_preload``, then the
    modules in ``preload``: third-party ones that read no setting a caller changes later); it starts with
    the first launch and serves every later one."""
    multiprocessing.set_forkserver_preload(["training.rank_preload", *preload])
    return (_Inherited(1), _Inherited(2)), dict(os.environ), os.getcwd(), pickle.dumps((fn, args))


def from_fork_server(streams: tuple[int, int], env: dict[str, str], cwd: str, call: bytes) -> Any:
    """``fn(*args)`` (pickled in ``call``) in this rank, with the launching process's standard output and
    error (``streams``, as ``_Inherited`` hands them over), environment and working folder, as a spawned
    rank would have them, plus what the launcher set for this rank (RANK, MASTER_PORT, ...)."""
    sys.stdout.flush()
    sys.stderr.flush()
    for inherited, fd in zip(streams, (1, 2), strict=True):
        os.dup2(inherited, fd)
        os.close(inherited)
    for_rank = {key: value for key, value in os.environ.items() if _SERVER_ENV.get(key) != value}
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(for_rank)
    os.chdir(cwd)
    tempfile.tempdir = None  # found again from TMPDIR, as it now is
    fn, args = pickle.loads(call)
    return fn(*args)


class _Inherited:
    """A file descriptor of the launching process, given to the rank itself: pickled for the fork server,
    it travels with the rank's start (``multiprocessing.reduction.DupFd``), so the rank writes to the very
    file description the launcher has (its offset too: a log file is appended to, not overwritten)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction

        return _received, (reduction.DupFd(self.fd),)


def _received(dup: Any) -> int:
    return dup.detach()
