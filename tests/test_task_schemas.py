"""tasks.schemas: flytekit's dataclass schemas, built once per type, are the ones mashumaro builds."""

from __future__ import annotations

import mashumaro.jsonschema
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
