"""The kernels package as a library: importable without a GPU, interpreter or Flyte; the
benchmark's no-CUDA path."""

import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _run(code_or_args: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled mode, as in production
    return subprocess.run([sys.executable, *code_or_args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_imports_without_gpu_interpreter_or_flyte() -> None:
    code = """
import sys
import kernels.fused_linear_ce, kernels.rmsnorm, kernels.rotary, kernels.swiglu
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction
assert isinstance(kernels.rmsnorm._rmsnorm_fwd_kernel, JITFunction)
assert not isinstance(kernels.rmsnorm._rmsnorm_fwd_kernel, InterpretedFunction)
assert not [m for m in sys.modules if m.split(".")[0] in ("flytekit", "flyteidl", "megatron")], "kernels imports Flyte/megatron"
print("ok")
"""
    result = _run(["-c", code])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    for source in (ROOT / "kernels").glob("*.py"):
        assert not re.search(r"^\s*(import|from)\s+flyte", source.read_text(), re.MULTILINE), f"{source.name} imports Flyte"


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the benchmark runs for real (minutes)")
def test_benchmark_without_cuda() -> None:
    result = _run([str(ROOT / "benchmarks" / "bench_kernels.py")])
    assert result.returncode == 0, result.stderr
    last = json.loads(result.stdout.strip().splitlines()[-1])
    # What was skipped and why, and on which machine (every benchmark records it).
    assert {k: last[k] for k in ("cuda", "skipped")} == {"cuda": False, "skipped": "no CUDA device"}
    assert last["machine"]["device"] == "cpu", last["machine"]
    # machine() lists every package it is asked for, None for one not installed: the version itself counts.
    recorded = last["machine"]["versions"].get("liger-kernel")
    assert recorded is not None and recorded == version("liger-kernel"), last["machine"]["versions"]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter fallback is for machines without CUDA")
def test_interpreter_after_an_earlier_compiled_mode_import() -> None:
    """Another module (say the model) imported triton and the kernels before a kernel test set
    TRITON_INTERPRET=1: load_kernels re-imports them, and they still run on the CPU."""
    code = """
import os
import torch
import triton.language
import kernels.swiglu
from kernels.swiglu import swiglu  # a reference bound before the reload
os.environ["TRITON_INTERPRET"] = "1"
from tests.helpers import load_kernels
K = load_kernels("swiglu")
x = torch.randn(3, 10, dtype=torch.float64, requires_grad=True)
assert torch.autograd.gradcheck(swiglu, (x,))
assert torch.allclose(K.swiglu(x), K.swiglu_reference(x))
print("ok")
"""
    result = _run(["-c", code])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
