"""Code versions derived from the import graph: what a module's results depend on, found by
reading source, not by a hand-written list.

``code_version("tasks.train")`` hashes

* every first-party module the module imports, transitively: a static walk of its import
  statements (top level and inside functions; ``from pkg import name`` where ``pkg.name``
  is a submodule; relative imports; the ``__init__.py`` of every parent package), each
  module's name and source bytes;
* the installed versions of the third-party distributions those modules import, except the
  few in ``NEUTRAL_DISTRIBUTIONS`` that cannot change a number;
* the files of a module's data folders: a module whose results depend on files beside it
  declares them as ``__data__ = ("folder", ...)`` (``evaluation.lm_eval_suite``: its task
  YAML), and every file under those folders counts with it;
* Python's major.minor.

The walk is pure: nothing walked is imported or executed, so it runs on any copy of the
tree (``root``) and costs a parse of each file in the closure (see ``tests/test_cache_keys.py``).
Imports under ``if TYPE_CHECKING:`` are followed too; the project has none, and following
them only ever makes a key change more often, never less. Dynamic imports
(``importlib.import_module``) are not seen; the project has none.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

# The project's top-level packages; every other non-stdlib import is third-party.
FIRST_PARTY = frozenset(
    {
        "common",
        "data_prep",
        "training",
        "evaluation",
        "hf_interop",
        "cli",
        "kernels",
        "storage",
        "registry",
        "pipeline",
        "reports",
        "runs",
        "tasks",
        "tracking",
        "workflows",
    }
)

# Where the first-party packages live (the repository root, or site-packages when installed).
PROJECT_ROOT = Path(__file__).resolve().parent.parent

# Third-party distributions whose version does not change what a task computes, so an
# upgrade of one of them must not invalidate cached results. Everything else a closure
# imports (torch, megatron-core, triton, tokenizers, webdataset, great-expectations, numpy,
# pandas, pyarrow, zstandard, safetensors, ...) is part of the key. Normalized names.
NEUTRAL_DISTRIBUTIONS = frozenset(
    {
        "flytekit",  # orchestration: schedules tasks and moves their records
        "flytekitplugins-kfpytorch",  # how ranks are launched (Elastic / PyTorchJob), not what they compute
        "kubernetes",  # pod specs for placement
        "pyyaml",  # reads presets; the values it reads are hashed as config
        "tqdm",  # progress bars
        "tensorboard",  # metric logging
        "mlflow",  # the tracking mirror (tracking/): records the numbers, never changes one
        "mlflow-skinny",  # mlflow's client part (provides the same `mlflow` import)
        "mlflow-tracing",  # likewise
        "matplotlib",  # draws the Decks' charts (reports.charts): pictures of the numbers, never the numbers
        "psutil",  # resource readings for logs
        "boto3",  # S3 transport: the bytes stored are the same
        "botocore",  # S3 transport (boto3's core)
    }
)


@dataclass(frozen=True)
class Closure:
    """The first-party modules a module imports, transitively (itself included), and the
    top-level names of the third-party packages they import."""

    modules: dict[str, Path]
    """Module name -> its source file, sorted by name."""
    third_party: frozenset[str]
    """Top-level import names outside the project and the standard library."""


def module_file(name: str, root: Path = PROJECT_ROOT) -> Path | None:
    """The source file of a first-party module or package under ``root``, or None."""
    if name.split(".")[0] not in FIRST_PARTY:
        return None
    base = Path(root, *name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def closure(module: str, root: Path = PROJECT_ROOT) -> Closure:
    """Walk the import statements of ``module`` (a dotted name under ``root``) transitively."""
    root = Path(root)
    if module_file(module, root) is None:
        raise ModuleNotFoundError(f"{module} is not a first-party module under {root}")
    modules: dict[str, Path] = {}
    third_party: set[str] = set()
    pending = [module]
    while pending:
        name = pending.pop()
        if name in modules:
            continue
        path = module_file(name, root)
        if path is None:  # `from pkg import attribute`, or an import that fails at run time
            continue
        modules[name] = path
        # Importing a.b.c runs a/__init__.py and a/b/__init__.py first.
        parts = name.split(".")
        pending.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        imported = _imports(path.read_bytes(), name, path.name == "__init__.py")
        for target in imported:
            top = target.split(".")[0]
            if top in FIRST_PARTY:
                pending.append(target)
            elif top not in sys.stdlib_module_names and top != "__future__":
                third_party.add(top)
    return Closure(dict(sorted(modules.items())), frozenset(third_party))


@cache
def _imports(source: bytes, module: str, is_package: bool) -> tuple[str, ...]:
    """Every module name an import statement in ``source`` may load (absolute, dotted).

    ``from a.b import c`` yields ``a.b`` and ``a.b.c``: the walk keeps ``a.b.c`` only if it
    is a module. Cached on the source bytes, so a file edited in place is parsed again.
    """
    package = module if is_package else module.rpartition(".")[0]
    names: list[str] = []
    for node in _statements(ast.parse(source, filename=module).body):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: level 1 is this package, each further dot one up
                parts = package.split(".") if package else []
                if node.level > len(parts):  # beyond the top-level package: fails at run time
                    continue
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return tuple(dict.fromkeys(names))


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of ``body``, nested ones included (in functions, classes, ``if``, ``try``,
    ``with``, loops, ``match`` cases), without visiting expressions: an import is a statement, and a
    module's expressions are most of its nodes (``ast.walk`` over them was most of a walk's time)."""
    for node in body:
        yield node
        for _, value in ast.iter_fields(node):
            if not isinstance(value, list):
                continue
            for item in value:
                if isinstance(item, ast.stmt):
                    yield from _statements([item])
                elif isinstance(item, (ast.excepthandler, ast.match_case)):
                    yield from _statements(item.body)


def _normalize(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


@cache
def _distributions_of_imports() -> dict[str, tuple[str, ...]]:
    """Top-level import name -> normalized names of the installed distributions providing it."""
    return {
        name: tuple(sorted({_normalize(d) for d in dists})) for name, dists in importlib.metadata.packages_distributions().items()
    }


def distribution_version(dist: str) -> str | None:
    """The installed version of a distribution, or None if it is not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def library_versions(third_party: frozenset[str] | set[str]) -> dict[str, str]:
    """``dist -> version`` for the distributions behind these top-level import names, less the
    neutral ones. A name no installed distribution provides (an optional import that is
    absent here) is recorded as ``import:<name> -> absent``: its absence can change results."""
    mapping = _distributions_of_imports()
    versions: dict[str, str] = {}
    for name in sorted(third_party):
        dists = mapping.get(name)
        if not dists:
            versions[f"import:{name}"] = "absent"
            continue
        for dist in dists:
            if dist not in NEUTRAL_DISTRIBUTIONS:
                versions[dist] = distribution_version(dist) or "absent"
    return dict(sorted(versions.items()))


def data_files(path: Path) -> list[Path]:
    """The files under the folders that the module at ``path`` names in ``__data__``, sorted."""
    folders = _data_folders(path.read_bytes())
    return sorted(f for folder in folders for f in (path.parent / folder).rglob("*") if f.is_file())


@cache
def _data_folders(source: bytes) -> tuple[str, ...]:
    """The folders a module's ``__data__`` names. Cached on the source bytes, as ``_imports``; a source
    without the name is not parsed again."""
    if b"__data__" not in source:
        return ()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__data__" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    return ()


def code_version(module: str, root: Path = PROJECT_ROOT) -> str:
    """A 16-hex-digit key of everything ``module``'s behaviour depends on (see the module doc)."""
    found = closure(module, root)
    digest = hashlib.sha256()
    digest.update(f"python {sys.version_info.major}.{sys.version_info.minor}\0".encode())
    for name, path in found.modules.items():
        digest.update(f"{name}\0".encode())
        digest.update(path.read_bytes())
        digest.update(b"\0")
        for data in data_files(path):
            digest.update(f"{data.relative_to(path.parent).as_posix()}\0".encode())
            digest.update(data.read_bytes())
            digest.update(b"\0")
    for dist, version in library_versions(found.third_party).items():
        digest.update(f"{dist}=={version}\0".encode())
    return digest.hexdigest()[:16]
