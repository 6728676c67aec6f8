"""Run a function on N local ranks, as torchrun would: for tests, benchmarks and the CLI.

Flyte's ``Elastic`` plays this part inside the workflow; both go through
``torch.distributed.elastic``, so the library code cannot tell them apart. A failed job raises a
``training.failures.JobFailed`` (a ``ChildFailedError``) that names the rank that failed first; a
``RankUserError`` (also a ``UserError``) where that rank's error was one the user can fix.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from storage.s3server import free_port
from training.failures import job_failure


def launch(fn: Callable[..., Any], nproc: int, *args: Any, max_restarts: int = 0) -> Any:
    """Run ``fn(*args)`` on ``nproc`` local processes (spawn); returns rank 0's result.

    A failure raises ``JobFailed``: its first line names the rank that failed first and its own error,
    not a peer's collective error (torch reports the rank whose process exited first). Where that error
    was a ``UserError``, a ``RankUserError`` (a UserError and a JobFailed) whose message is that one line."""
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        max_restarts=max_restarts,
        monitor_interval=0.5,
        start_method="spawn",
    )
    try:
        return elastic_launch(config, fn)(*args)[0]
    except ChildFailedError as e:
        failed = job_failure(e)
        # The same report with the right rank first: nothing to chain, except under a rank's user error (the report).
        raise failed from failed.__cause__
