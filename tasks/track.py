"""The pipeline's MLflow mirror: the first task opens the execution's run, the last one makes it
whole from the store and mirrors the registry (``tracking``). Neither is cached (each execution is
its own run) and neither fails the workflow because of MLflow: a tracking server that is down gets
a warning, and the store keeps everything for a replay (``pretrain tracking sync NAME:VERSION``)."""

from __future__ import annotations

import dataclasses
import sys

from flytekit import Deck, task

from common.contracts import ModelRef, TrackingRef
from pipeline.config import PipelineConfig
from pipeline.summary import run_summary
from registry.card import code_revision, read_card
from storage import Store, open_store
from tasks.decks import FIELDS as DECK_FIELDS
from tasks.placement import registry_task
from tasks.register import flyte_execution_id
from tasks.user_errors import as_messages
from tracking.client import client, describe, experiment_id, fresh_execution_id, start_run, where
from tracking.mirror import record_execution, with_retry
from tracking.uri import resolve_uri


def _warn(line: str) -> None:
    print(f"WARNING: tracking: {line}", file=sys.stderr, flush=True)


@task(**registry_task())
@as_messages
def start_tracking(config: PipelineConfig) -> TrackingRef:
    """Create this execution's MLflow run (run name and tag: the Flyte execution id; a fresh unique id
    for a local execution) with the flattened config as params. One attempt with a short timeout: if
    MLflow is unreachable the run id is '' (one WARNING line) and the last task creates the run."""
    settings = config.tracking
    if not settings.enabled:
        print("tracking: off (tracking.enabled: false)")
        return TrackingRef()
    uri = resolve_uri(settings.uri)
    ref = TrackingRef(uri=uri, experiment=settings.experiment, execution=fresh_execution_id(flyte_execution_id()))
    code = code_revision()
    tags = {"pretrain.store": open_store(config.store).uri, "pretrain.code_commit": code.commit}
    tags["pretrain.code_dirty"] = str(code.dirty).lower()
    try:
        mlflow = client(uri, settings.request_timeout_s)
        exp = experiment_id(mlflow, settings.experiment, uri)
        run_id = start_run(mlflow, exp, ref.execution, dataclasses.asdict(config), tags)
    except Exception as e:  # MLflow never fails the pipeline
        _warn(f"MLflow at {where(uri)} unreachable ({describe(e)}); training goes on, the last step records the run")
        return ref
    print(f"tracking: execution {ref.execution} is MLflow run {run_id} (experiment {settings.experiment!r} at {where(uri)})")
    return dataclasses.replace(ref, run_id=run_id)


def _comparison_deck(store: Store, model: ModelRef) -> None:
    """This execution's training run beside the one of the model that held the gate alias before it."""
    from tasks import run_decks

    card = read_card(store, model.prefix)
    baseline = card.gate.baseline if card.gate is not None else ""
    if not baseline:
        return
    before = read_card(store, baseline)
    if before.lineage.training_run == card.lineage.training_run:
        return
    labels = ["this execution", f"{card.gate.alias} before ({before.name}:{before.version})"]
    Deck("Comparison", run_decks.run_comparison(store, [card.lineage.training_run, before.lineage.training_run], labels))


@task(enable_deck=True, deck_fields=DECK_FIELDS, **registry_task())
@as_messages
def track_run(tracking: TrackingRef, model: ModelRef, config: PipelineConfig) -> None:
    """Make the execution's MLflow run whole from the store (every step record, the evaluation
    figures, lineage tags, links to the outputs), creating it if the first task could not, and
    mirror the registered version and the registry's aliases. An unreachable server is retried for
    ``tracking.retry_s``, then one WARNING line: the pipeline succeeds all the same. Last, the run's
    summary in words (``pipeline.summary``): every execution ends with it, ``pyflyte run`` too."""
    store = open_store(model.store)
    try:
        _comparison_deck(store, model)
    except Exception as e:  # a Deck is a view: never worth the execution
        _warn(f"no comparison Deck ({describe(e)})")
    _mirror(tracking, store, model, config)
    try:
        print("\n".join(run_summary(store, model)), flush=True)
    except Exception as e:  # the summary is a view too
        _warn(f"no summary ({describe(e)})")


def _mirror(tracking: TrackingRef, store: Store, model: ModelRef, config: PipelineConfig) -> None:
    """The execution's MLflow run made whole and the registry mirrored (nothing when tracking is off)."""
    if not tracking.uri:
        return
    settings = config.tracking
    config_dict = dataclasses.asdict(config)

    def attempt() -> str:
        mlflow = client(tracking.uri, settings.request_timeout_s)
        return record_execution(
            mlflow, tracking.uri, tracking.experiment, tracking.execution, tracking.run_id, store, model, config_dict
        )

    try:
        run_id = with_retry(attempt, tracking.uri, settings.retry_s)
    except Exception as e:  # MLflow never fails the pipeline; the store has everything
        _warn(
            f"MLflow at {where(tracking.uri)} did not record execution {tracking.execution} ({describe(e)}); "
            f"the store has everything: `pretrain tracking sync {model.name}:{model.version}` replays it"
        )
        return
    print(
        f"tracking: execution {tracking.execution} recorded as MLflow run {run_id} at {where(tracking.uri)}; "
        f"{model.name}:{model.version} mirrored to its registered models"
    )
