"""Distributed training: an Elastic task (a PyTorchJob on a cluster when nnodes ≥ 2)."""

from __future__ import annotations

import warnings

from flytekit import Resources, task

with warnings.catch_warnings():  # the plugin warns about a default we do not use
    warnings.simplefilter("ignore", UserWarning)
    from flytekitplugins.kfpytorch import Elastic

from data_prep.prepare import DatasetRef
from tasks.caching import cache_version
from training.config import ModelConfig, ParallelConfig, TrainConfig
from training.train import CheckpointRef, train

VERSION = cache_version(__name__, "training", "data_prep", "storage")


@task(
    task_config=Elastic(nnodes=1, nproc_per_node=2),
    cache=True,
    cache_version=VERSION,
    retries=1,
    requests=Resources(cpu="2", mem="4Gi"),
)
def train_model(dataset: DatasetRef, model: ModelConfig, parallel: ParallelConfig, train_cfg: TrainConfig) -> CheckpointRef:
    """Train the GPT on every rank; a retry resumes from the run's latest committed checkpoint."""
    warnings.filterwarnings("ignore", category=UserWarning, module="megatron")
    return train(dataset, model, parallel, train_cfg)
