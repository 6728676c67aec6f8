"""Failures during real training: the S3 server dies mid-upload, a rank dies, a rank hangs."""

from __future__ import annotations

import dataclasses
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from storage import open_store
from storage.s3server import S3Server
from tests.helpers import ROOT, fresh_copy, kill_group, rank_processes, start_training, tiny_model
from training.checkpointing import checkpoint
from training.config import ModelConfig, ParallelConfig, TrainConfig
from training.launch import launch
from training.train import run_id, train

# Wide enough that a checkpoint (weights + moments, ~80 MB) takes a while to upload.
WIDE = ModelConfig(num_layers=2, hidden_size=512, num_attention_heads=8)
SAVE_EVERY_STEP = TrainConfig(steps=3, micro_batch_size=4, global_batch_size=4, warmup_steps=1, checkpoint_every=1, seed=99)


def s3_copy(dataset, store):
    """The dataset, committed, in ``store``."""
    store.upload_dir(Path(dataset.store) / dataset.prefix, dataset.prefix)  # with its commit marker
    return dataclasses.replace(dataset, store=store.uri)


@pytest.mark.slow
@pytest.mark.long("a training killed by its S3 server's death mid-upload, then resumed: 80-85 s under make test")
def test_s3_server_stopped_mid_upload_leaves_no_checkpoint_to_resume(tiny_dataset, tmp_path, monkeypatch):
    server = S3Server(data_dir=tmp_path / "s3", bucket="ckpt").start()
    job = None
    try:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        store = open_store(f"s3://ckpt/{tmp_path.name}")
        dataset = s3_copy(tiny_dataset, store)
        run = f"runs/{run_id(dataset, WIDE, SAVE_EVERY_STEP)}"
        second = checkpoint.checkpoint_prefix(run, 2)
        job = start_training(tmp_path, 1, dataset, WIDE, ParallelConfig(tensor_parallel=1), SAVE_EVERY_STEP)
        deadline = time.monotonic() + 240
        while not store.list(second) and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.list(second), (tmp_path / "train.log").read_text()[-3000:]
        server.process.send_signal(signal.SIGKILL)  # the store dies while step 2 is being uploaded
        server.process.wait()
        assert job.wait(timeout=120) != 0
        log = (tmp_path / "train.log").read_text()
        assert "cannot reach S3 endpoint" in log, log[-3000:]
    finally:
        if job is not None:
            kill_group(job)
        server.stop()

    restarted = server.start()  # the same data, port and credentials
    try:
        store = open_store(dataset.store)
        partial = store.list(second)
        assert partial and not store.is_committed(second), partial  # some files, no commit marker
        print(f"left by the interrupted upload: {[k.removeprefix(second) for k in partial]}")
        assert checkpoint.committed_steps(store, run) == [1]
        resumed = launch(train, 1, dataset, WIDE, ParallelConfig(tensor_parallel=1), SAVE_EVERY_STEP)
        assert checkpoint.committed_steps(store, run) == [2, 3] and resumed.step == 3
        # The step-2 folder was rewritten whole before its commit: the same files as any other save.
        names = {
            step: [
                k.removeprefix(checkpoint.checkpoint_prefix(run, step))
                for k in store.list(checkpoint.checkpoint_prefix(run, step))
            ]
            for step in (2, 3)
        }
        assert names[2] == names[3] and store.get_json(f"{second}/meta.json")["step"] == 2
    finally:
        restarted.stop()


# -- dead and stuck ranks ---------------------------------------------------------
LONG = TrainConfig(
    steps=100_000, micro_batch_size=4, global_batch_size=8, warmup_steps=2, checkpoint_every=100_000, seed=77, log_every=1
)
MODEL = tiny_model()
TIMEOUT_S = 20


def a_rank_process(job: subprocess.Popen) -> psutil.Process:
    """One of the launcher's ranks (a rank sets RANK only once it runs, so which one is unknown)."""
    workers = rank_processes(job.pid)
    assert len(workers) == 2, workers
    return max(workers, key=lambda p: p.create_time())


def wait_for_steps(job: subprocess.Popen, log: Path, steps: int = 3, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while f"step {steps:>5}/" not in log.read_text(errors="replace"):
        assert job.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.long("a stopped rank is found after a 20 s collective timeout: 66 s under make test")
@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_dead_or_stuck_rank_fails_the_job_with_a_clear_error(tiny_dataset, tmp_path, how):
    dataset = fresh_copy(tiny_dataset, tmp_path / "store")
    parallel = ParallelConfig(tensor_parallel=1, collective_timeout_s=TIMEOUT_S)
    job = start_training(tmp_path, 2, dataset, MODEL, parallel, LONG)
    log = tmp_path / "train.log"
    try:
        wait_for_steps(job, log)
        victim = a_rank_process(job)
        t0 = time.monotonic()
        victim.send_signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        code = job.wait(timeout=150)
        elapsed = time.monotonic() - t0
    finally:
        kill_group(job)
    text = log.read_text(errors="replace")
    print(f"{how}: job exited {code} {elapsed:.1f} s after a rank was {how}")
    assert code != 0 and elapsed < 120, text[-3000:]
    if how == "stopped":
        # The other rank waited one collective timeout, then said why it failed.
        assert re.search(r"\[rank \d\] rank \d: a collective with the other ranks failed during step \d+", text), text[-3000:]
        assert f"parallel.collective_timeout_s={TIMEOUT_S}" in text
    else:
        # The launcher names the dead rank and its signal (the survivor usually says why it failed, too).
        assert re.search(r"exitcode\s*:\s*-9 \(pid: \d+\)\s*\(SIGKILL\)", text), text[-3000:]


@pytest.mark.slow
def test_watchdog_ends_a_rank_stuck_outside_collectives(tmp_path):
    code = (
        "import time\n"
        "from training.observe.watchdog import Progress, Watchdog\n"
        "p = Progress(); Watchdog(p, rank=3, poll_s=0.1).start()\n"
        "p.enter('step 7', 1.0)\n"
        "time.sleep(60)\n"
    )
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 86 and time.monotonic() - t0 < 30
    assert "[rank 3] watchdog: step 7 has made no progress for 1 s (limit 1 s): this rank is stuck" in done.stderr
    assert "time.sleep" in done.stderr or "line 5" in done.stderr  # the stuck thread's stack
