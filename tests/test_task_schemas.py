"""tasks.schemas: flytekit's dataclass schemas, built once per type, are the ones mashumaro builds."""

from __future__ import annotations

import dataclasses
import json
import typing

import mashumaro.jsonschema
import pytest
from flytekit.core.type_engine import TypeEngine

from pipeline.config import PipelineConfig
from tasks import schemas
from training.config import TrainConfig


def test_each_caller_gets_mashumaros_schema_as_its_own_copy():
    built = schemas._build(PipelineConfig).to_dict()
    first, second = (schemas.build_json_schema(PipelineConfig).to_dict() for _ in range(2))
    assert first == second == built and first is not second
    first["properties"].clear()  # a caller changing its copy changes no one else's
    assert schemas.build_json_schema(PipelineConfig).to_dict() == built


def test_flytekit_reads_the_cached_schema_into_the_literal_type():
    assert mashumaro.jsonschema.build_json_schema is schemas.build_json_schema  # installed by importing tasks
    literal = TypeEngine.to_literal_type(TrainConfig)
    assert literal.metadata == schemas._build(TrainConfig).to_dict() and "steps" in literal.metadata["properties"]


def interface_dataclasses() -> set[type]:
    """Every dataclass named by an input or output of a task the workflow runs, nested ones included."""
    from flytekit.core.base_task import PythonTask
    from flytekit.core.context_manager import FlyteEntities

    import workflows.pretrain  # noqa: F401  (registers every task the workflow runs)

    found: set[type] = set()

    def visit(annotation: object) -> None:
        if dataclasses.is_dataclass(annotation) and isinstance(annotation, type) and annotation not in found:
            found.add(annotation)
            for hint in typing.get_type_hints(annotation).values():
                visit(hint)
        for argument in typing.get_args(annotation):
            visit(argument)

    for entity in FlyteEntities.entities:
        if isinstance(entity, PythonTask) and entity.python_interface is not None:
            for annotation in [*entity.python_interface.inputs.values(), *entity.python_interface.outputs.values()]:
                visit(annotation)
    return found


def test_a_scalar_default_is_shown_as_mashumaro_would_encode_it(monkeypatch: pytest.MonkeyPatch):
    """tasks.schemas' fast path for scalar defaults against mashumaro's own encoding, for every type the tasks'
    interfaces name, as JSON text (an int shown where mashumaro shows a float would differ here, not in a dict)."""
    import mashumaro.jsonschema.schema

    types = interface_dataclasses()
    assert {PipelineConfig, TrainConfig} <= types and len(types) >= 15, sorted(t.__name__ for t in types)
    assert mashumaro.jsonschema.schema._default is schemas._default  # installed by importing tasks
    fast = {t: json.dumps(schemas._build(t).to_dict()) for t in types}
    monkeypatch.setattr(mashumaro.jsonschema.schema, "_default", schemas._library_default)
    library = {t: json.dumps(schemas._build(t).to_dict()) for t in types}
    assert fast == library
    assert '"default": 0.0' in library[TrainConfig] or '"default": 0.1' in library[TrainConfig]  # floats stay floats
