"""Config dataclasses from nested dicts (YAML presets, JSON), every key checked by its full path,
and the one way a list of setting problems becomes an error.

A problem is one line that names the key by its full path, its value and what to do, e.g.
``train.lr is -1.0: must be > 0 (typical 1e-4 … 3e-3)``. Config sections list theirs with a
``problems()`` method; ``problems_error`` turns a list of them into one ``ConfigError``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import re
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from common import docfields
from common.errors import ConfigError, did_you_mean

E = TypeVar("E", bound=enum.Enum)


def problems_error(problems: Iterable[str], source: str = "") -> ConfigError:
    """One ConfigError holding every problem: a summary line, then one ``  - …`` line each
    (the CLI keeps multi-line messages whose lines start with two spaces)."""
    lines = list(problems)
    where = f" in {source}" if source else ""
    head = f"the settings{where} have {len(lines)} problem{'s' if len(lines) != 1 else ''}:"
    return ConfigError(head + "".join(f"\n  - {line}" for line in lines))


def flat_settings(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings by their full paths: ``{"train": {"lr": 0.002}}`` → ``{"train.lr": 0.002}``
    (``prefix`` goes before each; an empty mapping is a value of its own)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping) and value:
            out.update(flat_settings(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def value_text(value: Any) -> str:
    """A config value as a person reads it: '-' for a missing one, floats briefly (0.003, 3e-05)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def at_least(path: str, value: float, low: float, advice: str = "") -> list[str]:
    """The problem line of a number below ``low``, or none."""
    return [] if value >= low else [f"{path} is {value!r}: must be ≥ {low}{advice}"]


def choices(enum_cls: type[enum.Enum]) -> str:
    return ", ".join(str(member.value) for member in enum_cls)


def as_choice(enum_cls: type[E], value: Any) -> E | Any:
    """``value`` as a member of ``enum_cls`` when it names one; otherwise unchanged, for the
    section's ``problems()`` to report (a constructor that raises would hide the other problems)."""
    try:
        return enum_cls(value)
    except ValueError:
        return value


def choice_problem(path: str, value: Any, enum_cls: type[enum.Enum]) -> list[str]:
    """The problem line of a value that is not one of ``enum_cls``'s, or none."""
    if isinstance(value, enum_cls):
        return []
    return [f"{path} is {value!r}: use one of {choices(enum_cls)}"]


def from_dict(cls: type, values: dict[str, Any], where: str = "", source: str = "") -> Any:
    """Build dataclass ``cls`` from nested dicts. Unknown keys, values of the wrong type and
    strings that name no choice of an Enum field are all collected and raised together as one
    ConfigError, each by its full path (``source`` names the file in the summary line)."""
    built, problems = read_settings(cls, values, where)
    if problems:
        raise problems_error(problems, source)
    return built


def read_settings(cls: type, values: Any, where: str = "") -> tuple[Any, list[str]]:
    """``cls`` built from nested dicts with every setting that could be read, and the problems of
    those that could not (unknown keys, wrong types: the defaults stand in for them), so that a
    caller can check the values it did read as well and report every problem at once. The
    object is None when ``values`` is not a mapping."""
    problems: list[str] = []
    return _build(cls, values, where, problems), problems


def _build(cls: type, values: Any, where: str, problems: list[str]) -> Any:
    if not isinstance(values, dict):
        problems.append(f"{where or 'config'} must be a mapping of settings, got {type(values).__name__} {values!r}")
        return None
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    prefix = f"{where}." if where else ""
    for name in sorted(set(values) - known, key=str):
        hint = did_you_mean(f"{prefix}{name}", (prefix + k for k in known)) if isinstance(name, str) else ""
        problems.append(f"unknown setting {prefix}{name}{hint}; known: {', '.join(sorted(known))}")
    kwargs = {}
    for name, value in values.items():
        if name not in known:
            continue
        hint, optional = _optional(hints[name])
        path = prefix + name
        before = len(problems)
        if optional and value is None:
            kwargs[name] = None  # ``X | None`` written as null: not set
            continue
        nested = dataclasses.is_dataclass(hint) or _dataclass_items(hint) is not None
        if dataclasses.is_dataclass(hint):
            read = _build(hint, value or {}, path, problems)
        elif (item := _dataclass_items(hint)) is not None:
            read = _build_items(item, value, path, problems)
        else:
            read = _check_scalar(hint, value, path, problems)
        if read is not None and (nested or len(problems) == before):
            kwargs[name] = read  # a value that could not be read keeps the default
    return cls(**kwargs)


def _optional(hint: Any) -> tuple[Any, bool]:
    """``(X, True)`` for ``X | None`` (``Optional[X]``), else ``(hint, False)``."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return hint, False


def _dataclass_items(hint: Any) -> Any:
    """The item class of ``list[SomeDataclass]``, else None."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is list and len(args) == 1 and dataclasses.is_dataclass(args[0]):
        return args[0]
    return None


def _build_items(cls: type, values: Any, path: str, problems: list[str]) -> list[Any] | None:
    """A list of ``cls`` from a list of mappings; each item's path is ``path[NAME]`` when it has a
    ``name`` string, else ``path[INDEX]``."""
    if not isinstance(values, list):
        problems.append(f"{path} must be a list, got {values!r}: write one '- key: value' mapping per item")
        return None
    out = []
    for i, value in enumerate(values):
        name = value.get("name") if isinstance(value, dict) else None
        label = name if isinstance(name, str) and name else i
        item = _build(cls, value, f"{path}[{label}]", problems)
        if item is not None:
            out.append(item)
    return out


def _check_scalar(hint: Any, value: Any, path: str, problems: list[str]) -> Any:
    if typing.get_origin(hint) is list:
        if not isinstance(value, list):
            problems.append(f"{path} must be a list, got {value!r}: write [a, b] or one '- item' per line")
            return value
        (item,) = typing.get_args(hint) or (Any,)
        if item is str:
            for i, v in enumerate(value):
                if not isinstance(v, str):
                    problems.append(f"{path}[{i}] must be a string, got {v!r}")
        return value
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        member = as_choice(hint, value)
        problems.extend(choice_problem(path, member, hint))
        return member
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and (whole := whole_number(value)) is not None:
        return whole
    if isinstance(hint, type) and (not isinstance(value, hint) or (hint is int and isinstance(value, bool))):
        problems.append(f"{path} must be {hint.__name__}, got {value!r}")
    return value


def whole_number(value: Any) -> int | None:
    """A whole number written in scientific notation, as budgets are (``2e9``: YAML reads it as a string,
    ``2.0e9`` as a float), else None (the type check then says what is wrong)."""
    if isinstance(value, str) and "e" in value.lower():
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


# -- the settings a config class has, by their full paths (``pretrain settings``, ``--set``) --------------------


@dataclasses.dataclass(frozen=True)
class SettingDoc:
    """One setting of a config tree: its full path, its default and its description (the field's docstring)."""

    key: str
    """``train.lr``; a field of each item of a list of sections reads ``data.mixture[].weight``."""
    default: Any
    """As YAML writes it: an Enum's value, a list, None for an item's setting without a default."""
    type: str
    """The field's type as written in the class, without module paths: ``float``, ``list[str]``, ``int | None``."""
    doc: str
    choices: tuple[str, ...] = ()
    """The values an Enum setting takes."""


def documented_settings(cls: type, defaults: Any = None, prefix: str = "") -> list[SettingDoc]:
    """Every leaf setting of dataclass ``cls`` and its sections, depth first in field order, with the defaults of
    ``defaults`` (an instance; None: the fields' own defaults) and each field's docstring (``common.docfields``)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        hint, key = hints[f.name], f"{prefix}{f.name}"
        default = getattr(defaults, f.name) if defaults is not None else _field_default(f)
        if dataclasses.is_dataclass(hint):
            out += documented_settings(hint, default, f"{key}.")
            continue
        doc = " ".join((f.metadata.get("description") or _source_docs(cls).get(f.name, "")).split())
        choices = tuple(str(m.value) for m in _optional(hint)[0]) if _is_enum(_optional(hint)[0]) else ()
        out.append(SettingDoc(key, _yaml_value(default), _type_text(hint), doc, choices))
        if (item := _dataclass_items(hint)) is not None:
            out += documented_settings(item, None, f"{key}[].")
    return out


def setting_type(cls: type, parts: Iterable[str]) -> Any:
    """The type of the setting that the key ``parts`` (``["data", "sources"]``) names under dataclass ``cls``;
    None when it names none (the config check reports the key)."""
    hint: Any = cls
    for part in parts:
        hint = _optional(hint)[0]
        if not dataclasses.is_dataclass(hint) or part not in {f.name for f in dataclasses.fields(hint)}:
            return None
        hint = typing.get_type_hints(hint)[part]
    return hint


def listed(hint: Any, value: Any) -> Any:
    """``value`` as the one-item list it means when the setting (of type ``hint``) is a list of plain values and
    ``value`` is one such value (``--set data.sources=/dir``); any other value unchanged, for the check to judge."""
    hint = _optional(hint)[0]
    scalar = value is not None and not isinstance(value, (list, dict))
    return [value] if scalar and typing.get_origin(hint) is list and _dataclass_items(hint) is None else value


@functools.cache
def _source_docs(cls: type) -> dict[str, str]:
    """The docstrings of a class that ``common.docfields.documented`` did not decorate, read from its source."""
    try:
        return docfields.field_docstrings(cls)
    except (OSError, TypeError):  # no source (a class made at runtime): no descriptions
        return {}


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _is_enum(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, enum.Enum)


def _yaml_value(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    return value


def _type_text(hint: Any) -> str:
    """``hint`` as it reads in the class: ``list[str]``, ``int | None``, ``Normalization`` (no module paths)."""
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return re.sub(r"\b(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)", r"\1", str(hint)).replace("NoneType", "None")
