"""Aliases: ``models/<name>/aliases/<alias>.json`` points at a version. It is created only if absent
and replaced only if unchanged since it was read (its ETag: S3 ``If-Match``, a locked compare-and-swap
locally); a move that loses a race reads the alias again and decides again."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from common.contracts import (
    alias_key,
    aliases_prefix,
    model_prefix,
)
from common.names import name_problem
from registry.card import utc_now
from registry.names import RegistryError, check_alias, check_name
from storage import AlreadyCommitted, PreconditionFailed, Store, StoreError

ALIAS_ATTEMPTS = 50
"""Conditional alias writes tried before giving up when other writers keep winning."""


def read_alias(store: Store, name: str, alias: str) -> tuple[int | None, str | None]:
    """The version ``name:alias`` points at and the alias object's ETag; (None, None) if there is none."""
    key = alias_key(name, alias)
    for attempt in range(3):
        try:
            record, etag = store.get_json_with_etag(key)
            break
        except StoreError:
            if not store.exists(key):
                return None, None
            if attempt == 2:
                raise  # it exists and cannot be read
            # created between the read and the check: read it again
        except ValueError as e:
            raise RegistryError(f"{store.url(key)} is not JSON: {e}") from e
    version = record.get("version") if isinstance(record, dict) else None
    if type(version) is not int or version < 1:
        raise RegistryError(f"{store.url(key)} does not name a version ({record!r}): promote a version to {name}:{alias} again")
    return version, etag


def move_alias(store: Store, name: str, alias: str, decide: Callable[[int | None], int | None]) -> int | None:
    """Point ``name:alias`` at ``decide(holder)`` (None: leave it), ``holder`` being the version
    it points at now; the write is conditional on the alias being what ``decide`` saw (created
    only if absent, replaced only if its ETag is unchanged). A lost race reads the alias again
    and decides again. Returns the version the alias holds afterwards."""
    key = alias_key(name, alias)
    for attempt in range(ALIAS_ATTEMPTS):
        holder, etag = read_alias(store, name, alias)
        target = decide(holder)
        if target is None or target == holder:
            return holder
        if not store.is_committed(model_prefix(name, target)):
            raise RegistryError(f"{name}:{target} is not a committed version")
        record = {"version": target, "updated_at": utc_now()}
        try:
            if etag is None:
                store.put_json(key, record, if_absent=True)
            else:
                store.put_json(key, record, if_match=etag)
            return target
        except (AlreadyCommitted, PreconditionFailed):
            time.sleep(random.uniform(0, min(0.5, 0.005 * 2**attempt)))  # someone else moved it: again
    raise RegistryError(f"{name}:{alias} kept changing under {ALIAS_ATTEMPTS} attempts to move it; try again")


def set_alias(store: Store, name: str, alias: str, version: int) -> None:
    """Point ``name:alias`` at ``version`` (a committed one), whoever moved it last."""
    check_name(name)
    check_alias(alias)
    if type(version) is not int or version < 1:
        raise RegistryError(f"invalid version {version!r}: versions are 1, 2, 3, ...")
    if not store.is_committed(model_prefix(name, version)):
        raise RegistryError(f"{name}:{version} is not a committed version")
    move_alias(store, name, alias, lambda holder: version)


def aliases_of(store: Store, name: str) -> dict[str, int]:
    """Every alias of ``name`` and its version (files that are not an alias's are left out)."""
    out = {}
    folder = aliases_prefix(name)
    for key in store.list(folder):
        alias = key[len(folder) :].removesuffix(".json")
        if key.endswith(".json") and not name_problem(alias, alias=True):
            try:
                version = read_alias(store, name, alias)[0]
            except RegistryError:
                continue
            if version is not None:
                out[alias] = version
    return out
