"""The pipeline's one input: a tree of the libraries' config sections, and YAML presets."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from data_prep.config import DataConfig, TokenizerConfig
from data_prep.validation import ValidationConfig
from pipeline.docfields import documented
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


class ConfigFileError(ValueError):
    """A preset that does not match the config tree; the message names the key."""


def from_dict(cls: type, values: dict[str, Any], where: str = "") -> Any:
    """Build dataclass ``cls`` from nested dicts, rejecting unknown keys by their full path."""
    if not isinstance(values, dict):
        raise ConfigFileError(f"{where or 'config'} must be a mapping, got {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigFileError(f"unknown setting {where + '.' if where else ''}{unknown[0]}; known: {', '.join(sorted(known))}")
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
            raise ConfigFileError(f"{path} must be a list, got {value!r}")
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(hint, type) and (not isinstance(value, hint) or (hint is int and isinstance(value, bool))):
        raise ConfigFileError(f"{path} must be {hint.__name__}, got {value!r}")
    return value


def load_config(path: str | Path) -> PipelineConfig:
    """A YAML preset as a PipelineConfig (missing keys keep their defaults)."""
    try:
        values = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError as e:
        raise ConfigFileError(f"config file {path} does not exist") from e
    except yaml.YAMLError as e:
        raise ConfigFileError(f"config file {path} is not valid YAML: {e}") from e
    return from_dict(PipelineConfig, values)
