"""Cache versions: flytekit's cache key ignores code changes, so each task's version is the
derived code version of its module (``common.codeversion``): the source of every
first-party module it imports, transitively, and the versions of the libraries that decide
its results. No hand-written list of packages."""

from __future__ import annotations

from common.codeversion import code_version


def cache_version(task_module: str) -> str:
    return code_version(task_module)
