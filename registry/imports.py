"""Registering a model that was not trained here (``pretrain registry import``): its files staged locally
by ``registry.hf_import``, committed as the name's next version under the registry's rules
(``registry.registry``): claimed, every object created only if absent, ``_COMMITTED`` last, ``latest`` moved
forward. The registration's identity is the name and the source files' digests: importing the same folder
again (or twice at once) gives the same version."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from common.contracts import CARD_MARKDOWN, ModelCard, ModelRef, card_key, model_prefix, registration_key
from common.hashing import config_hash
from registry.card import card_markdown, read_card
from registry.config import LATEST
from registry.names import RegistryError, check_name
from registry.registry import (
    _check_same_registration,
    _claim_registration,
    _claimed_version,
    _create,
    _json,
    _move_aliases,
    _versions,
)
from storage import AlreadyCommitted, Store
from training.config import ModelConfig


def import_identity(store: Store, name: str, files: dict[str, str]) -> str:
    """What makes two imports the same registration: the name, the store and the source files' digests."""
    return config_hash({"import": dict(sorted(files.items())), "name": name, "store": store.uri})


def imported_version(store: Store, name: str, identity: str) -> int | None:
    """The committed version an identical import registered, if any (then nothing needs converting again)."""
    key = registration_key(name, identity)
    if not store.exists(key):
        return None
    version = _claimed_version(store, key)
    return version if store.is_committed(model_prefix(name, version)) else None


def check_same_shape(store: Store, name: str, model: dict) -> None:
    """Refuse to add a model of another shape to ``name``: its versions are one model's history, which a
    continued run, the gate and ``runs compare`` read as comparable."""
    check_name(name)
    versions = _versions(store, name)
    if not versions:
        return
    card = read_card(store, model_prefix(name, versions[-1]))
    defaults = dataclasses.asdict(ModelConfig())
    differ = card.shape_differences(model, defaults)
    if differ:
        held = card.model_config(defaults)
        details = ", ".join(f"{k}: {held.get(k)!r} there, {model[k]!r} here" for k in differ)
        raise RegistryError(
            f"{name} holds models of another shape (its version {versions[-1]}: {details}): import it under another --name"
        )


def register_staged(store: Store, name: str, identity: str, staging: Path, card_for: Callable[[int], ModelCard]) -> ModelRef:
    """Commit the files staged in ``staging`` and the card ``card_for(version)`` as ``name``'s next version (or
    the version an identical import claimed), then move ``latest`` to it."""
    check_name(name)
    version = _claim_registration(store, name, identity)
    prefix = model_prefix(name, version)
    replay = store.is_committed(prefix)
    if replay:
        _check_same_registration(store, prefix, identity)
    else:
        for path in sorted(p for p in staging.rglob("*") if p.is_file()):
            _create(store, f"{prefix}/{path.relative_to(staging).as_posix()}", path=path)
        card = card_for(version)
        if not _create(store, card_key(prefix), _json(card.to_dict())):
            card = read_card(store, prefix)  # the identical import's, written first
        _create(store, f"{prefix}/{CARD_MARKDOWN}", card_markdown(card).encode())
        try:
            store.commit(prefix, {"version": version, "registration": identity})
        except AlreadyCommitted:
            _check_same_registration(store, prefix, identity)
    _move_aliases(store, name, version, (LATEST,), replay)
    return ModelRef(store=store.uri, name=name, version=version, prefix=prefix)
