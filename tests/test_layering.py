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
LIBRARIES = [
    "common",
    "data_prep",
    "training",
    "evaluation",
    "kernels",
    "storage",
    "registry",
    "tracking",
    "runs",
    "reports",
    "hf_interop",
]

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
            ["runs", "training.callbacks", "training.runlog", "cli.retention", "reports"],
        ),
        # A run's records sit on their own floor, below training and above storage: nothing of ours above them.
        (
            ["training", "evaluation", "registry", "tracking", "reports", "pipeline", "tasks", "workflows", "cli", "data_prep"],
            ["runs"],
        ),
        (["torch", "flytekit", "tokenizers", "webdataset", "great_expectations", "boto3", "numpy", "pandas", "yaml"], ["common"]),
    ],
    ids=[
        "libraries-without-flyte",
        "data-tasks-without-torch",
        "cli-without-torch",
        "run-bookkeeping-without-torch",
        "run-records-below-training",
        "common-is-a-leaf",
    ],
)
@pytest.mark.slow
def test_layer_imports_without(blocked: list[str], targets: list[str]) -> None:
    result = imports_without(blocked, targets)
    assert result.returncode == 0, result.stderr[-3000:]


def test_common_imports_nothing_of_ours() -> None:
    """``common`` is the leaf every layer shares: no arrow may point from it back up."""
    from common.codeversion import FIRST_PARTY  # every package of ours: one list, which keys the caches too

    ours = FIRST_PARTY - {"common"}
    result = imports_without(sorted(ours), ["common"])
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_probe_can_fail() -> None:
    """The blocker really blocks: importing a task module with flytekit refused fails."""
    result = imports_without(["flytekit"], ["tasks.data"])
    assert result.returncode != 0 and "flytekit is blocked" in result.stderr


# Top floor first; a package imports only packages after it in this list (or itself). Two on one floor import
# neither of the other.
FLOORS = [
    ["cli"],
    ["workflows"],
    ["tasks"],
    ["pipeline"],
    ["tracking", "reports"],
    ["registry"],
    ["evaluation"],
    ["hf_interop"],
    ["training"],
    ["runs", "data_prep"],
    ["storage"],
    ["common", "kernels"],
]


def import_graph() -> dict[str, set[str]]:
    """Every first-party module (benchmarks and tests aside) → the first-party modules its import statements name,
    those inside functions too (``from a.b import c`` names ``a.b.c`` where that is a module, else ``a.b``)."""
    from common.codeversion import FIRST_PARTY, _imports, module_file

    graph: dict[str, set[str]] = {}
    for package in FIRST_PARTY:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            targets = set()
            for target in _imports(path.read_bytes(), name, path.name == "__init__.py"):
                if module_file(target, ROOT) is not None and not (target == name.rpartition(".")[0] and path.stem != "__init__"):
                    targets.add(target)
            # `from a.b import c` names both a.b and a.b.c: keep a.b only where c is not a module of its own.
            graph[name] = {t for t in targets if not any(o.startswith(t + ".") and o in targets for o in targets)}
    return graph


def test_imports_run_one_way() -> None:
    """No module imports a package on a floor above its own, and no modules import each other in a circle (an
    import inside a function counts: it is an arrow all the same, only a later one)."""
    floor = {package: i for i, packages in enumerate(FLOORS) for package in packages}
    graph = import_graph()
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if module.split(".")[0] != target.split(".")[0] and floor[module.split(".")[0]] >= floor[target.split(".")[0]]
    )
    assert not upward, f"imports that run up or sideways between packages: {upward}"
    circles = [sorted(c) for c in _strongly_connected(graph) if len(c) > 1]
    assert not circles, f"modules that import each other in a circle: {circles}"


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components of ``graph``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


LONGEST_FUNCTION = 80
"""Lines of the longest function (or method) allowed outside ``benchmarks/`` and ``tests/``: past it, split."""


def test_no_function_is_longer_than_a_screen() -> None:
    import ast

    from common.codeversion import FIRST_PARTY

    long = []
    for package in sorted(FIRST_PARTY):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > LONGEST_FUNCTION:
                        long.append(f"{path.relative_to(ROOT)}::{node.name} ({lines} lines)")
    assert not long, f"functions over {LONGEST_FUNCTION} lines: {long}"
