"""`pyflyte package` offline: what a cluster registration would receive."""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from flyteidl.admin import launch_plan_pb2, task_pb2, workflow_pb2
from google.protobuf.json_format import MessageToDict

from tasks.train import RECOVERY
from training.config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
# prepare_data's fan-out (a dynamic workflow): map tasks over partitions and key shards, then one of each.
DATA_STAGES = (
    "scan_partition",
    "dedup_exact",
    "dedup_near",
    "resolve_documents",
    "train_tokenizer",
    "encode_partition",
    "plan_packing",
    "pack_shards",
    "commit_dataset",
)
TASKS = {
    "tasks.register.find_base_model",
    "tasks.register.find_gate_holder",
    "tasks.data.fingerprint_corpus",
    "tasks.data.prepare_data",
    *(f"tasks.data.{name}" for name in DATA_STAGES),
    "tasks.data.validate_data",
    "tasks.train.plan_training",
    "tasks.train.train_model",
    "tasks.evaluate.evaluate_model",
    "tasks.register.register_model",
}


def package(tmp_path: Path, cluster: str) -> dict[str, dict]:
    out = tmp_path / "pkg.tgz"
    env = {**os.environ, "PRETRAIN_CLUSTER": str(ROOT / "configs" / "cluster" / cluster), "HOME": str(tmp_path)}
    command = [str(Path(sys.executable).parent / "pyflyte"), "--pkgs", "workflows", "package"]
    command += ["--image", "ghcr.io/example-org/pretrain:test", "-o", str(out), "--force"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    # Members are named NN_<entity name>_<resource type>.pb: 1 task, 2 workflow, 3 launch plan.
    messages = {"1": task_pb2.TaskSpec, "2": workflow_pb2.WorkflowSpec, "3": launch_plan_pb2.LaunchPlan}
    entities: dict[str, dict] = {}
    with tarfile.open(out) as archive:
        for member in archive.getmembers():
            name, _, kind = member.name.removesuffix(".pb").partition("_")[2].rpartition("_")
            message = messages[kind]()
            message.ParseFromString(archive.extractfile(member).read())
            entities[("lp:" if kind == "3" else "") + name] = MessageToDict(message)
    return entities


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory):
    return package(tmp_path_factory.mktemp("gpu"), "gpu-2x8.yaml")


@pytest.mark.slow
def test_every_task_workflow_and_launch_plan_is_packaged(gpu_cluster):
    assert TASKS <= set(gpu_cluster)
    assert "workflows.pretrain.pretrain" in gpu_cluster
    assert {"lp:pretrain_default", "lp:pretrain_nightly"} <= set(gpu_cluster)


def test_train_task_is_a_pytorchjob_with_the_profiles_replicas(gpu_cluster):
    template = gpu_cluster["tasks.train.train_model"]["template"]
    assert template["type"] == "pytorch"
    elastic = template["custom"]["elasticConfig"]
    assert (elastic["minReplicas"], elastic["maxReplicas"], elastic["nprocPerNode"]) == (2, 2, 8)
    # A rank that dies restarts the ranks in place (train.max_restarts' default), and the operator's backoff matches.
    assert elastic["maxRestarts"] == TrainConfig.max_restarts == 3
    assert template["custom"]["runPolicy"]["backoffLimit"] == TrainConfig.max_restarts
    inputs = gpu_cluster["tasks.train.train_model"]["template"]["interface"]["inputs"]["variables"]
    assert set(RECOVERY) == {"max_restarts", "keep_local_checkpoints", "local_checkpoint_every"} <= set(inputs)  # no cache key
    pod = template["k8sPod"]
    assert pod["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "pretrain", "kueue.x-k8s.io/priority-class": "production"}
    resources = pod["podSpec"]["containers"][0]["resources"]
    assert resources["requests"]["gpu"] == "8" and resources["limits"]["gpu"] == "8"
    assert "pretrain-train:" in pod["podSpec"]["containers"][0]["image"]
    assert pod["podSpec"]["serviceAccountName"] == "pretrain-train"
    assert template["metadata"]["retries"]["retries"] == 5 and template["metadata"]["discoverable"]


def test_data_tasks_use_the_slim_image_and_their_own_identity(gpu_cluster):
    for name, account in [
        ("tasks.data.prepare_data", "pretrain-data"),
        *((f"tasks.data.{stage}", "pretrain-data") for stage in DATA_STAGES),
        ("tasks.data.validate_data", "pretrain-data"),
        ("tasks.register.register_model", "pretrain-registry"),
    ]:
        pod = gpu_cluster[name]["template"]["k8sPod"]
        assert "pretrain-data:" in pod["podSpec"]["containers"][0]["image"], name
        assert pod["podSpec"]["serviceAccountName"] == account, name
    # A failed scan, encode or pack task (a lost pod, a store hiccup) is retried alone.
    for stage in DATA_STAGES:
        assert gpu_cluster[f"tasks.data.{stage}"]["template"]["metadata"]["retries"]["retries"] == 2, stage


def test_nightly_plan_carries_its_cron_and_priority(gpu_cluster):
    spec = gpu_cluster["lp:pretrain_nightly"]["spec"]
    assert spec["entityMetadata"]["schedule"]["cronSchedule"]["schedule"] == "0 2 * * *"
    assert spec["labels"]["values"]["kueue.x-k8s.io/priority-class"] == "nightly"
    assert "schedule" not in gpu_cluster["lp:pretrain_default"]["spec"].get("entityMetadata", {})


def test_nightly_plan_never_overlaps_itself(gpu_cluster):
    # At most one nightly execution; one that would start while the last still runs is skipped.
    policy = gpu_cluster["lp:pretrain_nightly"]["spec"]["concurrencyPolicy"]
    assert policy == {"max": 1, "behavior": "CONCURRENCY_LIMIT_BEHAVIOR_SKIP"}
    assert "concurrencyPolicy" not in gpu_cluster["lp:pretrain_default"]["spec"]


CACHED = {
    "tasks.data.prepare_data",
    "tasks.data.validate_data",
    "tasks.train.train_model",
    "tasks.evaluate.evaluate_model",
    "tasks.register.register_model",
}


def test_identical_executions_of_a_cached_task_run_once(gpu_cluster):
    # cache_serialize: a cluster runs one of two identical task executions and the other reuses its output.
    for name in TASKS:
        metadata = gpu_cluster[name]["template"]["metadata"]
        assert metadata.get("discoverable", False) == (name in CACHED), name
        assert metadata.get("cacheSerializable", False) == (name in CACHED), name


def test_inputs_carry_descriptions_for_the_launch_form(gpu_cluster):
    variable = gpu_cluster["workflows.pretrain.pretrain"]["template"]["interface"]["inputs"]["variables"]["config"]
    assert variable["description"].startswith("The whole run")
    schema = variable["type"]["metadata"]
    assert schema["properties"]["train"]["properties"]["lr"]["description"] == "Peak learning rate."
    assert "description" in schema["properties"]["data"]["properties"]["sources"]


@pytest.mark.slow
def test_local_profile_keeps_training_in_one_pod(tmp_path):
    template = package(tmp_path, "local.yaml")["tasks.train.train_model"]["template"]
    assert template["type"] == "python-task"  # nnodes=1: the ranks run inside a single pod
    assert "custom" not in template
    assert template["extendedResources"]["sharedMemory"]["mountPath"] == "/dev/shm"
    assert template["k8sPod"]["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "research"
