"""Where the tasks run: read once, at import (i.e. at registration), from ``$PRETRAIN_CLUSTER``.

Flyte fixes a task's resources, launcher shape and pod template when the task is
registered, not per execution; so they come from a cluster profile, not from the workflow
input. ``PRETRAIN_CLUSTER=configs/cluster/gpu-2x8.yaml pyflyte register …`` registers the
train task as a two-node PyTorchJob; without the variable the local profile applies
(one pod, two CPU ranks), which is what ``pyflyte run`` uses on a laptop.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from common.docfields import documented

CLUSTER_ENV = "PRETRAIN_CLUSTER"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"


@documented
@dataclass
class ClusterConfig:
    """Registration-time placement of the tasks."""

    nnodes: int = 1
    """Training nodes; 2 or more makes the train task a Kubeflow PyTorchJob."""
    nproc_per_node: int = 2
    """Ranks per node (one per GPU on a GPU cluster)."""
    gpus_per_node: int = 0
    """GPUs requested per training pod (0 = CPU training)."""
    train_cpu: str = "2"
    """CPU request of each training pod."""
    train_memory: str = "8Gi"
    """Memory request of each training pod."""
    data_cpu: str = "2"
    """CPU request of the data tasks (tokenization uses every core it gets)."""
    data_memory: str = "4Gi"
    """Memory request of the data tasks."""
    train_timeout_hours: int = 72
    """Wall-clock limit of one train attempt."""
    train_retries: int = 3
    """Attempts after a failure; each resumes from the run's latest committed checkpoint."""
    interruptible: bool = True
    """Allow spot/preemptible nodes: every task is cached or resumes from a checkpoint."""
    queue: str = "pretrain"
    """Kueue LocalQueue the pods are admitted through (defined in infra/)."""
    priority_class: str = "research"
    """Kueue WorkloadPriorityClass: production, research or nightly (defined in infra/)."""
    registry: str = "localhost:30000"
    """Container registry the ImageSpec images are pushed to."""
    data_service_account: str = "pretrain-data"
    """Kubernetes ServiceAccount (IAM role) of the data tasks: writes datasets/."""
    train_service_account: str = "pretrain-train"
    """ServiceAccount of train and evaluate: reads datasets/ and models/, writes runs/."""
    registry_service_account: str = "pretrain-registry"
    """ServiceAccount of register: reads runs/ and datasets/, writes models/."""
    remote: bool = False
    """Tasks run as pods of a shared cluster, not on this machine: what a task writes outside the store
    is lost with its pod, so its runs must be tracked by an MLflow server (``pretrain check`` refuses a
    SQLite or file tracking URI under such a profile)."""
    tracking_uri: str = ""
    """The MLflow server the task pods record into (http(s)://), set in every pod as $MLFLOW_TRACKING_URI;
    a run's tracking.uri still wins. '' = none: tracking.uri, else $MLFLOW_TRACKING_URI, else a SQLite
    file beside the default store (docs/tracking.md)."""


def load_cluster(path: str | None = None) -> ClusterConfig:
    """The profile at ``path`` or ``$PRETRAIN_CLUSTER``; the local defaults when neither is set."""
    from common.settings import from_dict

    path = path or os.environ.get(CLUSTER_ENV, "")
    if not path:
        return ClusterConfig()
    return from_dict(ClusterConfig, yaml.safe_load(Path(path).read_text()) or {}, where="cluster")


def kueue_labels(cluster: ClusterConfig, priority_class: str | None = None) -> dict[str, str]:
    return {QUEUE_LABEL: cluster.queue, PRIORITY_LABEL: priority_class or cluster.priority_class}
