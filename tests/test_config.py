from pathlib import Path

import pytest

from common.errors import ConfigError
from pipeline.config import PipelineConfig, load_config

ROOT = Path(__file__).resolve().parent.parent


def test_tiny_cpu_preset_spells_out_the_defaults():
    assert load_config(ROOT / "configs" / "tiny-cpu.yaml") == PipelineConfig()


def test_partial_preset_keeps_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data:\n  sources: [/corpus, 's3://b/raw']\ntrain:\n  lr: 1\n")
    config = load_config(path)
    assert config.data.sources == ["/corpus", "s3://b/raw"]
    assert config.train.lr == 1.0 and config.train.steps == PipelineConfig().train.steps


@pytest.mark.parametrize(
    "text,message",
    [
        ("train:\n  stepz: 3\n", "unknown setting train.stepz"),
        ("model:\n  num_layers: four\n", "model.num_layers must be int"),
        ("data:\n  sources: /one/path\n", "data.sources must be a list"),
        ("data: [1, 2]\n", "data must be a mapping"),
    ],
)
def test_bad_preset_names_the_setting(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


@pytest.mark.parametrize("preset", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_every_preset_loads_and_travels_through_flyte(preset):
    from flytekit import FlyteContextManager
    from flytekit.core.type_engine import TypeEngine

    config = load_config(ROOT / "configs" / preset)
    ctx = FlyteContextManager.current_context()
    literal = TypeEngine.to_literal(ctx, config, PipelineConfig, TypeEngine.to_literal_type(PipelineConfig))
    assert TypeEngine.to_python_value(ctx, literal, PipelineConfig) == config
    assert config.model.num_attention_heads % config.parallel.tensor_parallel == 0
    assert config.model.hidden_size % config.model.num_attention_heads == 0
