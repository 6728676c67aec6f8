"""Config dataclasses from nested dicts (YAML presets, JSON), every key checked by its full path."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from common.errors import ConfigError


def from_dict(cls: type, values: dict[str, Any], where: str = "") -> Any:
    """Build dataclass ``cls`` from nested dicts, rejecting unknown keys by their full path."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where or 'config'} must be a mapping, got {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown setting {where + '.' if where else ''}{unknown[0]}; known: {', '.join(sorted(known))}")
    kwargs = {}
    for name, value in values.items():
        hint = hints[name]
        path = f"{where}.{name}" if where else name
        if dataclasses.is_dataclass(hint):
            kwargs[name] = from_dict(hint, value or {}, path)
        else:
            kwargs[name] = _check_scalar(hint, value, path)
    return cls(**kwargs)


def _check_scalar(hint: Any, value: Any, path: str) -> Any:
    if typing.get_origin(hint) is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path} must be a list, got {value!r}")
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(hint, type) and (not isinstance(value, hint) or (hint is int and isinstance(value, bool))):
        raise ConfigError(f"{path} must be {hint.__name__}, got {value!r}")
    return value
