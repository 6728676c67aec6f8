"""The slim data image has no torch: the modules its tasks load must not need it."""

import subprocess
import sys

import pytest

BLOCK_TORCH = """
import importlib.abc, sys
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch" or name.startswith(("torch.", "megatron", "triton")):
            raise ModuleNotFoundError(f"No module named {name!r} (not in the data image)", name=name)
sys.meta_path.insert(0, NoTorch())
import tasks.data, tasks.register
print("ok")
"""


@pytest.mark.slow
def test_data_and_register_tasks_import_without_torch():
    result = subprocess.run([sys.executable, "-c", BLOCK_TORCH], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-2000:]
