"""common.collector: the processes that load torch, flytekit and the rest collect less often, and a rank never
traverses what its fork server loaded."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest

from common.collector import THRESHOLDS
from tests.helpers import ROOT
from training.launch import launch

PROBE = "import atexit, gc, json\natexit.register(lambda: print(json.dumps(gc.get_threshold())))\n"


def thresholds_after(code: str) -> tuple[int, ...]:
    """``gc.get_threshold()`` at the exit of a fresh interpreter that ran ``code``."""
    out = subprocess.run([sys.executable, "-c", PROBE + code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_cli_and_every_task_process_collect_less_often():
    assert thresholds_after("pass") != THRESHOLDS  # the interpreter's own, for the comparison
    assert thresholds_after("from cli.main import main\nmain(['runs', '--help'])") == THRESHOLDS
    assert thresholds_after("import tasks") == THRESHOLDS


def collector_state() -> tuple[tuple[int, ...], int]:
    return gc.get_threshold(), gc.get_freeze_count()


@pytest.mark.slow
def test_a_rank_inherits_the_thresholds_and_never_collects_what_its_fork_server_loaded():
    thresholds, frozen = launch(collector_state, 2)
    assert tuple(thresholds) == THRESHOLDS
    assert frozen > 200_000  # torch, torch._dynamo and megatron-core: about 340,000 objects (0 unfrozen)
