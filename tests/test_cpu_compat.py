"""training.cpu_compat's forked results-queue manager (megatron's checkpoint writes report through it
on a machine without CUDA) lives and dies with the rank that forked it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil

from tests.helpers import ROOT

RANK = """
from training import cpu_compat
import tempfile
print(len(tempfile.gettempdir()), flush=True)
cpu_compat._forked_results_queue().put("a write result")
print("ready", flush=True)
import time
time.sleep(600)
"""


def test_a_killed_ranks_results_manager_ends_with_it_and_closes_its_output(tmp_path):
    # A temporary folder whose socket paths would pass the 107 bytes a Unix socket's path may have (a
    # test's TMPDIR under pytest's numbered folders did): the manager must start all the same.
    deep = tmp_path / ("t" * (120 - len(str(tmp_path))))
    deep.mkdir()
    env = {**os.environ, "TMPDIR": str(deep)}
    rank = subprocess.Popen(
        [sys.executable, "-c", RANK], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    managers: list[psutil.Process] = []
    try:
        assert int(rank.stdout.readline()) >= 120
        assert rank.stdout.readline().strip() == "ready", rank.stderr.read()
        managers = psutil.Process(rank.pid).children()
        assert len(managers) == 1, managers
        # As a rank the launcher kills when its peer failed first: no exit handler runs in it.
        os.kill(rank.pid, signal.SIGKILL)
        # The manager inherited the rank's standard output and error: they end only once it is gone
        # (a `pretrain run` read through a pipe waited 900 s for them).
        out, err = rank.communicate(timeout=30)
        assert rank.returncode == -signal.SIGKILL and out == "", (out, err)
        _, alive = psutil.wait_procs(managers, timeout=10)
        assert not alive, f"the manager {alive} outlived its rank"
    finally:
        rank.kill()
        rank.wait()
        for manager in managers:
            if manager.is_running():
                manager.kill()
