"""Cache versions: flytekit's cache key ignores code changes, so each task's version is a
hash of the source it runs (its own module and the libraries it calls)."""

from __future__ import annotations

from common.hashing import source_hash


def cache_version(task_module: str, *libraries: str) -> str:
    return source_hash(task_module, *libraries)
