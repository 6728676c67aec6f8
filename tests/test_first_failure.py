"""Which rank failed first (issue 18, item 4): when one rank raises, the job's error names that rank
and its own error, not a peer's "collective failed" / "Connection closed by peer".

The peer's error often reaches the launcher first: blocked in a collective, it fails as soon as the
failing rank's connections close, and exits before that rank does; torch.distributed.elastic
reports the process that exited first (with spawn, only that one). The two-rank runs are real:
``training.launch.launch`` and Flyte's local execution of an ``Elastic`` task (the plugin's own
launch), gloo, a local store; rank 1 raises ``ValueError("boom at step 3")`` as it fetches step 3's
batch (``tests.helpers.train_with_error``).
"""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from cli.main import headline
from common.net import free_port
from tasks.elastic import FirstFailureElastic, FirstFailureElasticTask
from tasks.train import train_model
from tests.helpers import elastic_task, elastic_train_with_error, fresh_copy, tiny_model, train_with_error
from training.config import ParallelConfig, TrainConfig
from training.launch import launch
from training.observe.failures import FILE_NAME, Failure, JobFailed, is_collective_failure, job_failure, record_failure

FAIL_STEP, FAIL_RANK = 3, 1
HEADLINE = f"rank {FAIL_RANK} failed first, during step {FAIL_STEP} (data): ValueError: boom at step {FAIL_STEP}"
STEPS = 4
DP2 = ParallelConfig(tensor_parallel=1, collective_timeout_s=300)  # a loaded machine: not a test of timeouts
RUN = TrainConfig(steps=STEPS, micro_batch_size=4, global_batch_size=8, warmup_steps=1, checkpoint_every=STEPS, seed=18)
PEER_WORDS = ("Connection closed by peer", "a collective with the other ranks failed")


# -- the record: first writer wins, through a real c10d store ---------------------------------------


def test_the_first_recorded_failure_wins_in_the_store_and_in_the_nodes_file(tmp_path, monkeypatch):
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    attempt = tmp_path / "attempt_0"
    errors = {}
    for rank in (1, 0):  # rank 1 fails first, rank 0 after it (its own error, not a collective's)
        (attempt / str(rank)).mkdir(parents=True)
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(attempt / str(rank) / "error.json"))
        try:
            raise (ValueError("boom at step 3") if rank == 1 else KeyError("later"))
        except Exception as e:  # noqa: BLE001 - what a rank's handler sees
            errors[rank] = record_failure(e, rank, "step 3 (data)")
    assert errors[0] == errors[1]  # each rank learns the job's first failure
    first = errors[1]
    assert (first.rank, first.where, first.error) == (1, "step 3 (data)", "ValueError: boom at step 3")
    assert first.error_file == str(attempt / "1" / "error.json") and "raise (ValueError" in first.traceback
    assert first.describe() == "rank 1 failed first, during step 3 (data): ValueError: boom at step 3"
    assert Failure.from_json(server.get("pretrain/first_failure/0")) == first
    assert Failure.from_json((attempt / FILE_NAME).read_text()) == first
    assert sorted(p.name for p in attempt.iterdir()) == ["0", "1", FILE_NAME]  # no temporary file left


def test_a_collective_failure_is_told_from_a_ranks_own_error():
    assert is_collective_failure("PeerFailure: rank 0: a collective with the other ranks failed during step 3")
    assert is_collective_failure("RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1")
    assert is_collective_failure("DistBackendError: NCCL error in: ../ProcessGroupNCCL.cpp:1970, unhandled system error")
    assert not is_collective_failure("ValueError: boom at step 3")
    assert not is_collective_failure("RuntimeError: CUDA out of memory")


def reported(tmp_path: Path, rank: int, message: str, timestamp: int) -> ProcessFailure:
    """A failure as the launcher reads it: from the rank's error file (torch's format)."""
    path = tmp_path / "attempt_0" / str(rank) / "error.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    info = {"py_callstack": f"Traceback ...\n{message}\n", "timestamp": str(timestamp)}
    path.write_text(json.dumps({"message": {"message": message, "extraInfo": info}}))
    return ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=1, error_file=str(path))


def test_without_a_record_the_launcher_blames_an_own_error_before_an_earlier_collective_failure(tmp_path):
    now = int(time.time())
    peer = reported(tmp_path, 0, "PeerFailure: rank 0: a collective with the other ranks failed during step 3", now - 1)
    own = reported(tmp_path, 1, "ValueError: boom at step 3", now)
    error = job_failure(ChildFailedError("train", {0: peer, 1: own}))
    assert error.first is None and error.get_first_failure() == (1, own)
    assert str(error).startswith(f"rank 1 failed first: ValueError: boom at step 3 (its traceback: {own.error_file}).\n")
    # torch's own choice: the earliest whole-second timestamp, the peer.
    assert ChildFailedError("train", {0: peer, 1: own}).get_first_failure()[0] == 0


# -- real two-rank runs ----------------------------------------------------------------------------


def assert_names_the_first_failure(error: JobFailed) -> None:
    """The error's first line names rank 1 and its own error; no peer's error is presented as the cause."""
    text = str(error)
    headline = text.splitlines()[0]
    print("what the user sees first:", headline)
    assert headline.startswith(HEADLINE + " (its traceback: "), headline
    assert not any(word in headline for word in PEER_WORDS), headline
    assert error.first is not None and error.first.rank == FAIL_RANK
    assert error.first.error_file.endswith(f"/{FAIL_RANK}/error.json") and error.first.error_file in headline
    assert 'raise ValueError(f"boom at step {fail_step}")' in text  # rank 1's traceback, from its record
    # Whichever processes torch reported: rank 1 with its own error, or a peer whose error names rank 1.
    for rank, failure in error.failures.items():
        message = failure.message["message"]
        print(f"reported: rank {rank}: {message[:160]}")
        if rank == FAIL_RANK:
            assert message == f"ValueError: boom at step {FAIL_STEP}"
        else:
            assert message.startswith(f"PeerFailure: {HEADLINE} (its traceback: "), message
            assert re.search(rf"rank {rank}'s collective during step {FAIL_STEP} \(\w+\) failed because of it", message)
        assert failure.timestamp >= int(error.first.time)  # the record is the earliest
    assert error.get_first_failure()[0] == (FAIL_RANK if FAIL_RANK in error.failures else min(error.failures))


@pytest.mark.slow
def test_launch_names_the_rank_that_failed_first(tiny_dataset, tmp_path):
    dataset = fresh_copy(tiny_dataset, tmp_path / "store")
    with pytest.raises(JobFailed) as caught:
        launch(train_with_error, 2, FAIL_STEP, FAIL_RANK, dataset, tiny_model(), DP2, RUN)
    assert_names_the_first_failure(caught.value)


def job_failed_in(error: BaseException) -> JobFailed | None:
    """The JobFailed along a Flyte error's wrappers (``value``), causes and contexts."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, JobFailed):
            return error
        error = getattr(error, "value", None) or error.__cause__ or error.__context__
    return None


@pytest.mark.slow
def test_a_flyte_elastic_task_names_the_rank_that_failed_first(tiny_dataset, tmp_path):
    # The training task runs under the same task class as this one.
    assert type(train_model.task_config) is FirstFailureElastic and isinstance(train_model, FirstFailureElasticTask)
    task = elastic_task(elastic_train_with_error, FirstFailureElastic(nproc_per_node=2))
    dataset = fresh_copy(tiny_dataset, tmp_path / "store")
    with pytest.raises(Exception) as caught:  # noqa: PT011 - whatever Flyte wraps it in: its message is checked
        task(dataset=dataset, fail_step=FAIL_STEP, fail_rank=FAIL_RANK, steps=STEPS)
    message = str(caught.value)
    print("Flyte's error:", message[:600])
    # Flyte's local execution prefixes its own lines; the task's error starts with the headline.
    assert re.search(rf"error={re.escape(HEADLINE)} \(its traceback: ", message), message[:2000]
    first = job_failed_in(caught.value)
    assert first is not None, repr(caught.value)
    assert_names_the_first_failure(first)
    # Not a user error: `pretrain run` prints this one line (Flyte's codes and preambles, torch's report and
    # the tracebacks left to its traceback log), and exits 1.
    shown = headline(caught.value)
    print("pretrain run would print: error:", shown)
    assert shown.startswith(f"elastic_train_with_error: {HEADLINE} (its traceback: ") and "\n" not in shown, shown
    assert not any(word in shown for word in PEER_WORDS) and "USER:" not in shown and "Traceback" not in shown
