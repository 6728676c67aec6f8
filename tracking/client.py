"""The MLflow side: a client with short timeouts, the run of one execution, and step records as metrics.

MLflow is imported here, lazily (``client``): the CLI imports ``tracking`` without paying for it,
and an image without MLflow loses tracking (a warning), never the pipeline.

One point per step, whichever path delivers it: a step record becomes metrics stamped with a
timestamp derived from the record alone (``timestamp_ms``), so the live sender of the train task
and the replay of ``metrics.jsonl`` by the last task send identical points, and MLflow's SQL store
keeps one of identical (key, step, timestamp, value) points (``SqlAlchemyStore._log_metrics``).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from common.errors import peel_flyte
from common.redact import redact
from tracking.params import batches, flatten
from tracking.uri import artifact_root, is_remote, prepare_database, sqlite_path

TRAIN_LOSS = "loss/train"
HELDOUT_LOSS = "loss/heldout"
"""The training loss and the held-out loss measured every ``train.val_every`` steps, as MLflow metrics: MLflow 3's
UI files a run's charts in sections by the name's part before its last ``/``, so both sit in the section ``loss``."""
STEP_KEYS = (
    "loss", "heldout_loss", "val_loss", "grad_norm", "lr", "tokens_per_s", "mfu", "step_time_s", "peak_memory_mib",
    "data_wait_fraction",
)  # fmt: skip
"""The per-step figures of a metrics.jsonl record that become MLflow metrics, with the step-time breakdown."""
STEP_NAMES = {"loss": TRAIN_LOSS, "heldout_loss": HELDOUT_LOSS, "val_loss": HELDOUT_LOSS}
"""Record keys logged under another metric name. A record's ``val_loss`` is the held-out loss of a record written
before it was named ``heldout_loss`` (a run of before, replayed): the same metric. The evaluation's ``val_loss`` of
the final checkpoint (more rows; the gate's figure) is a card figure and keeps its name (``figure_metrics``)."""
BREAKDOWN = re.compile(r"time_\w+_s")
"""The step-time breakdown's keys (``training.observe.timing.phase_key``; matched here so as not to import torch)."""
MAX_METRICS_PER_BATCH = 1000
"""MLflow's limit on metrics in one log_batch request."""
EXECUTION_TAG = "pretrain.execution"
MODEL_TAG = "pretrain.model"
STORE_TAG = "pretrain.store"
REEXECUTIONS_TAG = "pretrain.reexecutions"
"""On a run: the executions that gave its very model again, every task a cache hit (their ids, the latest last)."""
FAILED_TASK_TAG = "pretrain.failed_task"
ERROR_TAG = "pretrain.error"
"""On a failed run: the error as the CLI prints it, in one line (credentials left out, at most MAX_ERROR_CHARS)."""
MAX_ERROR_CHARS = 500
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
CLASSIC_ML = "custom_model_development"
"""MLflow 3's UI opens an experiment in the view its kind names; without the tag it guesses, and an experiment
of training runs may open on the GenAI view (traces). This value is its "Machine learning" view: the runs."""
EVALUATION_FIGURES = frozenset({"val_loss", "perplexity", "bits_per_byte", "val_tokens"})
"""Card figures logged under their own names (with ``lm_eval.*``); the training summary's go under ``summary.``."""
SUMMARY_PREFIX = "summary."
SUMMARY_NAMES = {"tokens_per_second": "tokens_per_s"}
"""A summary figure named as its per-step metric is: ``summary.tokens_per_s`` beside ``tokens_per_s``."""
FIGURE_STEP = 0
"""The MLflow step of a card's figures (one value each, logged once at the end): MLflow's run page draws a metric
whose latest step is 0 as a bar with its value, where a figure at the last step was a line chart of one point."""
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


RUNS_VIEW_ID = "pretrain-v1"
"""Our saved view of an experiment's runs (its id in the page's address, ``viewStateShareKey``); a new version of
the view gets a new id, so a view someone edited in the UI is never overwritten."""
RUNS_VIEW_TAG = f"mlflow.sharedViewState.{RUNS_VIEW_ID}"
"""Where MLflow 3's UI keeps an experiment's saved views of its runs page: an experiment tag per view."""
RUNS_VIEW_NAME = "pretrain: losses and figures"
RUNS_COLUMNS = (TRAIN_LOSS, "val_loss", "bits_per_byte", "tokens_per_s")
"""The metric columns of our saved view's runs table (MLflow's default view shows no metric at all)."""
RUNS_VIEW_CREATED_MS = 1_767_225_600_000
"""The view's creation time as the UI shows it (fixed: the tag's value is the same from any process)."""
_LOSS_SECTION, _MODEL_SECTION, _SYSTEM_SECTION = "pretrain-loss", "pretrain-model-metrics", "pretrain-system-metrics"


def runs_view() -> str:
    """The value of ``RUNS_VIEW_TAG``: a saved view as MLflow 3.17's UI writes one (an envelope ``{name,
    createdAt, updatedAt, state}``, ``state`` the page's state as JSON): the runs table with ``RUNS_COLUMNS``,
    and in the chart view the training and held-out loss on one chart. The UI adds a chart for every other
    metric itself (``updateChartAndSectionConfigs``), in the section its name's prefix names."""
    both = {  # the fields of MLflow's line chart card (RunsChartsLineCardConfig), as its UI saves one
        "uuid": "pretrain-loss-train-heldout", "type": "LINE", "runsCountToCompare": 10,
        "metricSectionId": _LOSS_SECTION, "deleted": False, "isGenerated": False,
        "displayName": "loss: train and held-out", "metricKey": TRAIN_LOSS, "selectedMetricKeys": [TRAIN_LOSS, HELDOUT_LOSS],
        "lineSmoothness": 0, "xAxisScaleType": "linear", "scaleType": "linear", "range": {}, "xAxisKey": "step",
        "selectedXAxisMetricKey": "", "yAxisKey": "metric", "yAxisExpressions": [], "ignoreOutliers": False,
        "useGlobalXaxisKey": True, "useGlobalLineSmoothing": True,
    }  # fmt: skip
    # The held-out loss's own chart, made and deleted: the UI adds a chart for a metric no card names.
    heldout = {key: value for key, value in both.items() if key != "selectedMetricKeys"}
    heldout |= {"uuid": "pretrain-loss-heldout", "isGenerated": True, "deleted": True, "metricKey": HELDOUT_LOSS}
    heldout["displayName"] = "heldout"
    sections = [
        {"uuid": uuid, "name": name, "display": True, "isReordered": False, "deleted": False, "isGenerated": True}
        for uuid, name in ((_LOSS_SECTION, "loss"), (_MODEL_SECTION, "Model metrics"), (_SYSTEM_SECTION, "System metrics"))
    ]  # the UI's own two sections too: a section it adds while ordering them by name would be dropped
    state = {
        "selectedColumns": [f"metrics.`{name}`" for name in RUNS_COLUMNS],
        "compareRunCharts": [both, heldout],
        "compareRunSections": sections,
        "isAccordionReordered": False,
    }
    envelope = {"name": RUNS_VIEW_NAME, "createdAt": RUNS_VIEW_CREATED_MS, "updatedAt": RUNS_VIEW_CREATED_MS}
    return json.dumps({**envelope, "state": json.dumps(state, separators=(",", ":"))}, separators=(",", ":"))


def missing_experiment_tags(tags: Mapping[str, str] | None) -> dict[str, str]:
    """The tags an experiment of ours lacks (a kind or a view a person changed is kept): its kind, the runs
    of model training (``CLASSIC_ML``), and our saved view of its runs (``runs_view``)."""
    wanted = {EXPERIMENT_KIND_TAG: CLASSIC_ML, RUNS_VIEW_TAG: runs_view()}
    return {key: value for key, value in wanted.items() if key not in (tags or {})}


def experiment_id(mlflow, name: str, uri: str) -> str:
    """The id of experiment ``name``, created if absent (artifacts beside a SQLite database), with the tags
    ``missing_experiment_tags`` names (set on an existing one made before we set them)."""
    found = mlflow.get_experiment_by_name(name)
    if found is None:
        try:
            return mlflow.create_experiment(name, artifact_location=artifact_root(uri) or None, tags=missing_experiment_tags({}))
        except Exception:
            found = mlflow.get_experiment_by_name(name)  # another execution created it meanwhile
            if found is None:
                raise
    for key, value in missing_experiment_tags(found.tags).items():
        mlflow.set_experiment_tag(found.experiment_id, key, value)
    return found.experiment_id


UI_VIEW = "workflowType=machine_learning"
"""MLflow 3's UI opens on its GenAI view (traces, evaluations, an assistant) unless the page's address asks
for the model-training one (its ``workflowType`` query; the choice is then remembered by the browser)."""


def ui_path(experiment: str, run_id: str = "", view: str = "") -> str:
    """The MLflow UI's page (the part after the server's address) of experiment ``experiment``'s runs, or
    of the run ``run_id`` in it, in the model-training view: ``#/experiments/1/runs/<run id>?workflowType=…``;
    ``view``: the runs page opens on that saved view (``RUNS_VIEW_ID``)."""
    page = f"#/experiments/{experiment}/runs"
    if run_id:
        return f"{page}/{run_id}?{UI_VIEW}"
    return f"{page}?viewStateShareKey={view}&{UI_VIEW}" if view else f"{page}?{UI_VIEW}"


def open_command(run_id: str = "") -> str:
    """The command that opens the MLflow UI of this machine's database, on the run ``run_id``'s page (``pretrain ui``
    starts the server and prints a link that signs a browser in and opens the page)."""
    return f"pretrain ui --run {run_id}" if run_id else "pretrain ui"


def run_opener(uri: str, experiment: str, run_id: str) -> str:
    """What to print to open the run ``run_id`` (of the experiment with id ``experiment``) tracked at ``uri``: never a
    bare ``#/experiments/…`` (it opens nothing). A tracking server's page of the run, its whole address without
    credentials (the browser signs in as the server asks); a Databricks workspace's run, by id; else
    ``open_command``, as a database on this machine has no server until ``pretrain ui`` starts one."""
    if uri.startswith(("http://", "https://")):
        parts = urlsplit(uri)
        host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname or ""
        address = f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}{parts.path.rstrip('/')}"
        return f"{address}/{ui_path(experiment, run_id)}"
    if is_remote(uri):
        return f"run {run_id} in the MLflow UI of {redact(uri)}"
    return open_command(run_id)


def fresh_execution_id(execution: str) -> str:
    """Flyte's execution id, or for a local execution (``local``) a new unique one."""
    if execution and execution != "local":
        return execution
    return f"local-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"


def _quoted(value: str) -> str | None:
    """``value`` as a string in MLflow's filter syntax; None when it holds both quote characters."""
    if "'" not in value:
        return f"'{value}'"
    return f'"{value}"' if '"' not in value else None


def find_run(mlflow, exp_id: str, tags: Mapping[str, str], oldest: bool = False) -> str:
    """The id of the newest (``oldest``: the first) active run of the experiment holding every tag of
    ``tags``, or ''. Compared again here: a value MLflow's filter cannot quote is matched only here."""
    clauses = [f"tags.`{key}` = {_quoted(value)}" for key, value in tags.items() if _quoted(value) is not None]
    order = ["start_time ASC" if oldest else "start_time DESC"]
    runs = mlflow.search_runs([exp_id], filter_string=" and ".join(clauses), max_results=50, order_by=order)
    found = [run for run in runs if all(run.data.tags.get(key) == value for key, value in tags.items())]
    return found[0].info.run_id if found else ""


def start_run(mlflow, exp_id: str, execution: str, params: Mapping[str, Any], tags: Mapping[str, str], name: str = "") -> str:
    """The run of ``execution`` (found by its tag, so a retried task does not make a twin), named ``name``
    (else the execution id), with the flattened config as params and ``tags``."""
    run_id = find_run(mlflow, exp_id, {EXECUTION_TAG: execution})
    if not run_id:
        run_id = mlflow.create_run(exp_id, run_name=name or execution, tags={EXECUTION_TAG: execution, **tags}).info.run_id
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
    """(key, value, timestamp ms, step) of each per-step figure a metrics.jsonl record holds (``STEP_NAMES``
    names some); one point per name and step: a record with both held-out keys gives ``heldout_loss``'s."""
    step = int(record["step"])
    keys = [*STEP_KEYS, *sorted(k for k in record if BREAKDOWN.fullmatch(k))]
    out: dict[str, tuple[str, float, int, int]] = {}
    for key in keys:
        value = _number(record.get(key))
        name = STEP_NAMES.get(key, key)
        if value is not None and name not in out:
            out[name] = (name, value, timestamp_ms(step), step)
    return list(out.values())


def figure_name(key: str) -> str:
    """The metric name of a card figure: an evaluation figure's own (``val_loss``, a mixture component's
    ``val_loss.<component>``, ``lm_eval.<task>.<metric>``),
    a training summary figure's under ``summary.`` (``summary.mfu``): under the per-step name it would be one
    more point among that metric's steps (the run's mean MFU among the steps' MFU)."""
    if key in EVALUATION_FIGURES or key.partition(".")[0] in EVALUATION_FIGURES or key.startswith("lm_eval."):
        return metric_name(key)
    return metric_name(SUMMARY_PREFIX + SUMMARY_NAMES.get(key, key))


def figure_metrics(figures: Mapping[str, Any], step: int) -> list[tuple[str, float, int, int]]:
    """(name, value, timestamp ms, step) of each numeric figure of a card (``figure_name``): metrics, so that the
    run's Overview lists them and the runs table can show and sort them, at step ``FIGURE_STEP`` (shown as a
    value, not as a line of one point), stamped at the run's last step ``step``."""
    numbers = {figure_name(k): _number(v) for k, v in sorted(figures.items())}
    return [(k, v, timestamp_ms(step), FIGURE_STEP) for k, v in numbers.items() if v is not None]


def goodput_metrics(goodput: Mapping[str, Any] | None, step: int) -> list[tuple[str, float, int, int]]:
    """(name, value, timestamp ms, step) of a run's goodput (``runs.ledger.Goodput.to_dict()``; None: no
    ledger, no points) at the run's last step: ``goodput`` (the productive fraction of the wall time),
    ``goodput_wall_s``, ``goodput_<part>_s`` for each part of it and ``goodput_skew_s`` (the clock skew found
    between the attempts' hosts, left out of the wall time)."""
    if not goodput:
        return []
    figures = {"goodput": goodput.get("fraction"), "goodput_wall_s": goodput.get("wall_s")}
    figures["goodput_skew_s"] = goodput.get("skew_s", 0.0)
    figures |= {f"goodput_{part}_s": seconds for part, seconds in (goodput.get("parts") or {}).items()}
    numbers = {metric_name(k): _number(v) for k, v in figures.items()}
    return [(k, v, timestamp_ms(step), step) for k, v in numbers.items() if v is not None and math.isfinite(v)]


def log_points(mlflow, run_id: str, points: Iterable[tuple[str, float, int, int]]) -> int:
    """Send ``points`` in batches MLflow accepts; identical points already there are kept once. Returns the count."""
    from mlflow.entities import Metric

    metrics = [Metric(key, value, ts, step) for key, value, ts, step in points]
    for start in range(0, len(metrics), MAX_METRICS_PER_BATCH):
        mlflow.log_batch(run_id, metrics=metrics[start : start + MAX_METRICS_PER_BATCH])
    return len(metrics)


def log_files(mlflow, run_id: str, files: Mapping[str, bytes]) -> None:
    """Upload ``files`` (artifact path → bytes) as the run's artifacts, in one request; an existing one is replaced."""
    if not files:
        return
    with tempfile.TemporaryDirectory(prefix="pretrain-artifacts-") as folder:
        for name, data in files.items():
            path = Path(folder, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        mlflow.log_artifacts(run_id, folder)


def failure(message: str, node: str = "") -> tuple[str, str]:
    """(the workflow's task that failed, the error in one line) from a Flyte failure ``message``: Flyte opens it
    with one preamble per level (the workflow's task, then the stage of a dynamic one); the line names the
    innermost task, as ``pretrain run`` prints it. ``node`` (Flyte's failed node id) stands in for an unnamed task."""
    tasks, text = peel_flyte(message.strip())
    line = redact(" ".join(text.split()))
    if tasks:
        line = f"{tasks[-1]}: {line}"
    if len(line) > MAX_ERROR_CHARS:
        line = line[: MAX_ERROR_CHARS - 1] + "…"
    return (tasks[0] if tasks else node or "unknown"), line


def mark_failed(mlflow, run_id: str, task: str, error: str) -> None:
    """End the run FAILED, with the task that failed and the error as tags."""
    set_tags(mlflow, run_id, {FAILED_TASK_TAG: task, ERROR_TAG: error})
    mlflow.set_terminated(run_id, "FAILED")


def where(uri: str) -> str:
    """``uri`` as a warning names it: a server's address (credentials left out), or a database's path."""
    return redact(uri) if is_remote(uri) else str(sqlite_path(uri) or redact(uri))
