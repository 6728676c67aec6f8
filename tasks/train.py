"""Distributed training: an Elastic task (a PyTorchJob on a cluster when nnodes ≥ 2)."""

from __future__ import annotations

import warnings

from flytekit import Resources, task
from flytekitplugins.kfpytorch import Elastic

from data_prep.prepare import DatasetRef
from tasks.caching import cache_version
from training.config import ModelConfig, ParallelConfig, TrainConfig
from training.train import CheckpointRef, train

VERSION = cache_version(__name__, "training", "data_prep", "storage", "pipeline.versioning")


@task(
    task_config=Elastic(nnodes=1, nproc_per_node=2, increase_shared_mem=False),
    shared_memory=True,  # /dev/shm for the ranks' collectives and loader workers
    cache=True,
    cache_version=VERSION,
    retries=1,
    requests=Resources(cpu="2", mem="4Gi"),
)
def train_model(dataset: DatasetRef, model: ModelConfig, parallel: ParallelConfig, train_cfg: TrainConfig) -> CheckpointRef:
    """Train the GPT on every rank; a retry resumes from the run's latest committed checkpoint."""
    warnings.filterwarnings("ignore", category=UserWarning, module="megatron")
    return train(dataset, model, parallel, train_cfg)
