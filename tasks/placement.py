"""Images, resources and Kueue labels of the tasks, from the cluster profile (see pipeline/cluster.py)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from flytekit import ImageSpec, PodTemplate, Resources
from kubernetes.client import (
    V1Capabilities,
    V1Container,
    V1EmptyDirVolumeSource,
    V1EnvVar,
    V1EnvVarSource,
    V1PodSecurityContext,
    V1PodSpec,
    V1SeccompProfile,
    V1SecretKeySelector,
    V1SecurityContext,
    V1Volume,
    V1VolumeMount,
)

from pipeline.cluster import ClusterConfig, kueue_labels, load_cluster
from tracking.uri import TRACKING_URI_ENV

CLUSTER: ClusterConfig = load_cluster()
LOCK = Path(__file__).resolve().parent.parent / "requirements.lock"
CUDA_BASE = "nvcr.io/nvidia/pytorch:25.01-py3"

# mlflow: the tracking mirror (start_tracking and track_run in the slim image, the live feed of the train task).
COMMON_PACKAGES = ["flytekit", "boto3", "tokenizers", "huggingface-hub", "webdataset", "numpy", "pandas", "pyyaml", "mlflow"]
# matplotlib: prepare's Dataset Deck (reports.data_charts) and the last task's Comparison Deck (track_run, slim image).
# py3langid: prepare_data's language allow-list (data.languages; data_prep.language imports it on first use).
DATA_PACKAGES = [*COMMON_PACKAGES, "fastokens", "ffbpe", "great-expectations", "matplotlib", "py3langid"]
# matplotlib draws the train task's Decks (reports.charts).
# lm-eval, transformers, accelerate: the evaluate task runs lm-evaluation-harness on the Hugging Face export.
TRAIN_PACKAGES = [
    *COMMON_PACKAGES,
    "flytekitplugins-kfpytorch",
    "megatron-core",
    "triton",
    "psutil",
    "matplotlib",
    "lm-eval",
    "transformers",
    "accelerate",
]
RUNTIME_UID = 1000
"""Numeric non-root user (and group) the task containers run as; it owns nothing in the images."""
TRACKING_SECRET = "mlflow-tracking"
"""The Secret, in each pretrain-<domain> namespace, of the task pods' MLflow user (keys ``username``, ``password``):
the cluster's servers require a user (infra/mlflow/values.yaml); MLflow's client reads the two variables."""
ROOT_OWNED_PYTHON = "chown -R root:root /opt/micromamba && chmod -R go-w /opt/micromamba"
"""ImageSpec build step (run as root, after the install): the runtime user cannot modify the packages."""


def pinned(names: list[str]) -> list[str]:
    """``name==version`` for each name, as locked in requirements.lock."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        name, _, version = line.partition("==")
        pins[name.lower().replace("_", "-")] = version
    return [f"{n}=={pins[n]}" for n in names]


def data_image(cluster: ClusterConfig = CLUSTER) -> ImageSpec:
    """Slim CPU image for prepare, validate and register: no torch."""
    return ImageSpec(
        name="pretrain-data",
        python_version="3.11",
        packages=pinned(DATA_PACKAGES),
        registry=cluster.registry,
        commands=[ROOT_OWNED_PYTHON],
    )


def training_image(cluster: ClusterConfig = CLUSTER) -> ImageSpec:
    """CUDA image (NGC PyTorch base: torch, NCCL, cuDNN) for train and evaluate on a GPU cluster."""
    if cluster.gpus_per_node:
        return ImageSpec(
            name="pretrain-train",
            base_image=CUDA_BASE,
            packages=pinned(TRAIN_PACKAGES),
            registry=cluster.registry,
            commands=[ROOT_OWNED_PYTHON],
        )
    return ImageSpec(
        name="pretrain-train-cpu",
        python_version="3.11",
        packages=pinned(["torch", *TRAIN_PACKAGES]),
        registry=cluster.registry,
        commands=[ROOT_OWNED_PYTHON],
    )


def pod_template(service_account: str, cluster: ClusterConfig = CLUSTER) -> PodTemplate:
    """Kueue labels (the team's queue, its priority), the task's least-privilege identity, and Pod Security
    `restricted`: a numeric non-root user, no privilege escalation, no capabilities, RuntimeDefault seccomp,
    a read-only root filesystem with emptyDirs for /tmp (also $HOME) and /root (where fast registration
    unpacks the code); train's /dev/shm is the emptyDir that ``shared_memory=True`` adds. The profile's
    MLflow server, if it names one, is the pods' $MLFLOW_TRACKING_URI; a server over HTTP gets the user and
    password of ``TRACKING_SECRET`` (never a literal)."""
    seccomp = V1SeccompProfile(type="RuntimeDefault")
    env = [V1EnvVar(name="HOME", value="/tmp")]
    if cluster.tracking_uri:
        env.append(V1EnvVar(name=TRACKING_URI_ENV, value=cluster.tracking_uri))
    if cluster.tracking_uri.startswith(("http://", "https://")):
        env += [
            V1EnvVar(name=name, value_from=V1EnvVarSource(secret_key_ref=V1SecretKeySelector(name=TRACKING_SECRET, key=key)))
            for name, key in (("MLFLOW_TRACKING_USERNAME", "username"), ("MLFLOW_TRACKING_PASSWORD", "password"))
        ]
    primary = V1Container(
        name="primary",
        security_context=V1SecurityContext(
            allow_privilege_escalation=False,
            privileged=False,
            run_as_non_root=True,
            read_only_root_filesystem=True,
            capabilities=V1Capabilities(drop=["ALL"]),
            seccomp_profile=seccomp,
        ),
        volume_mounts=[V1VolumeMount(name="tmp", mount_path="/tmp"), V1VolumeMount(name="workdir", mount_path="/root")],
        env=env,
    )
    spec = V1PodSpec(
        containers=[primary],
        service_account_name=service_account,
        security_context=V1PodSecurityContext(
            run_as_non_root=True, run_as_user=RUNTIME_UID, run_as_group=RUNTIME_UID, seccomp_profile=seccomp
        ),
        volumes=[V1Volume(name=n, empty_dir=V1EmptyDirVolumeSource()) for n in ("tmp", "workdir")],
    )
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


def plan_task(cluster: ClusterConfig = CLUSTER) -> dict:
    """Planning the training (a cooldown's checkpoint read from runs/): slim image, the training identity."""
    return {**data_task(cluster), "pod_template": pod_template(cluster.train_service_account, cluster)}


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
