"""Content hashes of source code and configuration, used as cache versions and run ids."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any


def _module_files(name: str) -> tuple[Path, list[Path]]:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(name)
    origin = Path(spec.origin)
    if spec.submodule_search_locations:  # a package: every .py file below it
        return origin.parent, sorted(p for p in origin.parent.rglob("*.py") if "__pycache__" not in p.parts)
    return origin.parent, [origin]


def source_hash(*modules: str) -> str:
    """Hash of the source of the named modules and packages (every file, path and content)."""
    digest = hashlib.sha256()
    for name in sorted(set(modules)):
        root, files = _module_files(name)
        for path in files:
            digest.update(f"{name}:{path.relative_to(root).as_posix()}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def config_hash(*parts: Any) -> str:
    """Hash of dataclasses and plain values, independent of dict ordering."""

    def plain(obj: Any) -> Any:
        return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj

    text = json.dumps([plain(p) for p in parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
