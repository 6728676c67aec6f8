"""One JSON schema per dataclass, not one per use.

flytekit's ``DataclassTransformer.get_literal_type`` builds a dataclass's JSON schema (mashumaro's
``build_json_schema``, the schema a launch form shows) every time a task or workflow interface names
the type, nested types included: 290 builds of the same few config dataclasses while the workflow
module loads, about half of its import time, paid again by every process that loads a task (each
rank of the train task does). A dataclass does not change once defined, so its schema is built once
per process and each caller gets its own copy. Calls with other arguments than the type go through
unchanged.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import mashumaro.jsonschema

_build = mashumaro.jsonschema.build_json_schema


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
    """flytekit imports ``build_json_schema`` from the module at each call: replace it there."""
    mashumaro.jsonschema.build_json_schema = build_json_schema
