"""Run a function on N local ranks, as torchrun would: for tests, benchmarks and the CLI.

Flyte's ``Elastic`` plays this part inside the workflow; both go through
``torch.distributed.elastic``, so the library code cannot tell them apart. A failed job raises a
``training.failures.JobFailed`` (a ``ChildFailedError``) that names the rank that failed first; a
``RankUserError`` (also a ``UserError``) where that rank's error was one the user can fix.

Ranks start from a fork server that has loaded what every rank needs once (``forkserver``,
``training.rank_preload``): a spawned rank spends 5–12 s importing torch and megatron-core and
walking the code's import graph, every launch. A forked rank is a fresh process all
the same (its own pid, exit and signals, as the launcher expects); what it would inherit from the
server instead of this process, the environment, the working folder and ``tempfile``'s folder, is
set from this process at the start of the rank, before the function and its arguments are unpickled
there, so that what they import sees the environment it would see in a spawned rank (``_as_launched``).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import tempfile
import uuid
from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from storage.s3server import free_port
from training.failures import job_failure

_SERVER_ENV = dict(os.environ)  # the fork server's own environment, as a rank inherits it


def launch(fn: Callable[..., Any], nproc: int, *args: Any, max_restarts: int = 0) -> Any:
    """Run ``fn(*args)`` on ``nproc`` local processes; returns rank 0's result.

    A failure raises ``JobFailed``: its first line names the rank that failed first and its own error,
    not a peer's collective error (torch reports the rank whose process exited first). Where that error
    was a ``UserError``, a ``RankUserError`` (a UserError and a JobFailed) whose message is that one line."""
    multiprocessing.set_forkserver_preload(["training.rank_preload"])  # read when the server starts: the first launch
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        max_restarts=max_restarts,
        monitor_interval=0.5,
        start_method="forkserver",
    )
    try:
        return elastic_launch(config, _as_launched)(dict(os.environ), os.getcwd(), pickle.dumps((fn, args)))[0]
    except ChildFailedError as e:
        failed = job_failure(e)
        # The same report with the right rank first: nothing to chain, except under a rank's user error (the report).
        raise failed from failed.__cause__


def _as_launched(env: dict[str, str], cwd: str, call: bytes) -> Any:
    """``fn(*args)`` (pickled in ``call``) in this rank, with the launching process's environment and working
    folder, as a spawned rank would have them, plus what the launcher set for this rank (RANK, MASTER_PORT, ...)."""
    for_rank = {key: value for key, value in os.environ.items() if _SERVER_ENV.get(key) != value}
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(for_rank)
    os.chdir(cwd)
    tempfile.tempdir = None  # found again from TMPDIR, as it now is
    fn, args = pickle.loads(call)
    return fn(*args)
