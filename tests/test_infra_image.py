"""infra/images/Dockerfile.train builds the same image as the training ImageSpec of tasks/placement.py."""

from __future__ import annotations

import re
import shlex

from tests.helpers import INFRA, ROOT, registration_facts

DOCKERFILE = INFRA / "images" / "Dockerfile.train"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    lines, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        current += " " + line.removesuffix("\\").strip()
        if not line.endswith("\\"):
            lines.append(current.strip())
            current = ""
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln else "") for ln in lines]


def arg_defaults(instrs: list[tuple[str, str]]) -> dict[str, str]:
    out = {}
    for op, args in instrs:
        if op == "ARG" and "=" in args:
            name, _, default = args.partition("=")
            out[name] = shlex.split(default)[0] if default else ""
    return out


def lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        name, _, version = line.partition("==")
        pins[name.lower().replace("_", "-")] = version
    return pins


def image_errors(text: str, facts: dict) -> list[str]:
    """How the Dockerfile differs from the GPU training ImageSpec (facts from tasks.placement)."""
    instrs = instructions(text)
    args = arg_defaults(instrs)
    errors = []
    spec = facts["profiles"]["gpu-2x8"]["training_image"]
    froms = [a.split()[0] for op, a in instrs if op == "FROM"]
    if args.get("CUDA_BASE") != facts["cuda_base"] or spec["base_image"] != facts["cuda_base"] or froms[-1] != "${CUDA_BASE}":
        errors.append(f"final stage must be FROM ${{CUDA_BASE}} = {facts['cuda_base']}, got {froms[-1:]} {args.get('CUDA_BASE')}")
    # ImageSpec without python_version builds the registering interpreter's version.
    if args.get("PYTHON_VERSION") != (spec["python_version"] or facts["python"]):
        errors.append(f"PYTHON_VERSION {args.get('PYTHON_VERSION')} != {spec['python_version'] or facts['python']}")
    packages = shlex.split(args.get("TRAIN_PACKAGES", ""))
    if sorted(packages) != sorted(facts["train_packages"]):
        errors.append(f"TRAIN_PACKAGES {packages} != tasks.placement.TRAIN_PACKAGES {facts['train_packages']}")
    pinned = {p.partition("==")[0]: p.partition("==")[2] for p in spec["packages"]}
    pins = lock()
    for name in facts["train_packages"]:
        if pinned.get(name) != pins.get(name):
            errors.append(f"{name}: the ImageSpec pins {pinned.get(name)}, requirements.lock {pins.get(name)}")
    runs = " && ".join(a for op, a in instrs if op == "RUN")
    if not re.search(r"uv pip install --constraint /tmp/requirements\.lock \$\{TRAIN_PACKAGES\}", runs):
        errors.append("the training packages must be installed with requirements.lock as constraints")
    if not any(op == "COPY" and a.split()[0] == "requirements.lock" for op, a in instrs):
        errors.append("requirements.lock is not copied into the build")
    torch_index = args.get("TORCH_INDEX_URL", "")
    if not re.fullmatch(r"https://download\.pytorch\.org/whl/cu\d+", torch_index):
        errors.append(f"torch must come from a PyTorch CUDA index, got {torch_index!r}")
    if not re.search(r"sed -n 's/\^torch==//p' /tmp/requirements\.lock", runs) or '"torch==${TORCH_VERSION}"' not in runs:
        errors.append("torch must be installed at the version requirements.lock pins")
    if '--index-url "${TORCH_INDEX_URL}"' not in runs:
        errors.append("torch must be installed from ${TORCH_INDEX_URL}")
    env = " ".join(a for op, a in instrs if op == "ENV")
    if "PYTHONPATH=/root" not in env:
        errors.append("PYTHONPATH=/root (where fast registration unpacks the code) is missing")
    if [a for op, a in instrs if op == "USER"][-1:] != ["1000:1000"]:
        errors.append("the image must run as the numeric non-root user 1000:1000 (flytekit, the pods' runAsUser)")
    return errors


def test_dockerfile_matches_the_training_imagespec():
    errors = image_errors(DOCKERFILE.read_text(), registration_facts())
    assert not errors, "\n".join(errors)


def test_lock_pins_torch_and_the_training_packages():
    pins = lock()
    facts = registration_facts()
    assert pins.get("torch"), "requirements.lock must pin torch"
    assert all(pins.get(name) for name in facts["train_packages"])


def test_image_checker_rejects_a_drifted_dockerfile():
    text, facts = DOCKERFILE.read_text(), registration_facts()
    drifted = {
        "base": text.replace("ARG CUDA_BASE=nvcr.io/nvidia/pytorch:25.01-py3", "ARG CUDA_BASE=nvcr.io/nvidia/pytorch:24.01-py3"),
        "python": text.replace("ARG PYTHON_VERSION=3.11", "ARG PYTHON_VERSION=3.12"),
        "packages": text.replace(' psutil"', '"'),
        "unconstrained": text.replace("--constraint /tmp/requirements.lock ${TRAIN_PACKAGES}", "${TRAIN_PACKAGES}"),
        "cpu torch": text.replace("https://download.pytorch.org/whl/cu128", "https://download.pytorch.org/whl/cpu"),
        "root": text.replace("USER 1000:1000", "USER root"),
    }
    for what, bad in drifted.items():
        assert bad != text, what
        assert image_errors(bad, facts), f"{what}: drift not detected"
