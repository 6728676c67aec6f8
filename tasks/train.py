"""Distributed training: an Elastic task; a Kubeflow PyTorchJob when the profile has nnodes ≥ 2.

Its error names the rank that failed first and that rank's own error (``tasks.elastic``)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flytekit import Cache, Deck, task
from flytekitplugins.kfpytorch import RunPolicy

from common.contracts import CheckpointRef, DatasetRef, TrackingRef
from common.stages import mark_stage
from reports.charts import run_charts
from reports.run_html import run_sections
from runs.reading import load_run
from storage import open_store
from tasks import decks
from tasks.caching import cache_version
from tasks.elastic import FirstFailureElastic
from tasks.placement import CLUSTER, plan_task, train_task
from tasks.user_errors import as_messages
from tracking.config import TrackingConfig
from tracking.feed import FEED_ENV, FeedWriter, relay
from tracking.sender import LiveSender
from training.config import ModelConfig, ParallelConfig, TrainConfig
from training.cooldown import plan_steps

VERSION = cache_version(__name__)
RECOVERY = ("max_restarts", "keep_local_checkpoints", "local_checkpoint_every")
"""Train settings that say how a failure is recovered, not what is trained: inputs of the train task of their
own (``train_model``), outside its cache key (a retry with more restarts finds its cached result)."""


@task(**plan_task())
@as_messages
def plan_training(store: str, train_cfg: TrainConfig, seq_len: int) -> TrainConfig:
    """The train section with the steps it trains: a ``tokens`` budget converted with the global batch and
    ``seq_len``, a WSD cooldown pinned to its run's checkpoint (``RUN@STEP``) and checked before any data work.

    How a failure is recovered (``RECOVERY``) is left at its defaults here: the train task gets those settings as
    inputs of their own, outside its cache key. Not cached: a cooldown from a run's latest checkpoint names
    whichever is latest now.
    """
    defaults = {name: getattr(TrainConfig, name) for name in RECOVERY}
    return dataclasses.replace(plan_steps(open_store(store), train_cfg, seq_len), **defaults)


@contextmanager
def live_feed(inputs: dict[str, Any]) -> Iterator[None]:
    """The launcher's side of rank 0's step records to the execution's MLflow run (``tracking.feed``)."""
    tracking: TrackingRef = inputs["tracking"]
    if not tracking.run_id:
        yield
        return
    settings: TrackingConfig = inputs["tracking_cfg"]
    with relay(tracking.uri, tracking.run_id, settings.request_timeout_s, settings.flush_s) as path:
        os.environ[FEED_ENV] = path
        try:
            yield
        finally:
            del os.environ[FEED_ENV]


@task(
    task_config=FirstFailureElastic(
        nnodes=CLUSTER.nnodes,
        nproc_per_node=CLUSTER.nproc_per_node,
        increase_shared_mem=False,
        around_launch=live_feed,
        max_restarts=TrainConfig.max_restarts,  # the PyTorchJob's; each launch takes the input's (restarts_input)
        restarts_input="max_restarts",
        run_policy=RunPolicy(backoff_limit=TrainConfig.max_restarts),
    ),
    # The MLflow run is this execution's view, and the recovery settings how a failure is met, not inputs of
    # training: a rerun hits the cache.
    cache=Cache(version=VERSION, serialize=True, ignored_inputs=("tracking", "tracking_cfg", *RECOVERY)),
    enable_deck=True,
    deck_fields=decks.FIELDS,
    **train_task(),
)
@as_messages
def train_model(
    dataset: DatasetRef,
    model: ModelConfig,
    parallel: ParallelConfig,
    train_cfg: TrainConfig,
    base_model: str,
    tracking: TrackingRef,
    tracking_cfg: TrackingConfig,
    max_restarts: int = TrainConfig.max_restarts,
    keep_local_checkpoints: int = TrainConfig.keep_local_checkpoints,
    local_checkpoint_every: int = TrainConfig.local_checkpoint_every,
) -> CheckpointRef:
    """Train the GPT on every rank; a retry resumes from the run's latest committed checkpoint, and so does a
    restart of the ranks inside the task (up to ``max_restarts``, ``training.restarts``).
    Rank 0 streams each step's record to the execution's MLflow run, if it has one (never waiting on it):
    through the launcher's feed (``live_feed``), or itself where no launcher relays."""
    if os.environ.get("RANK", "0") == "0":  # one line per event: rank 0's (the steps' own markers are training's)
        mark_stage("train")
    sender: FeedWriter | LiveSender | None = None
    if tracking.run_id and os.environ.get("RANK", "0") == "0":
        feed = os.environ.get(FEED_ENV)
        timeouts = (tracking_cfg.request_timeout_s, tracking_cfg.flush_s)
        sender = FeedWriter(feed) if feed else LiveSender(tracking.uri, tracking.run_id, *timeouts)
    from training.train import train  # here, not at the top: only ranks train (megatron-core is 3 s of imports)

    train_cfg = dataclasses.replace(
        train_cfg,
        max_restarts=max_restarts,
        keep_local_checkpoints=keep_local_checkpoints,
        local_checkpoint_every=local_checkpoint_every,
    )
    try:
        on_record = sender.send if sender else None
        ref = train(dataset, model, parallel, train_cfg, base_model, on_record=on_record, name=tracking.run_name)
    finally:
        if sender is not None:
            sender.close()  # bounded; what is left is replayed by the last task
    if os.environ.get("RANK", "0") == "0":  # the launcher keeps rank 0's Decks only
        # From the run's files: the loss with its committed evaluations, every rank's step times.
        view = load_run(open_store(ref.store), ref.run.removeprefix("runs/"))
        for title, html in run_sections(view, run_charts(view)).items():
            Deck(title, html)
    return ref
