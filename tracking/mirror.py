"""The reconciliation: a registered model's execution made whole in MLflow from the store, and the
registry mirrored as MLflow registered models. Idempotent: run it again, after an outage or from
``pretrain tracking sync``, and MLflow ends up the same (the store is the source of truth).

What one execution's MLflow run gets (``record_execution``):

* its name: the model name and the settings that differ from the defaults (``tracking.params.run_name``);
* params: the flattened pipeline config (``tracking.params``);
* tags: Flyte execution id, store, run prefix, dataset version, tokenizer sha256, code commit, model;
* metrics: every record of the run's metrics.jsonl with its step (one point per step, see
  ``tracking.client``; the training and held-out losses as ``loss/train`` and ``loss/heldout``, one section of
  MLflow's charts), and the card's numeric figures once, at step 0 (a value each, not a chart of one point): the
  evaluation's under their own names (val_loss, perplexity, bits_per_byte, lm-eval results), the training
  summary's under ``summary.`` (``tracking.client.figure_name``), and the run's goodput ledger at the last step
  (``goodput``, the productive fraction of its wall time, ``goodput_<part>_s`` per ``runs.ledger.PARTS`` and
  ``goodput_skew_s``);
* small artifacts: ``links/store.json``, the store keys and URLs of the checkpoint, the evaluation
  outputs, the Hugging Face export, the registry entry and its card (links, never copies of
  checkpoints), and what the caller renders (the loss chart, the validation report: ``tasks.track``).

An execution that only gave an already recorded model again (every task a cache hit) gets no run of its
own: the run that recorded that model is tagged with its execution id (``pretrain.reexecutions``) and
the run the execution opened is deleted.

The registry mirror (``mirror_version``, ``mirror_aliases``): the version appears as a version of the
MLflow registered model of the same name, found by its ``pretrain.version`` tag (MLflow numbers its
versions itself), with lineage tags (store keys) and the card's key; MLflow's aliases are set, moved and
removed to match the registry's.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from common.contracts import HF_EXPORT, ModelCard, ModelRef, card_key, metrics_key, model_prefix
from common.run_names import run_name
from registry.card import is_url, location_url, read_card
from registry.registry import list_models
from runs.ledger import load_goodput
from storage import Store
from tracking.client import (
    EXECUTION_TAG,
    MODEL_TAG,
    REEXECUTIONS_TAG,
    STORE_TAG,
    VERSION_TAG,
    TrackingUnavailable,
    client,
    describe,
    experiment_id,
    figure_metrics,
    find_run,
    fresh_execution_id,
    goodput_metrics,
    log_files,
    log_points,
    set_tags,
    start_run,
    step_metrics,
    where,
)
from tracking.uri import sqlite_path

LINKS_ARTIFACT = "links/store.json"
RESERVED_LATEST = "latest-registered"
"""MLflow's name for our ``latest`` alias (it reserves ``latest``)."""
ALIASES_TAG = "pretrain.aliases"
"""On a mirrored version: our aliases of it, exactly as the registry spells them (comma-separated)."""
MODEL_DESCRIPTION = "Mirror of the pretrain registry (the store is the source of truth)."


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


MAX_REEXECUTIONS = 50
"""Execution ids ``pretrain.reexecutions`` keeps (the latest); ``pretrain.reexecution_count`` counts them all."""
REEXECUTION_COUNT_TAG = "pretrain.reexecution_count"


def model_tags(store: Store, model: ModelRef) -> dict[str, str]:
    """The tags that find the run recording ``model``: its name and version in this store (two stores
    mirrored to one server each have their own ``gpt-tiny:1``)."""
    return {MODEL_TAG: f"{model.name}:{model.version}", STORE_TAG: store.uri}


def lineage_tags(store: Store, model: ModelRef, card: ModelCard) -> dict[str, str]:
    """The tags that say where an execution's model came from (keys in the store ``pretrain.store`` names)."""
    return {
        "pretrain.run_prefix": card.lineage.training_run,
        "pretrain.dataset_version": card.lineage.dataset_version,
        "pretrain.tokenizer_sha256": card.lineage.tokenizer_sha256,
        "pretrain.code_commit": card.code.commit,
        "pretrain.code_dirty": str(card.code.dirty).lower(),
        "pretrain.base_model": card.lineage.base_model or "(from scratch)",
        **model_tags(store, model),
    }


def links(store: Store, model: ModelRef, card: ModelCard) -> dict[str, Any]:
    """Where what the execution produced is (the artifact of its run): each place's key in the store
    (what still holds once the store is copied or moved) and its URL there now."""
    lineage = card.lineage
    places = {
        "training_run": lineage.training_run,
        "metrics": metrics_key(lineage.training_run),
        "checkpoint": lineage.checkpoint,
        "evaluation": lineage.evaluation,
        "dataset": lineage.dataset,
        "dataset_manifest": lineage.dataset_manifest,
        "registry_entry": model.prefix,
        "card": card_key(model.prefix),
    }
    if card.hf_export:
        places["hf_export"] = f"{model.prefix}/{card.hf_export}"
    elif lineage.evaluation:
        places["hf_export"] = f"{lineage.evaluation.rstrip('/')}/{HF_EXPORT}"
    out: dict[str, Any] = {"store": store.uri}
    for name, place in places.items():
        if place:  # a place in another store (a URL) has no key in this one
            out[name] = {"key": "" if is_url(place) else place, "url": location_url(store, place)}
    return out


def fold_reexecution(mlflow, owner: str, duplicate: str, execution: str) -> str:
    """Record ``execution``, which gave the model of run ``owner`` again, on that run; delete ``duplicate``,
    the run the execution opened (it holds nothing the owner lacks). Returns the owner's execution id."""
    tags = mlflow.get_run(owner).data.tags
    ids = [i for i in tags.get(REEXECUTIONS_TAG, "").split(",") if i]
    if execution not in ids:  # a replay of the same execution counts once
        count = int(tags.get(REEXECUTION_COUNT_TAG, len(ids))) + 1
        ids = [*ids, execution][-MAX_REEXECUTIONS:]
        set_tags(mlflow, owner, {REEXECUTIONS_TAG: ",".join(ids), REEXECUTION_COUNT_TAG: str(count)})
    if duplicate and mlflow.get_run(duplicate).info.lifecycle_stage == "active":  # a replay finds it deleted
        set_tags(mlflow, duplicate, {"pretrain.reexecution_of": owner})  # seen among deleted runs: why
        mlflow.set_terminated(duplicate, "FINISHED")
        mlflow.delete_run(duplicate)
    return tags.get(EXECUTION_TAG, execution)


def record_execution(
    mlflow,
    uri: str,
    experiment: str,
    execution: str,
    run_id: str,
    store: Store,
    model: ModelRef,
    config: dict[str, Any],
    name: str = "",
    files: Mapping[str, bytes] | None = None,
) -> str:
    """Make the MLflow run of ``execution`` hold everything the store has of it (see the module doc),
    creating the run if ``run_id`` is '' (found by its execution tag first, else named ``name``), plus the
    artifacts ``files`` (path → bytes); then mirror the registry. When an earlier run already records
    ``model`` (this execution was all cache hits), that run is the one made whole and tagged with this
    execution, and ``run_id`` is deleted. Returns the run id."""
    card = read_card(store, model.prefix)
    tags = lineage_tags(store, model, card)
    exp = experiment_id(mlflow, experiment, uri)
    owner = find_run(mlflow, exp, model_tags(store, model), oldest=True)
    if owner and owner != run_id:
        execution = fold_reexecution(mlflow, owner, run_id, execution)
        run_id = owner
    elif not run_id:
        run_id = start_run(mlflow, exp, execution, config, {STORE_TAG: store.uri}, name=name)
    set_tags(mlflow, run_id, {EXECUTION_TAG: execution, STORE_TAG: store.uri, **tags})
    run = card.lineage.training_run
    records = [line for line in store.get_bytes(metrics_key(run), "log").decode().splitlines() if line.strip()]
    points = [p for line in records for p in step_metrics(json.loads(line))]
    points += figure_metrics(card.metrics, card.lineage.training_steps)
    goodput = load_goodput(store, run)
    points += goodput_metrics(goodput.to_dict() if goodput is not None else None, card.lineage.training_steps)
    log_points(mlflow, run_id, points)
    mlflow.log_dict(run_id, links(store, model, card), LINKS_ARTIFACT)
    log_files(mlflow, run_id, files or {})
    mirror_version(mlflow, store, model, card, run_id)
    mirror_aliases(mlflow, store, model.name)
    mlflow.set_terminated(run_id, "FINISHED")
    return run_id


def _missing(error: Exception) -> bool:
    return getattr(error, "error_code", "") == "RESOURCE_DOES_NOT_EXIST"


def _versions(mlflow, name: str) -> dict[int, Any]:
    """Our version number → the MLflow model version mirroring it, for the registered model ``name``."""
    out: dict[int, Any] = {}
    for mv in sorted(mlflow.search_model_versions(f"name = '{name}'"), key=lambda mv: int(mv.version)):
        ours = (mv.tags or {}).get(VERSION_TAG, "")
        if ours.isdigit():
            out.setdefault(int(ours), mv)
    return out


def mirrored_versions(mlflow, name: str) -> dict[int, str]:
    """Our version number → the MLflow version number mirroring it."""
    return {ours: str(mv.version) for ours, mv in _versions(mlflow, name).items()}


def mlflow_alias(alias: str) -> str:
    """Our alias as MLflow can hold it: MLflow reserves ``latest`` (its own highest version: ours is
    ``latest-registered`` there) and ``v<digits>``, and allows no '.' (``_`` instead)."""
    if alias.lower() == "latest":
        return RESERVED_LATEST
    alias = alias.replace(".", "_")
    return f"alias-{alias}" if re.fullmatch(r"[vV]\d+", alias) else alias


def mirror_version(mlflow, store: Store, model: ModelRef, card: ModelCard, run_id: str) -> str:
    """The MLflow version mirroring ``model`` (created once, found by its tag afterwards). Its source is
    the run's links folder: MLflow refuses a local path there, and the weights stay in the store."""
    try:
        mlflow.create_registered_model(model.name, tags={STORE_TAG: store.uri}, description=MODEL_DESCRIPTION)
    except Exception as e:
        if getattr(e, "error_code", "") != "RESOURCE_ALREADY_EXISTS":
            raise
    tags = {  # places as keys of the store STORE_TAG names: they still hold in a copy of it
        VERSION_TAG: str(model.version),
        STORE_TAG: store.uri,
        "pretrain.card": card_key(model.prefix),
        "pretrain.entry": model.prefix,
        "pretrain.dataset_version": card.lineage.dataset_version,
        "pretrain.tokenizer_sha256": card.lineage.tokenizer_sha256,
        "pretrain.training_run": card.lineage.training_run,
        "pretrain.checkpoint": card.lineage.checkpoint,
        "pretrain.code_commit": card.code.commit,
        "pretrain.base_model": card.lineage.base_model or "(from scratch)",
        EXECUTION_TAG: card.lineage.flyte_execution_id,
    }
    existing = mirrored_versions(mlflow, model.name).get(model.version)
    if existing is None:
        source = f"runs:/{run_id}/{LINKS_ARTIFACT.rpartition('/')[0]}"
        description = f"{model.name}:{model.version} of the pretrain registry; card: {store.url(card_key(model.prefix))}"
        existing = str(mlflow.create_model_version(model.name, source, run_id=run_id, tags=tags, description=description).version)
    else:
        for key, value in tags.items():
            mlflow.set_model_version_tag(model.name, existing, key, value)
    return existing


def our_aliases(store: Store, name: str) -> dict[str, int]:
    """Every alias of ``name`` in the registry and the version it points at."""
    return {alias: row["version"] for row in list_models(store) if row["name"] == name for alias in row["aliases"]}


def mirror_aliases(mlflow, store: Store, name: str) -> dict[str, str]:
    """Set, move and remove the aliases of MLflow's registered model ``name`` to match the registry's
    (``mlflow_alias`` names them there; an alias on a version MLflow does not mirror is removed), and
    tag each mirrored version with our aliases of it. Returns MLflow's aliases after (alias → version)."""
    try:
        theirs = {alias: str(version) for alias, version in mlflow.get_registered_model(name).aliases.items()}
    except Exception as e:
        if _missing(e):
            return {}  # nothing mirrored yet
        raise
    versions = _versions(mlflow, name)
    ours = our_aliases(store, name)
    wanted = {mlflow_alias(alias): str(versions[v].version) for alias, v in ours.items() if v in versions}
    for alias, version in wanted.items():
        if theirs.get(alias) != version:
            mlflow.set_registered_model_alias(name, alias, version)
    for alias in set(theirs) - set(wanted):
        mlflow.delete_registered_model_alias(name, alias)
    for number, mv in versions.items():
        tag = ",".join(sorted(alias for alias, v in ours.items() if v == number))
        if (mv.tags or {}).get(ALIASES_TAG, "") != tag:
            if tag:
                mlflow.set_model_version_tag(name, mv.version, ALIASES_TAG, tag)
            else:
                mlflow.delete_model_version_tag(name, mv.version, ALIASES_TAG)
    return wanted


def with_retry(action: Callable[[], Any], uri: str, retry_s: float, log: Callable[[str], None] = _log) -> Any:
    """``action()``, tried again with a growing pause until it succeeds or ``retry_s`` has passed
    (then TrackingUnavailable). The first failure is logged as one line."""
    deadline = time.monotonic() + retry_s
    pause = 0.5
    attempt = 0
    while True:
        attempt += 1
        try:
            return action()
        except TrackingUnavailable:
            raise
        except Exception as e:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TrackingUnavailable(f"{describe(e)} ({attempt} attempts over {retry_s:g} s)") from e
            if attempt == 1:
                log(f"tracking: MLflow at {where(uri)} unreachable ({describe(e)}); retrying for up to {retry_s:g} s")
            time.sleep(min(pause, left))
            pause = min(pause * 2, 10.0)


def sync_model(
    store: Store,
    spec_name: str,
    version: int,
    uri: str,
    experiment: str,
    timeout_s: float = 5.0,
    retry_s: float = 60.0,
    defaults: Mapping[str, Any] | None = None,
) -> str:
    """Replay a registered model's execution into MLflow (``pretrain tracking sync``): into the run that
    already mirrors it (by its model and store tags, else its Flyte execution id), or a new one, named by
    the settings that differ from ``defaults`` (the pipeline's; None: by the model). Returns the run id."""
    model = ModelRef(store=store.uri, name=spec_name, version=version, prefix=model_prefix(spec_name, version))
    card = read_card(store, model.prefix)
    name = card.run_name or (
        run_name(card.config, defaults, model.name) if defaults is not None else f"{model.name}:{model.version}"
    )

    def attempt() -> str:
        mlflow = client(uri, timeout_s)
        exp = experiment_id(mlflow, experiment, uri)
        run_id = find_run(mlflow, exp, model_tags(store, model))
        execution = card.lineage.flyte_execution_id
        if not run_id and execution and execution != "local":
            run_id = find_run(mlflow, exp, {EXECUTION_TAG: execution})
        if run_id:
            execution = mlflow.get_run(run_id).data.tags.get(EXECUTION_TAG, execution)
        else:
            execution = fresh_execution_id(execution)
        return record_execution(mlflow, uri, experiment, execution, run_id, store, model, card.config, name=name)

    return with_retry(attempt, uri, retry_s)


def mirror_promotion(store: Store, name: str, uri: str, timeout_s: float = 5.0) -> str:
    """After an alias moved outside the pipeline (``pretrain registry promote``): MLflow's aliases of
    ``name`` made to match, best effort, in one attempt. Returns one line saying what happened."""
    db = sqlite_path(uri)
    if db is not None and not db.exists():
        return f"tracking: no MLflow database at {db}: nothing to mirror"
    try:
        aliases = mirror_aliases(client(uri, timeout_s), store, name)
    except Exception as e:
        return (
            f"WARNING: tracking: MLflow at {where(uri)} did not take the alias move ({describe(e)}); "
            "the next pipeline execution mirrors it"
        )
    moved = ", ".join(f"{alias} -> MLflow version {version}" for alias, version in sorted(aliases.items())) or "none mirrored"
    return f"tracking: MLflow aliases of {name} at {where(uri)}: {moved}"
