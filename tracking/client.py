"""The MLflow side: a client with short timeouts, the run of one execution, and step records as metrics.

MLflow is imported here, lazily (``client``): the CLI imports ``tracking`` without paying for it,
and an image without MLflow loses tracking (a warning), never the pipeline.

One point per step, whichever path delivers it: a step record becomes metrics stamped with a
timestamp derived from the record alone (``timestamp_ms``), so the live sender of the train task
and the replay of ``metrics.jsonl`` by the last task send identical points, and MLflow's SQL store
keeps one of identical (key, step, timestamp, value) points (``SqlAlchemyStore._log_metrics``).
"""

from __future__ import annotations

import math
import os
import re
import secrets
import time
from collections.abc import Iterable, Mapping
from typing import Any

from common.redact import redact
from tracking.params import batches, flatten
from tracking.uri import artifact_root, is_remote, prepare_database, sqlite_path

STEP_KEYS = ("loss", "grad_norm", "lr", "tokens_per_s", "mfu", "step_time_s", "peak_memory_mib", "data_wait_fraction")
"""The per-step figures of a metrics.jsonl record that become MLflow metrics, with the step-time breakdown."""
BREAKDOWN = re.compile(r"time_\w+_s")
"""The step-time breakdown's keys (``training.observe.timing.phase_key``; matched here so as not to import torch)."""
MAX_METRICS_PER_BATCH = 1000
"""MLflow's limit on metrics in one log_batch request."""
EXECUTION_TAG = "pretrain.execution"
MODEL_TAG = "pretrain.model"
VERSION_TAG = "pretrain.version"
"""On a registered-model version: our registry's version number (MLflow numbers its versions itself)."""
STEP_MS = 1000
"""A step's metrics are stamped ``step × STEP_MS`` ms after the epoch: deterministic, see the module doc."""
_UNSAFE = re.compile(r"[^\w\-. /:]")


class TrackingUnavailable(Exception):
    """MLflow cannot be reached (or is not installed): the caller warns, retries or leaves it to the replay."""


def configure_http(timeout_s: float) -> None:
    """Short requests and no retries inside MLflow's client: its defaults retry for minutes, which
    would hold up whoever waits; our callers retry on their own schedule instead."""
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(max(1, math.ceil(timeout_s)))


def client(uri: str, timeout_s: float = 5.0):
    """An ``MlflowClient`` for ``uri``; the folder of a SQLite database is created first."""
    configure_http(timeout_s)
    try:
        from mlflow import MlflowClient
    except ImportError as e:
        raise TrackingUnavailable(f"mlflow is not installed in this image ({e})") from e
    db = sqlite_path(uri)
    if db is not None:
        prepare_database(db)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


_CAUSES = (
    ("NewConnectionError", "connection refused"),
    ("RemoteDisconnected", "connection dropped"),
    ("Connection aborted", "connection dropped"),
    ("timed out", "timed out"),
    ("NameResolutionError", "unknown host"),
)


def describe(error: BaseException) -> str:
    """One short line naming a failed MLflow call: the cause of a network failure in words (MLflow's
    own message repeats the URL and the urllib3 chain), else the error's first 200 characters."""
    text = redact(" ".join(str(error).split()))
    for marker, words in _CAUSES:
        if marker in text:
            return words
    return f"{type(error).__name__}: {text[:200]}"


def experiment_id(mlflow, name: str, uri: str) -> str:
    """The id of experiment ``name``, created if absent (artifacts beside a SQLite database)."""
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return mlflow.create_experiment(name, artifact_location=artifact_root(uri) or None)
    except Exception:
        found = mlflow.get_experiment_by_name(name)  # another execution created it meanwhile
        if found is None:
            raise
        return found.experiment_id


def fresh_execution_id(execution: str) -> str:
    """Flyte's execution id, or for a local execution (``local``) a new unique one."""
    if execution and execution != "local":
        return execution
    return f"local-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"


def find_run(mlflow, exp_id: str, key: str, value: str) -> str:
    """The id of the newest run of the experiment tagged ``key = value``, or ''."""
    runs = mlflow.search_runs([exp_id], filter_string=f"tags.`{key}` = '{value}'", max_results=1, order_by=["start_time DESC"])
    return runs[0].info.run_id if runs else ""


def start_run(mlflow, exp_id: str, execution: str, params: Mapping[str, Any], tags: Mapping[str, str]) -> str:
    """The run of ``execution`` (found by its tag, so a retried task does not make a twin), with the
    flattened config as params and ``tags``."""
    run_id = find_run(mlflow, exp_id, EXECUTION_TAG, execution)
    if not run_id:
        run_id = mlflow.create_run(exp_id, run_name=execution, tags={EXECUTION_TAG: execution, **tags}).info.run_id
    log_params(mlflow, run_id, params)
    set_tags(mlflow, run_id, {EXECUTION_TAG: execution, **tags})
    return run_id


def log_params(mlflow, run_id: str, config: Mapping[str, Any]) -> None:
    from mlflow.entities import Param

    for chunk in batches(flatten(config)):
        mlflow.log_batch(run_id, params=[Param(k, v) for k, v in chunk.items()])


def set_tags(mlflow, run_id: str, tags: Mapping[str, str]) -> None:
    from mlflow.entities import RunTag

    mlflow.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items() if v is not None])


def metric_name(key: str) -> str:
    """``key`` with the characters MLflow refuses in a metric name (e.g. lm-eval's ``acc,none``) as ``_``."""
    return _UNSAFE.sub("_", key)


def timestamp_ms(step: int) -> int:
    return int(step) * STEP_MS


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def step_metrics(record: Mapping[str, Any]) -> list[tuple[str, float, int, int]]:
    """(key, value, timestamp ms, step) of each per-step figure a metrics.jsonl record holds."""
    step = int(record["step"])
    keys = [*STEP_KEYS, *sorted(k for k in record if BREAKDOWN.fullmatch(k))]
    out = []
    for key in keys:
        value = _number(record.get(key))
        if value is not None:
            out.append((key, value, timestamp_ms(step), step))
    return out


def figure_metrics(figures: Mapping[str, Any], step: int) -> list[tuple[str, float, int, int]]:
    """(key, value, timestamp ms, step) of each numeric evaluation figure, at the run's last step."""
    numbers = {metric_name(k): _number(v) for k, v in sorted(figures.items())}
    return [(k, v, timestamp_ms(step), step) for k, v in numbers.items() if v is not None]


def log_points(mlflow, run_id: str, points: Iterable[tuple[str, float, int, int]]) -> int:
    """Send ``points`` in batches MLflow accepts; identical points already there are kept once. Returns the count."""
    from mlflow.entities import Metric

    metrics = [Metric(key, value, ts, step) for key, value, ts, step in points]
    for start in range(0, len(metrics), MAX_METRICS_PER_BATCH):
        mlflow.log_batch(run_id, metrics=metrics[start : start + MAX_METRICS_PER_BATCH])
    return len(metrics)


def where(uri: str) -> str:
    """``uri`` as a warning names it: a server's address (credentials left out), or a database's path."""
    return redact(uri) if is_remote(uri) else str(sqlite_path(uri) or redact(uri))
