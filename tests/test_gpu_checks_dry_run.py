"""`bash benchmarks/gpu_checks.sh --dry-run` (issue 31): every step of the GPU checks, in order, with
the GPU run's flags plus the ones that run it on CPU at tiny shapes, so that a lent GPU's minutes go
to measuring, not to fixing the script; and bench_kernels' refusal to time a kernel whose result
differs from the reference."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
# gpu_checks.sh's steps, in its order; kernel_tests is pytest's own output, the others end with a JSON line.
STEPS = ("kernel_tests", "bench_kernels", "bench_train_1b", "bench_train_350m", "train_smoke", "step_check")
JSON_STEPS = STEPS[1:]


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder``: (size, modification time), to see that nothing was written there."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def keys_of(value: Any) -> Iterator[str]:
    """Every key of every object nested in a JSON value."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from keys_of(item)
    elif isinstance(value, list):
        for item in value:
            yield from keys_of(item)


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


@pytest.mark.slow
@pytest.mark.long("all six GPU-check steps on CPU (two bench_train runs with FP8, three trainings): 93-160 s on 2 cores")
def test_gpu_checks_dry_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    results_before = listing(RESULTS)
    # The interpreter of this suite runs the steps; the outer pytest's worker settings and interpreter
    # mode stay out (the script sets TRITON_INTERPRET where a step needs it).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "TRITON_INTERPRET"}
    env["PYTHON"] = sys.executable
    command = ["bash", str(BENCHMARKS / "gpu_checks.sh"), "--dry-run", str(out)]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=480)
    steps_tsv = (out / "steps.tsv").read_text() if (out / "steps.tsv").exists() else "(no steps.tsv)\n"
    # Which step failed first (name, exit status, seconds), then the script's own tail.
    report = f"steps.tsv:\n{steps_tsv}{run.stdout[-5000:]}{run.stderr[-3000:]}"

    assert run.returncode == 0, report
    rows = [line.split("\t") for line in steps_tsv.splitlines()]
    assert [name for name, _, _ in rows] == list(STEPS), report
    assert {name: int(rc) for name, rc, _ in rows} == dict.fromkeys(STEPS, 0), report
    assert (out / "device.txt").read_text().startswith("cpu dry run")

    last = {}
    for name in JSON_STEPS:
        line = last_line((out / f"{name}.log").read_text())
        last[name] = json.loads(line)  # the log ends with the step's JSON object
        assert isinstance(last[name], dict), (name, line)
    # pytest's own output: one file run, every other kernel test collected (and deselected)
    kernel_tests = (out / "kernel_tests.log").read_text()
    assert re.search(r"^\d+ passed, \d+ deselected", kernel_tests, re.MULTILINE), kernel_tests

    kernels = last["bench_kernels"]
    assert kernels["dry_run_cpu"] and kernels["refused"] == []
    # Liger's stand-ins would be our own references: no figure may claim to compare with Liger (its
    # package version, "liger-kernel" in machine.versions, stays: the adapters were imported).
    liger = sorted({key for key in keys_of(kernels) if "_vs_liger" in key or key.startswith("liger_")})
    assert liger == [], liger
    assert kernels["ratios"] and all(key.endswith("_vs_torch_compile") for key in kernels["ratios"]), kernels["ratios"]
    assert all("triton_ms" in row and "check_vs_eager" in row for row in kernels["results"]), kernels["results"]
    for name in ("bench_train_350m", "bench_train_1b"):
        assert last[name]["device"] == "cpu" and last[name]["size"] == "tiny", last[name]
        # FP8 beside bf16, as on the GPU (on a CPU: the same casts and scaled GEMMs, figures that mean nothing)
        assert last[name]["ours_fp8"]["precision"] == "fp8 tensorwise" and "fp8_vs_bf16" in last[name]["ratios"], name
    profile = last["bench_train_1b"]["profile"]
    assert set(profile) == {"ours", "plain_compiled", "ours_fp8"}
    assert all(p["launches_per_step"] > 0 for p in profile.values()), profile
    # FP8's casts ran in the FP8 step, and only there
    assert "fp8_cast" in profile["ours_fp8"]["groups_ms"] and "fp8_cast" not in profile["ours"]["groups_ms"], profile
    assert last["bench_train_1b"]["loader"] == {"skipped": "--no-loader"}
    assert last["train_smoke"]["device"].startswith("cpu (dry run")
    # FP8 where no GPU has FP8 GEMMs: the launch refused it in one line naming the rank, before it started
    refused = last["train_smoke"]["fp8"]["refused"]
    assert refused.startswith("rank 0 failed first, while starting: ConfigError: train.precision is 'fp8' but rank 0 on ")
    assert "cannot run it: this machine has no CUDA GPU" in refused, refused
    assert last["step_check"]["device"] == "cpu" and "dry_run" in last["step_check"]

    # The collector: a results file marked as a dry run, in OUT only; nothing written to benchmarks/results.
    collected = [json.loads(p.read_text()) for p in out.glob("cpu-dry-run-*.json")]
    assert len(collected) == 1 and collected[0]["dry_run"], sorted(p.name for p in out.iterdir())
    headline = collected[0]["headline"]  # the figures a closing note quotes, per training shape
    assert set(headline) == {"bench_train_1b", "bench_train_350m"}, headline
    for shape in headline.values():
        assert set(shape["ratios"]) == {"ours_vs_plain_compiled", "fp8_vs_bf16"}, shape
        assert set(shape["variants"]) == {"ours", "ours_fp8", "plain_compiled"}, shape
    assert {name: step["exit"] for name, step in collected[0]["steps"].items()} == dict.fromkeys(STEPS, 0)
    assert listing(RESULTS) == results_before


@pytest.fixture(scope="module")
def bench_kernels() -> Iterator[ModuleType]:
    """benchmarks/bench_kernels.py as a module (a script, not a package; it imports machine_info beside it)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("bench_kernels_under_test", BENCHMARKS / "bench_kernels.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_a_wrong_kernel_is_refused_and_not_timed(bench_kernels: ModuleType) -> None:
    def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)

    def one_percent_off(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return reference(x, weight, eps) * 1.01

    def leaves() -> list[torch.Tensor]:
        torch.manual_seed(0)
        return [torch.randn(16, 32, requires_grad=True), torch.randn(32, requires_grad=True)]

    clock = bench_kernels.Clock("cpu")
    shape = {"tokens": 16, "hidden": 32}
    wrong = bench_kernels.Case("rmsnorm", shape, leaves(), (1e-5,), {"triton": one_percent_off, "eager": reference})
    row = bench_kernels.bench_case(wrong, iters=1, repeats=1, clock=clock)
    refusal = row["triton_refused"]
    assert "rmsnorm tokens=16 hidden=32 float32: triton" in refusal and "output 0" in refusal and "not timed" in refusal
    # No timing figure at all: not ours, and not the others' either (each figure is a ratio to ours).
    assert row["per_round_ms"] == {} and row["per_round_ratios"] == {}
    assert not [key for key in row if key.endswith(("_ms", "_ms_range", "_peak_mib")) and key != "per_round_ms"], row

    right = bench_kernels.Case("rmsnorm", shape, leaves(), (1e-5,), {"triton": reference, "eager": reference})
    row = bench_kernels.bench_case(right, iters=1, repeats=1, clock=clock)
    assert "triton_refused" not in row and row["check_vs_eager"]["triton"] == {"max": 0.0, "mean": 0.0}
    assert row["triton_ms"] > 0 and row["eager_ms"] > 0


def test_every_carried_wheel_is_pinned_by_the_lock() -> None:
    """What a GPU run carries (benchmarks/gpu_wheels.py) is downloaded at the lock's pins: a name the lock does not
    pin would fail on the day a device is lent, not here."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import gpu_wheels
    finally:
        sys.path.remove(str(BENCHMARKS))
    pins = gpu_wheels.pinned(gpu_wheels.IMAGE + gpu_wheels.CARRY)
    assert len(pins) == len(set(pins)) == len(gpu_wheels.IMAGE) + len(gpu_wheels.CARRY)
    assert "torchao==0.18.0" in pins and not set(gpu_wheels.IMAGE) & set(gpu_wheels.CARRY)
