"""Model names, aliases and specs (``NAME``, ``NAME:VERSION``, ``NAME:ALIAS``), checked against
``common.names`` before the store is touched."""

from __future__ import annotations

from common.errors import UserError
from common.names import VERSION, name_problem
from registry.config import LATEST


class RegistryError(UserError, LookupError):
    """A model or version that does not exist, or a registration that cannot proceed."""


def check_name(name: object) -> str:
    """``name`` if it is a valid model name (``common.names``), else a RegistryError naming it."""
    problem = name_problem(name)
    if problem:
        raise RegistryError(f"invalid model name {name!r}: {problem}")
    return name  # type: ignore[return-value]


def check_alias(alias: object) -> str:
    """``alias`` if it is a valid alias (``common.names``), else a RegistryError naming it."""
    problem = name_problem(alias, alias=True)
    if problem:
        raise RegistryError(f"invalid alias {alias!r}: {problem}")
    return alias  # type: ignore[return-value]


def parse_spec(spec: object) -> tuple[str, int | None, str]:
    """``NAME``, ``NAME:VERSION`` or ``NAME:ALIAS`` → (name, version or None, alias or ''),
    checked against the naming rule without touching the store; NAME alone means ``latest``."""
    if not isinstance(spec, str):
        raise RegistryError(f"invalid model spec {spec!r}: use NAME, NAME:VERSION or NAME:ALIAS")
    name, colon, which = spec.partition(":")
    check_name(name)
    if not colon:
        return name, None, LATEST
    if VERSION.fullmatch(which):
        return name, int(which), ""
    if which.isascii() and which.isdigit():
        raise RegistryError(f"invalid version {which!r} in {spec!r}: versions are 1, 2, 3, ... (no leading zeros)")
    return name, None, check_alias(which)
