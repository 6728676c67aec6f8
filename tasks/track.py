"""The pipeline's MLflow mirror: the first task opens the execution's run, the last one makes it
whole from the store and mirrors the registry (``tracking``), and the workflow's failure handler
(``fail_tracking``) ends the run FAILED with the error. None is cached (each execution is its own
run) and none fails the workflow because of MLflow: a tracking server that is down gets a warning,
and the store keeps everything for a replay (``pretrain tracking sync NAME:VERSION``)."""

from __future__ import annotations

import dataclasses
import sys
import threading

from flytekit import Deck, task
from flytekit.types.error import FlyteError

from common.contracts import ModelRef, TrackingRef
from common.run_names import run_name
from pipeline.config import PipelineConfig
from pipeline.summary import run_summary
from registry.card import code_revision, read_card
from reports.run_artifacts import run_artifacts
from storage import Store, open_store
from tasks import stage_log
from tasks.decks import FIELDS as DECK_FIELDS
from tasks.placement import registry_task
from tasks.register import flyte_execution_id
from tasks.user_errors import as_messages
from tracking.client import (
    EXECUTION_TAG,
    STORE_TAG,
    client,
    describe,
    experiment_id,
    failure,
    find_run,
    fresh_execution_id,
    mark_failed,
    open_command,
    run_opener,
    start_run,
    where,
)
from tracking.mirror import record_execution, with_retry
from tracking.uri import resolve_uri

# A local execution (``pretrain run``, ``pyflyte run``) has no execution id the failure handler could find
# the run by (Flyte's is "local" for every one of them), but it runs every task in this process and thread:
# start_tracking hands its TrackingRef over here, track_run takes it back at the end of a success, and the
# failure handler takes it on a failure. On a cluster the Flyte execution id finds the run instead.
_local = threading.local()


def _warn(line: str) -> None:
    print(f"WARNING: tracking: {line}", file=sys.stderr, flush=True)


@task(**registry_task())
@as_messages
def start_tracking(config: PipelineConfig) -> TrackingRef:
    """Create this execution's MLflow run (run name and tag: the Flyte execution id; a fresh unique id
    for a local execution) with the flattened config as params. One attempt with a short timeout: if
    MLflow is unreachable the run id is '' (one WARNING line) and the last task creates the run."""
    settings = config.tracking
    name = config_run_name(config)
    if not settings.enabled:
        print("tracking: off (tracking.enabled: false)")
        return TrackingRef(run_name=name)
    uri = resolve_uri(settings.uri)
    execution = fresh_execution_id(flyte_execution_id())
    ref = TrackingRef(uri=uri, experiment=settings.experiment, execution=execution, run_name=name)
    _local.ref = ref
    code = code_revision()
    tags = {STORE_TAG: open_store(config.store).uri, "pretrain.code_commit": code.commit}
    tags["pretrain.code_dirty"] = str(code.dirty).lower()
    try:
        mlflow = client(uri, settings.request_timeout_s)
        exp = experiment_id(mlflow, settings.experiment, uri)
        run_id = start_run(mlflow, exp, ref.execution, dataclasses.asdict(config), tags, name=name)
    except Exception as e:  # MLflow never fails the pipeline
        _warn(f"MLflow at {where(uri)} unreachable ({describe(e)}); training goes on, the last step records the run")
        return ref
    print(f"tracking: execution {ref.execution} is MLflow run {run_id} (experiment {settings.experiment!r} at {where(uri)})")
    _local.ref = dataclasses.replace(ref, run_id=run_id)
    return _local.ref


def config_run_name(config: PipelineConfig) -> str:
    """The execution's name for people: the model, the data and the settings that differ from the embedded defaults."""
    return run_name(dataclasses.asdict(config), dataclasses.asdict(PipelineConfig()))


def _comparison_deck(store: Store, model: ModelRef) -> None:
    """This execution's training run beside the one of the model that held the gate alias before it."""
    from reports.run_html import run_comparison
    from runs.catalog import load_runs

    card = read_card(store, model.prefix)
    baseline = card.gate.baseline if card.gate is not None else ""
    if not baseline:
        return
    before = read_card(store, baseline)
    if before.lineage.training_run == card.lineage.training_run:
        return
    labels = ["this execution", f"{card.gate.alias} before ({before.name}:{before.version})"]
    views = load_runs(store, [card.lineage.training_run, before.lineage.training_run])
    Deck("Comparison", run_comparison(views, labels))


CACHED_STAGES = ["prepare_data", "validate_data", "train_model", "evaluate_model", "register_model"]
"""The cached tasks every execution of the pipeline calls: those of them that did not run came from the cache."""


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
    mlflow_run, page = _mirror(tracking, store, model, config)
    done = stage_log.ran()  # read once: the tasks that ran, with their times
    stages = stage_log.stages_line(done, CACHED_STAGES)
    again = bool(done) and "register_model" not in {task for task, _, _ in done}
    try:
        summary = run_summary(store, model, mlflow_run, stages=stages, from_cache=again, mlflow_page=page)
        print("\n".join(summary), flush=True)
        stage_log.end()
    except Exception as e:  # the summary is a view too
        _warn(f"no summary ({describe(e)})")
    _local.ref = None  # a success: nothing for the failure handler


def _mirror(tracking: TrackingRef, store: Store, model: ModelRef, config: PipelineConfig) -> tuple[str, str]:
    """The execution's MLflow run made whole and the registry mirrored: its run id ('' when tracking is off
    or MLflow did not take it) and the address of its page on a tracking server ('' for a local database:
    ``pretrain ui`` serves it)."""
    if not tracking.uri:
        return "", ""
    settings = config.tracking
    # The model section that trained (the card's): a continued run's is its base's, not the config's defaults.
    config_dict = {**dataclasses.asdict(config), "model": read_card(store, model.prefix).config.get("model", {})}

    files = run_artifacts(store, model)
    name = config_run_name(config)
    found: list[str] = []  # the experiment's id, for the UI's address of the run

    def attempt() -> str:
        mlflow = client(tracking.uri, settings.request_timeout_s)
        found[:] = [experiment_id(mlflow, tracking.experiment, tracking.uri)]
        return record_execution(
            mlflow,
            tracking.uri,
            tracking.experiment,
            tracking.execution,
            tracking.run_id,
            store,
            model,
            config_dict,
            name=name,
            files=files,
        )

    try:
        run_id = with_retry(attempt, tracking.uri, settings.retry_s)
    except Exception as e:  # MLflow never fails the pipeline; the store has everything
        _warn(
            f"MLflow at {where(tracking.uri)} did not record execution {tracking.execution} ({describe(e)}); "
            f"the store has everything: `pretrain tracking sync {model.name}:{model.version}` replays it"
        )
        return "", ""
    folded = tracking.run_id and run_id != tracking.run_id  # the run this execution opened was folded into it
    again = f" (an earlier execution's run: {model.name}:{model.version} again)" if folded else ""
    opener = run_opener(tracking.uri, found[0], run_id)
    print(
        f"tracking: execution {tracking.execution} recorded as MLflow run {run_id}{again} at {where(tracking.uri)}; "
        f"{model.name}:{model.version} mirrored to its registered models; open it: {opener}"
    )
    return run_id, "" if opener == open_command(run_id) else opener


@task(**registry_task())
def fail_tracking(config: PipelineConfig, err: FlyteError | None = None) -> None:
    """The workflow's failure handler (``on_failure``): end this execution's MLflow run FAILED, with the
    task that failed and its error as tags. One attempt; MLflow unreachable or no run: one WARNING line.
    It never raises: the workflow's own error is what the person must see."""
    stage_log.end()  # no summary will read it
    ref, _local.ref = getattr(_local, "ref", None), None
    settings = config.tracking
    if not settings.enabled:
        return
    execution = flyte_execution_id()
    if execution == "local" and ref is None:
        return  # failed before start_tracking: there is no run to end
    if ref is None:
        ref = TrackingRef(uri=resolve_uri(settings.uri), experiment=settings.experiment, execution=execution)
    # Flyte's failed node names the task on a cluster; a local execution gives the failure node's own id.
    node = err.failed_node_id if err and execution != "local" else ""
    task_name, error = failure(err.message if err else "", node)
    try:
        mlflow = client(ref.uri, settings.request_timeout_s)
        run_id = ref.run_id or find_run(mlflow, experiment_id(mlflow, ref.experiment, ref.uri), {EXECUTION_TAG: ref.execution})
        if not run_id:
            _warn(f"execution {ref.execution} failed at {task_name} and has no MLflow run at {where(ref.uri)} to mark")
            return
        mark_failed(mlflow, run_id, task_name, error)
    except Exception as e:  # MLflow never fails the pipeline, nor hides its error
        _warn(f"MLflow at {where(ref.uri)} did not take execution {ref.execution}'s failure ({describe(e)})")
        return
    print(f"tracking: execution {ref.execution} failed at {task_name}: MLflow run {run_id} marked FAILED", file=sys.stderr)
