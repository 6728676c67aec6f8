"""Model registration with lineage."""

from __future__ import annotations

import dataclasses

from flytekit import current_context, task

from pipeline.config import PipelineConfig
from registry.registry import ModelRef, register
from storage import open_store
from tasks.caching import cache_version
from training.evaluate import EvalReport

VERSION = cache_version(__name__, "registry", "storage", "pipeline")


def _execution_id() -> str:
    try:
        return str(current_context().execution_id.name)
    except Exception:  # outside a Flyte execution
        return "local"


@task(cache=True, cache_version=VERSION)
def register_model(report: EvalReport, config: PipelineConfig) -> ModelRef:
    """Register the evaluated checkpoint as a new immutable model version and move ``latest``."""
    ckpt = report.checkpoint
    card = {
        "metrics": {
            "val_loss": report.val_loss,
            "perplexity": report.perplexity,
            "val_tokens": report.tokens_evaluated,
            **ckpt.summary,
        },
        "sample": report.sample,
        "config": dataclasses.asdict(config),
        "lineage": {
            "dataset_version": ckpt.dataset.version,
            "dataset": f"{ckpt.dataset.store.rstrip('/')}/{ckpt.dataset.prefix}",
            "training_run": ckpt.run,
            "training_steps": ckpt.step,
            "flyte_execution_id": _execution_id(),
        },
    }
    return register(open_store(ckpt.store), config.registry.model_name, ckpt.prefix, ckpt.dataset.prefix, card)
