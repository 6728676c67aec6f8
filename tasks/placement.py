"""Images, resources and Kueue labels of the tasks, from the cluster profile (see pipeline/cluster.py)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from flytekit import ImageSpec, PodTemplate, Resources
from kubernetes.client import V1PodSpec

from pipeline.cluster import ClusterConfig, kueue_labels, load_cluster

CLUSTER: ClusterConfig = load_cluster()
LOCK = Path(__file__).resolve().parent.parent / "requirements.lock"
CUDA_BASE = "nvcr.io/nvidia/pytorch:25.01-py3"

COMMON_PACKAGES = ["flytekit", "boto3", "tokenizers", "huggingface-hub", "webdataset", "numpy", "pandas", "pyyaml"]
DATA_PACKAGES = [*COMMON_PACKAGES, "great-expectations"]
TRAIN_PACKAGES = [*COMMON_PACKAGES, "flytekitplugins-kfpytorch", "megatron-core", "triton", "psutil"]


def pinned(names: list[str]) -> list[str]:
    """``name==version`` for each name, as locked in requirements.lock."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        name, _, version = line.partition("==")
        pins[name.lower().replace("_", "-")] = version
    return [f"{n}=={pins[n]}" for n in names]


def data_image(cluster: ClusterConfig = CLUSTER) -> ImageSpec:
    """Slim CPU image for prepare, validate and register: no torch."""
    return ImageSpec(name="pretrain-data", python_version="3.11", packages=pinned(DATA_PACKAGES), registry=cluster.registry)


def training_image(cluster: ClusterConfig = CLUSTER) -> ImageSpec:
    """CUDA image (NGC PyTorch base: torch, NCCL, cuDNN) for train and evaluate on a GPU cluster."""
    if cluster.gpus_per_node:
        return ImageSpec(name="pretrain-train", base_image=CUDA_BASE, packages=pinned(TRAIN_PACKAGES), registry=cluster.registry)
    return ImageSpec(
        name="pretrain-train-cpu", python_version="3.11", packages=pinned(["torch", *TRAIN_PACKAGES]), registry=cluster.registry
    )


def pod_template(service_account: str, cluster: ClusterConfig = CLUSTER) -> PodTemplate:
    """Kueue labels (the team's queue, its priority) and the task's least-privilege identity."""
    spec = V1PodSpec(containers=[], service_account_name=service_account)
    return PodTemplate(pod_spec=spec, labels=kueue_labels(cluster))


# Each function returns the @task keyword arguments of one kind of task.


def data_task(cluster: ClusterConfig = CLUSTER) -> dict:
    """Fingerprint, prepare, validate, find the base model: slim image, the data identity."""
    return {
        "container_image": data_image(cluster),
        "pod_template": pod_template(cluster.data_service_account, cluster),
        "requests": Resources(cpu=cluster.data_cpu, mem=cluster.data_memory),
        "limits": Resources(mem=cluster.data_memory),
        "retries": 2,
        "interruptible": cluster.interruptible,
    }


def train_task(cluster: ClusterConfig = CLUSTER) -> dict:
    """Training: CUDA image, GPUs, shared memory, long timeout, retries that resume."""
    gpu = {"gpu": str(cluster.gpus_per_node)} if cluster.gpus_per_node else {}
    return {
        "container_image": training_image(cluster),
        "pod_template": pod_template(cluster.train_service_account, cluster),
        "requests": Resources(cpu=cluster.train_cpu, mem=cluster.train_memory, **gpu),
        "limits": Resources(mem=cluster.train_memory, **gpu),
        "shared_memory": True,  # /dev/shm for the ranks' collectives
        "timeout": timedelta(hours=cluster.train_timeout_hours),
        "retries": cluster.train_retries,
        "interruptible": cluster.interruptible,
    }


def evaluate_task(cluster: ClusterConfig = CLUSTER) -> dict:
    """Evaluation: the training image and identity, one GPU when the cluster has them."""
    gpu = {"gpu": "1"} if cluster.gpus_per_node else {}
    return {
        "container_image": training_image(cluster),
        "pod_template": pod_template(cluster.train_service_account, cluster),
        "requests": Resources(cpu=cluster.data_cpu, mem=cluster.data_memory, **gpu),
        "limits": Resources(mem=cluster.data_memory, **gpu),
        "retries": 2,
        "interruptible": cluster.interruptible,
    }


def registry_task(cluster: ClusterConfig = CLUSTER) -> dict:
    """Registration: slim image, the registry identity (the only one that writes models/)."""
    return {
        "container_image": data_image(cluster),
        "pod_template": pod_template(cluster.registry_service_account, cluster),
        "retries": 2,
    }
