"""One JSON schema per dataclass, not one per use.

flytekit's ``DataclassTransformer.get_literal_type`` builds a dataclass's JSON schema (mashumaro's
``build_json_schema``, the schema a launch form shows) every time a task or workflow interface names
the type, nested types included: 290 builds of the same few config dataclasses while the workflow
module loads, about half of its import time, paid again by every process that loads a task (each
rank of the train task does). A dataclass does not change once defined, so its schema is built once
per process and each caller gets its own copy. Calls with other arguments than the type go through
unchanged.

Building one is slow for a reason of its own: mashumaro encodes each field's default through a dataclass it
defines and compiles for that one field (``mashumaro.jsonschema.schema._default``), about 1.5 ms a field and
690 fields for the workflow's interfaces (1.0 of the 1.24 CPU-s the schemas cost a process that loads the
workflow, and each rank of the train task). A default that is a plain JSON scalar (exactly bool, int, float,
str or None) encodes to itself whatever the field's type, so it is returned as it is; any other default (an
enum, a list, a dataclass) still goes through mashumaro. tests/test_task_schemas.py builds every config
type's schema both ways and finds them equal.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import mashumaro.jsonschema
import mashumaro.jsonschema.schema

_build = mashumaro.jsonschema.build_json_schema
_library_default = mashumaro.jsonschema.schema._default
_JSON_SCALARS = (bool, int, float, str, type(None))


def _default(f_type: Any, f_value: Any, config_cls: type) -> Any:
    """A field's default as the schema shows it: a JSON scalar as it is, anything else as mashumaro encodes it.
    ``type(...) in`` and not ``isinstance``: an enum that subclasses str or int encodes to its value."""
    if type(f_value) in _JSON_SCALARS:
        return f_value
    return _library_default(f_type, f_value, config_cls)


class _Built:
    """What flytekit reads of a built schema: ``to_dict()``."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self._schema = schema

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._schema)


@functools.cache
def _schema_of(instance_type: Any) -> dict[str, Any]:
    return _build(instance_type).to_dict()


def build_json_schema(instance_type: Any, *args: Any, **kwargs: Any) -> Any:
    if args or kwargs:
        return _build(instance_type, *args, **kwargs)
    try:
        return _Built(_schema_of(instance_type))
    except TypeError as e:  # an unhashable type (e.g. annotated with a list): built every time
        if "unhashable" not in str(e):
            raise
        return _build(instance_type)


def install() -> None:
    """flytekit imports ``build_json_schema`` from the module at each call: replace it there; the schema
    builder looks ``_default`` up in its module at each field."""
    mashumaro.jsonschema.build_json_schema = build_json_schema
    mashumaro.jsonschema.schema._default = _default
