"""Held-out evaluation."""

from __future__ import annotations

from flytekit import task

from tasks.caching import cache_version
from training.config import EvalConfig, ModelConfig
from training.evaluate import EvalReport, evaluate
from training.train import CheckpointRef

VERSION = cache_version(__name__, "training", "data_prep", "storage", "pipeline.versioning")


@task(cache=True, cache_version=VERSION)
def evaluate_model(checkpoint: CheckpointRef, model: ModelConfig, eval_cfg: EvalConfig) -> EvalReport:
    """Validation loss, perplexity and a greedy sample of the trained checkpoint."""
    return evaluate(checkpoint, model, eval_cfg)
