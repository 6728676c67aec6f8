"""What the benchmarks record about the machine they ran on, how they summarize repeats, and the
check that stands behind a reported value."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Iterable, Sequence
from importlib.metadata import PackageNotFoundError, version


class BenchmarkCheckError(RuntimeError):
    """A benchmark's result is wrong: nothing of it is timed or reported."""


def require(condition: object, message: str) -> None:
    """Raise ``BenchmarkCheckError(message)`` unless ``condition``: what a benchmark checks before it
    times or reports a value. Not ``assert``, which ``python -O`` strips."""
    if not condition:
        raise BenchmarkCheckError(message)


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(packages: Iterable[str] = (), **extra: object) -> dict:
    """The benchmark's machine: CPU model, logical cores, cores this process may use, torch's
    threads, the accelerator, and the versions of ``packages`` (those not installed: ``None``)."""
    record: dict[str, object] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
    }
    try:
        import torch

        record["torch_threads"] = torch.get_num_threads()
        record["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    except ImportError:
        pass
    versions: dict[str, str | None] = {}
    for name in packages:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    record["versions"] = versions
    return record | extra


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def ratio_keys(ratios: dict[str, Sequence[float]]) -> dict[str, dict]:
    """``{"ratios": {name: median}, "spread": {name: [min, max]}}`` of per-repeat ratios."""
    return {
        "ratios": {name: statistics.median(values) for name, values in ratios.items()},
        "spread": {name: [min(values), max(values)] for name, values in ratios.items()},
    }
