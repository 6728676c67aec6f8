"""The layers hold: libraries import without Flyte, the slim-image tasks and the CLI without torch,
and ``common`` without anything of ours or anything heavy.

Each case runs in a fresh interpreter whose import system refuses the blocked packages, then
imports every module of the packages under test (so a lazy import at module level cannot hide).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = ["common", "data_prep", "training", "evaluation", "kernels", "storage", "registry", "tracking"]

PROBE = """
import importlib, importlib.abc, pkgutil, sys
blocked = set(sys.argv[1].split(","))
present = set(sys.modules)  # namespace packages that .pth files register at start-up

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"{name} is blocked in this layer")  # as if not installed
        return None

sys.meta_path.insert(0, Refuse())
for target in sys.argv[2].split(","):
    module = importlib.import_module(target)
    if hasattr(module, "__path__"):
        for info in pkgutil.walk_packages(module.__path__, prefix=target + "."):
            importlib.import_module(info.name)
leaked = sorted(m for m in set(sys.modules) - present if m.partition(".")[0] in blocked)
assert not leaked, leaked
print("ok")
"""


def imports_without(blocked: list[str], targets: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(blocked), ",".join(targets)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    ("blocked", "targets"),
    [
        (["flytekit", "flytekitplugins"], LIBRARIES),  # libraries know nothing of Flyte
        (["torch", "megatron", "triton"], ["tasks.data", "tasks.register"]),  # the slim data image has no torch
        (["torch", "megatron", "triton", "flytekit"], ["cli.main", "pipeline.config"]),  # the CLI starts fast
        # The run bookkeeping and the staging names: `pretrain runs` and `pretrain gc` read them without torch.
        (
            ["torch", "megatron", "triton"],
            ["training.runs", "training.callbacks", "training.checkpointing.staging", "cli.retention"],
        ),
        (["torch", "flytekit", "tokenizers", "webdataset", "great_expectations", "boto3", "numpy", "pandas", "yaml"], ["common"]),
    ],
    ids=[
        "libraries-without-flyte",
        "data-tasks-without-torch",
        "cli-without-torch",
        "run-bookkeeping-without-torch",
        "common-is-a-leaf",
    ],
)
@pytest.mark.slow
def test_layer_imports_without(blocked: list[str], targets: list[str]) -> None:
    result = imports_without(blocked, targets)
    assert result.returncode == 0, result.stderr[-3000:]


def test_common_imports_nothing_of_ours() -> None:
    """``common`` is the leaf every layer shares: no arrow may point from it back up."""
    ours = {
        "data_prep",
        "training",
        "evaluation",
        "kernels",
        "storage",
        "registry",
        "tracking",
        "pipeline",
        "tasks",
        "workflows",
        "cli",
    }
    result = imports_without(sorted(ours), ["common"])
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_probe_can_fail() -> None:
    """The blocker really blocks: importing a task module with flytekit refused fails."""
    result = imports_without(["flytekit"], ["tasks.data"])
    assert result.returncode != 0 and "flytekit is blocked" in result.stderr
