"""The wheels a GPU run carries (``.whl/``, installed by ``gpu_checks.sh``): what its steps import beyond a
bare CUDA torch image, each at its ``requirements.lock`` pin.

The GPU machine reaches no network; it holds a CUDA torch, triton and torch's own requirements (``IMAGE``),
and a run carries up to 64 MiB of ignored paths with the working tree. ``CARRY`` is what every step of
``gpu_checks.sh`` needs beyond ``IMAGE``, found by running the dry run in a virtual environment that holds
``IMAGE`` and ``CARRY`` only (``--simulate``; 2026-12-07: every step green, 32 wheels, 48.8 MiB for
CPython 3.12). What did not fit was made unnecessary instead: the smoke run's lm-eval suites (with
datasets, pandas, pyarrow and scipy, over 100 MB of wheels) run in CI on the same export; MLflow is
optional in the kernel tests' conftest.

    python benchmarks/gpu_wheels.py [--out .whl] [--python-version 3.12]   # download, check the size
    python benchmarks/gpu_wheels.py --simulate   # the dry run with IMAGE + CARRY only, on this machine

The download takes binary wheels for the GPU machine's Python (``--python-version``, its image's: 3.12)
on manylinux x86_64 and refuses a total over ``LIMIT_MIB``. Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
LIMIT_MIB = 60.0
"""What a run carries (64 MiB of ignored paths), less room for what else it carries."""

IMAGE = ("torch", "triton", "numpy", "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "filelock", "fsspec")
IMAGE += ("typing-extensions",)
"""A bare CUDA torch image: torch, triton, numpy and torch's own requirements (the GPU image has more; this is the least)."""

CARRY = (
    # the model and its kernels: megatron-core, FP8 (torchao), Liger (the kernels' peer)
    "megatron-core",
    "torchao",
    "liger-kernel",
    # data: shards, tokenizers, the language filter, compression
    "webdataset",
    "braceexpand",
    "tokenizers",
    "fastokens",
    "ffbpe",
    "py3langid",
    "zstandard",
    "pyyaml",
    "psutil",
    # the ranks' TensorBoard writer (torch.utils.tensorboard)
    "tensorboard",
    "protobuf",
    "absl-py",
    # the Hugging Face export, loaded back by the smoke run
    "transformers",
    "huggingface-hub",
    "safetensors",
    "regex",
    "tqdm",
    "packaging",
    "httpx2",
    "httpcore2",
    "h11",
    "anyio",
    "idna",
    "certifi",
    "truststore",
    # the kernel tests
    "pytest",
    "pluggy",
    "iniconfig",
    "pygments",
)

PLATFORMS = tuple(f"manylinux_2_{glibc}_x86_64" for glibc in (28, 27, 24, 17)) + ("manylinux2014_x86_64",)


def _name(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def pinned(names: tuple[str, ...]) -> list[str]:
    """``name==version`` of each, from requirements.lock; an error names any the lock does not pin."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[_name(name)] = f"{name}=={version.strip()}"
    missing = [n for n in names if _name(n) not in pins]
    if missing:
        raise SystemExit(f"error: {LOCK.name} pins no {', '.join(missing)}: add them to pyproject.toml's dependencies")
    return [pins[_name(n)] for n in names]


def download(out: Path, python_version: str) -> dict:
    """The CARRY wheels for CPython ``python_version`` on manylinux x86_64 into ``out``; refuses over LIMIT_MIB."""
    out.mkdir(parents=True, exist_ok=True)
    abi = "cp" + python_version.replace(".", "")
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(out)]
    command += ["--python-version", python_version, "--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none"]
    for platform in (*PLATFORMS, "any"):
        command += ["--platform", platform]
    subprocess.run([*command, *pinned(CARRY)], check=True)
    wheels = sorted(out.glob("*.whl"))
    wanted = {_name(n) for n in CARRY}
    stale = [w.name for w in wheels if _name(w.name.split("-")[0]) not in wanted]
    if stale:
        raise SystemExit(f"error: {out} holds wheels outside CARRY ({', '.join(stale)}): empty it first")
    mib = sum(w.stat().st_size for w in wheels) / 2**20
    if mib > LIMIT_MIB:
        by_size = sorted(wheels, key=lambda w: -w.stat().st_size)[:5]
        largest = ", ".join(f"{w.name} {w.stat().st_size / 2**20:.1f} MiB" for w in by_size)
        raise SystemExit(f"error: the wheels take {mib:.1f} MiB, over the {LIMIT_MIB:g} MiB a run carries; largest: {largest}")
    return {"wheels": len(wheels), "mib": round(mib, 1), "limit_mib": LIMIT_MIB, "python": python_version, "out": str(out)}


def simulate() -> dict:
    """``gpu_checks.sh --dry-run`` with a Python that holds IMAGE and CARRY only (this machine's, from the lock)."""
    with tempfile.TemporaryDirectory(prefix="gpu-wheels-") as tmp:
        venv, out = Path(tmp) / "venv", Path(tmp) / "out"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = venv / "bin" / "python"
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", *pinned(IMAGE + CARRY)], check=True)
        env = {"PATH": "/usr/bin:/bin", "PYTHON": str(python), "PYTHONDONTWRITEBYTECODE": "1", "HOME": tmp, "TMPDIR": tmp}
        run = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_checks.sh"), "--dry-run", str(out)], cwd=ROOT, env=env)
        steps = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()]
        what = f"{len(IMAGE)} image + {len(CARRY)} carried packages"
        return {"simulated": what, "exit": run.returncode, "steps": {n: int(rc) for n, rc, _ in steps}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".whl", help="where the wheels go (gpu_checks.sh reads .whl/)")
    parser.add_argument("--python-version", default="3.12", help="the GPU image's Python (default 3.12)")
    parser.add_argument("--simulate", action="store_true", help="run the dry run with IMAGE + CARRY only, here; no download")
    args = parser.parse_args()
    result = simulate() if args.simulate else download(args.out, args.python_version)
    print(json.dumps(result))
    if result.get("exit"):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
