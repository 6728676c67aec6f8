"""A failing rank's user error reaches the caller, and ``pretrain run``, as one line (issue 18, items 4
and 6): "rank N failed first, during <where>: <ExcType>: <message>", a ``UserError`` (exit status 2), not
torch's multi-KB report of every rank; that report stays in the traceback log. A failure that is not
the user's to fix prints its first line and the log's path; a rank its watchdog ended points at the
job's log, not at an error file that is never written.

Real parts throughout: the ranks' own records (``training.observe.failures``), a real watchdog exiting, Flyte's
local execution of the ``Elastic`` task with two gloo ranks. ``pretrain run`` into a real tmpfs that fills
up during a checkpoint save is in tests/test_store_full.py.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flytekit import task, workflow
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from cli.main import _without_flyte_prefix, headline
from common.errors import UserError, user_error_in, write_traceback
from data_prep.errors import DataError
from tasks.elastic import FirstFailureElastic
from tests.helpers import (
    RANK_DATA_PROBLEM,
    ROOT,
    elastic_task,
    elastic_train_with_data_problem,
    fresh_copy,
)
from training.observe.failures import FILE_NAME, Failure, JobFailed, RankUserError, job_failure, record_failure
from training.observe.watchdog import EXIT_STUCK

FAIL_STEP, FAIL_RANK = 3, 1
PROBLEM = RANK_DATA_PROBLEM.format(step=FAIL_STEP)
HEADLINE = f"rank {FAIL_RANK} failed first, during step {FAIL_STEP} (data): DataError: {PROBLEM}"


# -- the record and the launcher's side, from the files a launcher reads -------------------------


def failed_job(attempt: Path, errors: dict[int, BaseException]) -> ChildFailedError:
    """Each rank of ``errors`` records its failure in the launcher's ``attempt`` folder (rank order = time
    order), and the launcher reports them as torch does (error files it reads)."""
    failures = {}
    for rank, error in errors.items():
        error_file = attempt / str(rank) / "error.json"
        error_file.parent.mkdir(parents=True)
        os.environ["TORCHELASTIC_ERROR_FILE"] = str(error_file)
        try:
            raise error
        except Exception as e:  # noqa: BLE001 - what the rank's handler sees
            record_failure(e, rank, "step 3 (data)")
        message = f"{type(error).__name__}: {error}"
        info = {"py_callstack": f"Traceback ...\n{message}\n", "timestamp": str(int(time.time()))}
        error_file.write_text(json.dumps({"message": {"message": message, "extraInfo": info}}))
        failures[rank] = ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=1, error_file=str(error_file))
    return ChildFailedError("train", failures)


def test_a_ranks_user_error_becomes_the_jobs_one_line_user_error(tmp_path, monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)  # no job store: the node's file is the record
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", "")
    peer = RuntimeError("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1")
    error = job_failure(failed_job(tmp_path / "attempt_0", {1: DataError(PROBLEM), 0: peer}))

    assert isinstance(error, RankUserError) and isinstance(error, UserError)
    assert isinstance(error, JobFailed) and isinstance(error, ChildFailedError)  # `except ChildFailedError` still works
    assert str(error) == HEADLINE  # one line: the rank's own error, no report
    assert error.get_first_failure()[0] == FAIL_RANK and error.first.user_error
    report = error.__cause__
    assert isinstance(report, JobFailed) and not isinstance(report, UserError)
    assert str(report).startswith(f"{HEADLINE} (its traceback: ") and "raise error" in str(report)  # the whole report
    assert user_error_in(error) is error

    # Not a user error on the rank that failed first: a JobFailed, as before.
    other = job_failure(failed_job(tmp_path / "attempt_1", {1: ValueError("boom"), 0: DataError(PROBLEM)}))
    assert type(other) is JobFailed and not other.first.user_error and other.__cause__ is None
    assert user_error_in(other) is None


_STUCK_RANK = """
import time
from training.observe.watchdog import Progress, Watchdog
progress = Progress()  # a job of one rank: nobody to wait for, this rank is the stuck one
progress.enter("step 3", 0.5)
progress.at(3, "data")
Watchdog(progress, 0, poll_s=0.1).start()
time.sleep(120)
"""


@pytest.mark.slow
def test_a_rank_its_watchdog_ended_points_at_the_jobs_log_not_an_error_file(tmp_path):
    error_file = tmp_path / "attempt_0" / "0" / "error.json"
    error_file.parent.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env["TORCHELASTIC_ERROR_FILE"] = str(error_file)
    stuck = subprocess.run([sys.executable, "-c", _STUCK_RANK], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    assert stuck.returncode == EXIT_STUCK, stuck.stderr[-2000:]
    # torch writes no error file for a process that os._exits: the record wrote one, with its message only.
    message = json.loads(error_file.read_text())["message"]["message"]
    assert message.startswith("TimeoutError: made no progress for "), message
    record = Failure.from_json((error_file.parent.parent / FILE_NAME).read_text())
    assert (record.rank, record.error_file, record.log_mark) == (0, "", "watchdog:")
    assert "[rank 0] watchdog: step 3 (data) has made no progress" in stuck.stderr  # where the record points
    failed = job_failure(ChildFailedError("train", {0: ProcessFailure(0, 4242, EXIT_STUCK, str(error_file))}))
    host = re.escape(socket.gethostname())
    expected = (
        r"rank 0 failed first, during step 3 \(data\): TimeoutError: made no progress for \d+ s \(limit 0.5 s\); "
        rf"the watchdog ended it \(its traceback: the job's log after '\[rank 0\] watchdog:' \(rank 0 ran on {host}\)\)\."
    )
    assert re.fullmatch(expected, failed.headline()), failed.headline()
    assert str(error_file) not in failed.headline()  # it holds no traceback, and no stacks


# -- through Flyte's local execution of the Elastic task: two real ranks ---------------------------


@pytest.mark.slow
def test_a_ranks_user_error_leaves_a_flyte_elastic_task_as_one_user_error_line(tiny_dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("PRETRAIN_LOG_DIR", str(tmp_path / "logs"))
    elastic = elastic_task(elastic_train_with_data_problem, FirstFailureElastic(nproc_per_node=2))
    dataset = fresh_copy(tiny_dataset, tmp_path / "store")
    with pytest.raises(Exception) as caught:  # noqa: PT011 - whatever Flyte wraps it in: the user error is checked
        elastic(dataset=dataset, fail_step=FAIL_STEP, fail_rank=FAIL_RANK, steps=4)

    user = user_error_in(caught.value)
    assert isinstance(user, RankUserError), repr(caught.value)[:2000]
    message = _without_flyte_prefix(str(user))  # what `pretrain run` prints after "error: "
    print("the user sees:", message)
    assert message == f"elastic_train_with_data_problem: {HEADLINE}"
    assert user.first.rank == FAIL_RANK and user.first.user_error and user.failures  # still torch's report of each rank
    # The traceback log holds the whole report: rank 1's own traceback, and torch's report of each rank.
    log = write_traceback(caught.value, "test").read_text()
    assert "in batch_or_problem" in log and "raise DataError(RANK_DATA_PROBLEM.format(step=fail_step))" in log
    assert "Root Cause (first observed failure)" in log


# -- what `pretrain run` prints of a failure that is not the user's ----------------------------------


@task
def fails_with_a_report(x: int) -> int:
    if x:
        raise RuntimeError("the pipeline broke here\n  and torch's report of every rank follows\n  over many lines")
    return x


@workflow
def broken(x: int) -> int:
    return fails_with_a_report(x=x)


def test_a_failure_that_is_not_the_users_is_its_first_line_and_the_log_holds_the_rest(tmp_path, monkeypatch):
    monkeypatch.setenv("PRETRAIN_LOG_DIR", str(tmp_path / "logs"))
    with pytest.raises(Exception) as caught:  # noqa: PT011 - as Flyte's local execution raises it
        broken(x=1)
    assert headline(caught.value) == "fails_with_a_report: RuntimeError: the pipeline broke here"
    assert "over many lines" in write_traceback(caught.value, "run").read_text()
