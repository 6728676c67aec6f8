"""The pipeline's one input: a tree of the libraries' config sections, and YAML presets."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from common.docfields import documented
from common.errors import ConfigError
from common.settings import from_dict
from data_prep.config import DataConfig, TokenizerConfig
from data_prep.validation import ValidationConfig
from training.config import EvalConfig, ModelConfig, ParallelConfig, TrainConfig


@documented
@dataclass
class RegistryConfig:
    """Where and under which name the trained model is registered."""

    model_name: str = "gpt-tiny"
    """Registry name of the model (versions are numbered within it)."""
    gate_alias: str = "production"
    """Alias the quality gate guards: a candidate takes it only if it is not worse than its holder."""
    gate_tolerance: float = 0.0
    """How many bits per byte worse than the alias holder a candidate may be and still take it."""


@documented
@dataclass
class PipelineConfig:
    """Everything a pretraining run needs. Every section has working defaults."""

    store: str = ""
    """Object store for datasets, checkpoints and the registry: a local path or s3://bucket/prefix
    (empty = $PRETRAIN_STORE, else ~/.local/share/pretrain/store)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Corpus, cleaning, packing and sharding."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """The BPE tokenizer trained on the corpus."""
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    """Thresholds of the data validation gate."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The GPT's shape."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Tensor/pipeline split of the ranks."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimisation and checkpointing."""
    evaluation: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation."""
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    """Model registration."""


def load_config(path: str | Path) -> PipelineConfig:
    """A YAML preset as a PipelineConfig (missing keys keep their defaults)."""
    try:
        values = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError as e:
        raise ConfigError(f"config file {path} does not exist") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from e
    return from_dict(PipelineConfig, values)
