"""The registry's side of the workflow: find the model to continue from; register the result."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from flytekit import Cache, current_context, task

from common.contracts import EvalReport, ModelRef, model_prefix
from common.errors import ConfigError
from common.run_names import run_name
from common.settings import read_settings
from common.stages import mark_stage
from pipeline.config import PipelineConfig
from registry.card import continued_model, read_card
from registry.config import RegistryConfig
from registry.names import RegistryError
from registry.registry import register, resolve
from storage import open_store
from tasks.caching import cache_version
from tasks.placement import data_task, registry_task
from tasks.user_errors import as_messages
from training.config import ModelConfig, ParallelConfig, layout_problems

VERSION = cache_version(__name__)


def _entry(store: str, spec: str) -> str:
    """``models/<name>/<version>`` that ``spec`` names right now, or '' if it names nothing yet."""
    try:
        name, version = resolve(open_store(store), spec)
    except RegistryError as e:  # a first run: nothing is registered under that name or alias yet
        print(f"{spec} names no registered model yet ({e})")
        return ""
    return model_prefix(name, version)


class BaseModel(NamedTuple):
    entry: str
    model: ModelConfig


@task(**data_task())
@as_messages
def find_base_model(store: str, init_from: str, model: ModelConfig, parallel: ParallelConfig) -> BaseModel:
    """The registry entry that ``init_from`` names right now, or '' (train from scratch), and the model section
    the run trains: the base's shape (an imported model's comes from its Hugging Face config) with this run's
    kernels, or ``model`` from scratch. A setting of ``model`` that contradicts the base is refused here,
    before the data stage.

    Not cached: ``NAME:latest`` moves, and the concrete version it resolves to is what keys
    the cache of prepare and train downstream.
    """
    entry = _entry(store, init_from) if init_from else ""
    if not entry:
        return BaseModel(entry, model)
    section = continued_model(open_store(store), entry, dataclasses.asdict(model), dataclasses.asdict(ModelConfig()))
    resolved, problems = read_settings(ModelConfig, section, "model")
    if problems:
        raise ConfigError(f"{entry}'s model section does not fit this release: {'; '.join(problems)}")
    split = layout_problems(resolved, parallel)  # the base's heads and layers over this run's ranks
    if split:
        raise ConfigError(f"{init_from} is {entry}: {'; '.join(split)}")
    return BaseModel(entry, resolved)


@task(**data_task())
@as_messages
def find_gate_holder(store: str, registry: RegistryConfig) -> str:
    """The registry entry holding the gate alias (e.g. ``gpt-tiny:production``) right now, or ''.

    Not cached, for the same reason: evaluation compares against whoever holds it today.
    """
    return _entry(store, f"{registry.model_name}:{registry.gate_alias}")


def flyte_execution_id() -> str:
    """This Flyte execution's id (recorded on the card and in MLflow); "local" outside a backend."""
    try:
        return str(current_context().execution_id.name)
    except Exception:  # outside a Flyte execution
        return "local"


@task(
    # The full config is recorded in the card but does not key the cache: the report already
    # carries what the model depends on, and a moved corpus must not register a twin version.
    cache=Cache(version=VERSION, serialize=True, ignored_inputs=("config",)),
    **registry_task(),
)
@as_messages
def register_model(report: EvalReport, registry: RegistryConfig, config: PipelineConfig, model: ModelConfig) -> ModelRef:
    """Register the evaluated checkpoint as a new immutable version, move ``latest``, and move
    the gate alias too when the candidate is not worse than its holder (decision on the card).

    The holder is read again at registration: if the alias moved while the candidate was being
    evaluated, the gate compares with the new holder's recorded bits per byte on the same
    validation rows, or keeps the alias ("holder changed during evaluation: alias kept, re-run
    to compare"); the alias moves only if the holder compared with still holds it
    (``registry.register``). ``model``: the model section that trained (``find_base_model``'s), on the card in
    place of ``config``'s."""
    mark_stage("register")
    store = open_store(report.checkpoint.store)
    ref = register(
        store,
        registry.model_name,
        report,
        # The model section that trained: a continued run's is its base's (find_base_model).
        config={**dataclasses.asdict(config), "model": dataclasses.asdict(model)},
        gate_alias=registry.gate_alias,
        gate_tolerance=registry.gate_tolerance,
        execution_id=flyte_execution_id(),
        run_name=run_name(dataclasses.asdict(config), dataclasses.asdict(PipelineConfig())),
    )
    decision = read_card(store, ref.prefix).gate
    holder = _entry(report.checkpoint.store, f"{registry.model_name}:{registry.gate_alias}")
    print(f"quality gate: {decision.reason if decision else 'not applied'}; {registry.gate_alias} is {holder or 'unset'}")
    return ref
