"""Restarts inside the job: a rank that dies or hangs restarts the job's ranks where they run.

torch elastic's agent restarts the whole worker group up to ``max_restarts`` times (``train.max_restarts``;
``training.launch`` and the workflow's ``tasks.elastic`` both launch through it, from the fork server, so a
restart forks ranks that have torch and megatron-core loaded already). The new ranks find the run's newest
checkpoint (the store's newest committed one, its local copy where this node kept one, or a newer one this node
saved only: ``training.checkpointing.local_copy``) and go
on from there, as a rerun of the task would, without a new pod, a new ``pretrain run`` or its cached stages.

A restart helps a failure that a new attempt does not meet again: a rank killed (the OOM killer, a node's
fault, a soak's SIGKILL), a hang the watchdog ended, a store that was briefly away. It cannot help one that
every attempt meets: a bad batch, a code error, a user's error. ``RestartingAgent`` reads the failure the
ranks recorded (``training.observe.failures.record_failure``: the first failing rank, where it was, whether
its error is a ``UserError``) and does not restart

- a user's error (a full store, a bad loss that stops the run, a setting found on the rank): fix it first;
- a failure at the same place as the attempt before it (``step 57 (data)`` twice): it would repeat.

The job then fails with the failure's own line, as it would without restarts. A rank killed outright
records nothing: it is restarted while restarts are left.
"""

from __future__ import annotations

import sys

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from training.observe.failures import Failure, recorded_failure


def restart_refusal(failure: Failure | None, before: Failure | None) -> str:
    """Why a job whose attempt failed with ``failure`` (None: nothing recorded, e.g. a rank killed outright)
    must not restart, after an attempt that failed with ``before``; '' when a restart may help."""
    if failure is None:
        return ""
    if failure.user_error:
        return f"rank {failure.rank}'s error is one to fix before the run goes on"
    if before is not None and failure.where == before.where:
        return f"it failed during {failure.where} again: a restart would meet it a third time"
    return ""


class RestartingAgent(LocalElasticAgent):
    """torch's local agent, which restarts its ranks only where a restart may help (``restart_refusal``)
    and says in one line why it restarts or stops."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._last_failure: Failure | None = None

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result = super()._monitor_workers(worker_group)
        if result.is_failed() and self._remaining_restarts > 0:
            self._judge(result)
        return result

    def _judge(self, result: RunResult) -> None:
        failure = recorded_failure(ChildFailedError(self._worker_group.spec.get_entrypoint_name(), result.failures))
        refusal = restart_refusal(failure, self._last_failure)
        self._last_failure = failure
        killed = sorted(rank for rank, f in result.failures.items() if f.exitcode is not None and f.exitcode < 0)
        # A rank killed by a signal records nothing; its peers' collective errors name it as the one that did not arrive.
        what = failure.describe() if failure is not None else "a rank failed"
        if killed:
            what = f"rank {killed[0]} died ({_how(result, killed[0])})"
        if refusal:
            self._remaining_restarts = 0  # the agent stops the ranks and reports this attempt's failure
            print(f"not restarting the ranks: {what}; {refusal}", file=sys.stderr, flush=True)
            return
        done = self._worker_group.spec.max_restarts - self._remaining_restarts + 1
        print(
            f"restarting the ranks in place ({done} of {self._worker_group.spec.max_restarts}): {what}; "
            "they resume from the run's newest checkpoint (this node's own where it is newer than the store's)",
            file=sys.stderr,
            flush=True,
        )


def _how(result: RunResult, rank: int) -> str:
    signal = result.failures[rank].signal_name()
    return f"signal {signal}" if signal and signal != "<N/A>" else f"exit status {result.failures[rank].exitcode}"
