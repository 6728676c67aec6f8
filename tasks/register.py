"""The registry's side of the workflow: find the model to continue from; register the result."""

from __future__ import annotations

import dataclasses

from flytekit import current_context, task

from pipeline.config import PipelineConfig, RegistryConfig
from registry.registry import ModelRef, RegistryError, register, resolve
from storage import open_store
from tasks.caching import cache_version
from tasks.placement import data_task, registry_task
from training.records import EvalReport

VERSION = cache_version(__name__, "registry", "storage", "pipeline")


@task(**data_task())
def find_base_model(store: str, init_from: str) -> str:
    """The registry entry (``models/<name>/<version>``) that ``init_from`` names right now, or ''.

    Not cached: ``NAME:latest`` moves, and the concrete version it resolves to is what keys
    the cache of prepare and train downstream. A name with no registered version yet means
    a first run, which trains from scratch.
    """
    if not init_from:
        return ""
    try:
        name, version = resolve(open_store(store), init_from)
    except RegistryError as e:
        print(f"{e}: training from scratch")
        return ""
    return f"models/{name}/{version}"


def _execution_id() -> str:
    try:
        return str(current_context().execution_id.name)
    except Exception:  # outside a Flyte execution
        return "local"


@task(
    cache=True,
    cache_version=VERSION,
    # The full config is recorded in the card but does not key the cache: the report already
    # carries what the model depends on, and a moved corpus must not register a twin version.
    cache_ignore_input_vars=("config",),
    **registry_task(),
)
def register_model(report: EvalReport, registry: RegistryConfig, config: PipelineConfig) -> ModelRef:
    """Register the evaluated checkpoint as a new immutable model version and move ``latest``."""
    ckpt = report.checkpoint
    card = {
        "metrics": {
            "val_loss": report.val_loss,
            "perplexity": report.perplexity,
            "bits_per_byte": report.bits_per_byte,
            "val_tokens": report.tokens_evaluated,
            **ckpt.summary,
        },
        "sample": report.sample,
        "sampled": report.sampled,
        "config": dataclasses.asdict(config),
        "lineage": {
            "dataset_version": ckpt.dataset.version,
            "dataset": f"{ckpt.dataset.store.rstrip('/')}/{ckpt.dataset.prefix}",
            "base_model": ckpt.base_model,
            "training_run": ckpt.run,
            "training_steps": ckpt.step,
            "flyte_execution_id": _execution_id(),
        },
    }
    return register(open_store(ckpt.store), registry.model_name, ckpt.prefix, ckpt.dataset.prefix, card)
