"""Issue 51: the warnings megatron-core and torch print on every run, that nobody can act on, are filtered where
they start (``training.known_warnings``), the same in every process; any other warning still shows."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

PROBE = """
import warnings
import training.model.gpt  # imports megatron-core: Apex and Transformer Engine are absent here
import megatron.core.optimizer
from megatron.core.transformer.transformer_config import TransformerConfig

TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)  # its own deprecated default, on a GPU build
for category, module, message in [
    (FutureWarning, "megatron.core.dist_checkpointing.strategies.torch", "`load_state_dict` is deprecated and will be removed"),
    (FutureWarning, "torch.distributed.checkpoint.default_planner", "Please use DTensor instead and we are deprecating "
     "ShardedTensor."),
    (UserWarning, "megatron.core.tensor_parallel.layers", "When using async grad allreduce it is recommended to set the "
     "environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1 for maximum speedup"),  # every rank, every step 1
    (UserWarning, "megatron.core.models.backends", "something new the filters do not know"),
]:
    warnings.warn_explicit(message, category, "x.py", 1, module=module)
"""


@pytest.mark.slow
def test_megatron_and_torch_known_warnings_are_filtered_at_their_source_and_others_still_show():
    # A plain interpreter's filters, as `pretrain run` has them (not pytest's, which ignore every UserWarning).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    warned = [line for line in done.stderr.splitlines() if "Warning: " in line]
    assert warned == ["x.py:1: UserWarning: something new the filters do not know"], done.stderr[-3000:]
