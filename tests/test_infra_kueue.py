"""Kueue: the rules Kueue enforces, references between objects, and what the cluster profiles need.

The queue name and priority classes come from the code (pipeline.cluster profiles, the pod template
of tasks.placement, the launch plans of workflows.pretrain), never from a copy in the test.
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict

import pytest
import yaml

from pipeline.cluster import PRIORITY_LABEL, QUEUE_LABEL
from tests.helpers import (
    PRETRAIN_NAMESPACES,
    by_name,
    cluster_profiles,
    flyte_values,
    k8s_model_errors,
    load_docs,
    objects,
    qty,
    registration_facts,
    schema_errors,
    selector_matches,
)

SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kueue-system", "kubeflow", "flyte", "default")
GPU = "nvidia.com/gpu"


def flavors() -> dict[str, dict]:
    return by_name(objects("kueue/resource-flavors.yaml", "ResourceFlavor"))


def cluster_queues() -> dict[str, dict]:
    return by_name(objects("kueue/cluster-queues.yaml", "ClusterQueue"))


def local_queues() -> list[dict]:
    return objects("kueue/local-queues.yaml", "LocalQueue")


def namespace_labels() -> dict[str, dict[str, str]]:
    """Labels as the API server stores them (with the automatic kubernetes.io/metadata.name)."""
    namespaces = {d["metadata"]["name"]: d["metadata"].get("labels", {}) for d in objects("k8s/namespaces.yaml", "Namespace")}
    return {name: {**labels, "kubernetes.io/metadata.name": name} for name, labels in namespaces.items()}


def kueue_configuration() -> dict:
    (values,) = load_docs("kueue/values.yaml")
    return yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])


# ----------------------------------------------------------------------------------------------
# Checkers


def cluster_queue_errors(cq: dict) -> list[str]:
    """Rules of the ClusterQueue CRD's CEL validations and Kueue's admission webhook."""
    name, spec = cq["metadata"]["name"], cq["spec"]
    errors, seen_flavors, seen_resources = [], set(), set()
    for g, group in enumerate(spec.get("resourceGroups", [])):
        covered = group["coveredResources"]
        for res in covered:
            if res in seen_resources:
                errors.append(f"{name}: resource {res} is in more than one resource group")
            seen_resources.add(res)
        for flavor in group["flavors"]:
            if flavor["name"] in seen_flavors:
                errors.append(f"{name}: flavor {flavor['name']} is in more than one resource group")
            seen_flavors.add(flavor["name"])
            listed = [r["name"] for r in flavor["resources"]]
            if listed != covered:
                errors.append(f"{name}: group {g} flavor {flavor['name']} lists {listed}, must be coveredResources {covered}")
            for r in flavor["resources"]:
                where = f"{name}: {flavor['name']}/{r['name']}"
                nominal = qty(r["nominalQuota"])
                if nominal < 0 or any(qty(r[k]) < 0 for k in ("borrowingLimit", "lendingLimit") if k in r):
                    errors.append(f"{where}: quotas must be non-negative")
                if not spec.get("cohort") and ("borrowingLimit" in r or "lendingLimit" in r):
                    errors.append(f"{where}: borrowingLimit/lendingLimit need a cohort")
                if "lendingLimit" in r and qty(r["lendingLimit"]) > nominal:
                    errors.append(f"{where}: lendingLimit exceeds nominalQuota")
    return errors


def reference_errors(rfs: dict[str, dict], cqs: dict[str, dict], lqs: list[dict], namespaces: dict[str, dict]) -> list[str]:
    errors = []
    for name, cq in cqs.items():
        for group in cq["spec"].get("resourceGroups", []):
            errors += [
                f"ClusterQueue {name}: flavor {f['name']} has no ResourceFlavor" for f in group["flavors"] if f["name"] not in rfs
            ]
    cohorts = defaultdict(list)
    for name, cq in cqs.items():
        if cq["spec"].get("cohort"):
            cohorts[cq["spec"]["cohort"]].append(name)
    errors += [f"cohort {c} has only {members}: nothing to borrow from" for c, members in cohorts.items() if len(members) < 2]
    for lq in lqs:
        ns, target = lq["metadata"]["namespace"], lq["spec"].get("clusterQueue")
        where = f"LocalQueue {ns}/{lq['metadata']['name']}"
        if target not in cqs:
            errors.append(f"{where}: ClusterQueue {target!r} does not exist")
        elif ns not in namespaces:
            errors.append(f"{where}: namespace {ns} is not defined in infra/k8s/namespaces.yaml")
        elif not selector_matches(cqs[target]["spec"].get("namespaceSelector"), namespaces[ns]):
            errors.append(f"{where}: ClusterQueue {target}'s namespaceSelector does not select {ns}")
    return errors


def tolerates(tolerations: list[dict], taint: dict) -> bool:
    for t in tolerations:
        key_ok = t.get("key") == taint["key"] or (not t.get("key") and t.get("operator") == "Exists")
        value_ok = t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", "")
        if key_ok and value_ok and t.get("effect") in (None, "", taint["effect"]):
            return True
    return False


def capacity(cqs: dict[str, dict], cq_name: str, flavor: str, resource: str) -> float:
    """Most of (flavor, resource) a ClusterQueue can admit: nominal + what it may borrow from its cohort."""
    spec = cqs[cq_name]["spec"]

    def quota(s, field):
        for group in s.get("resourceGroups", []):
            for f in group["flavors"]:
                for r in f["resources"] if f["name"] == flavor else []:
                    if r["name"] == resource:
                        return r.get(field)
        return None

    nominal = quota(spec, "nominalQuota")
    if nominal is None:
        return 0.0
    lendable = sum(
        qty(quota(other["spec"], "lendingLimit") or quota(other["spec"], "nominalQuota") or 0)
        for name, other in cqs.items()
        if name != cq_name and spec.get("cohort") and other["spec"].get("cohort") == spec.get("cohort")
    )
    limit = quota(spec, "borrowingLimit")
    return qty(nominal) + (lendable if limit is None else min(qty(limit), lendable))


def assign_flavor(cqs, rfs, cq_name: str, per_pod: dict[str, float], count: int, tolerations: list[dict]) -> str | None:
    """The flavor Kueue would give a pod set with an empty cluster: the first, in order, whose taints the pods
    tolerate and whose quota (nominal + borrowing) holds every requested resource; None when none does."""
    for group in cqs[cq_name]["spec"]["resourceGroups"]:
        if not set(per_pod) & set(group["coveredResources"]):
            continue
        if set(per_pod) - set(group["coveredResources"]):
            return None  # a requested resource the queue does not cover: inadmissible
        for flavor in group["flavors"]:
            rf_spec = rfs[flavor["name"]].get("spec", {})
            untolerated = [
                t for t in rf_spec.get("nodeTaints", []) if not tolerates(tolerations + rf_spec.get("tolerations", []), t)
            ]
            if untolerated:
                continue
            if all(amount * count <= capacity(cqs, cq_name, flavor["name"], res) for res, amount in per_pod.items()):
                return flavor["name"]
    return None


def max_admissible(cqs: dict[str, dict], cq_name: str) -> dict[str, float]:
    """Per resource, the most a ClusterQueue can admit over all its flavors."""
    total: dict[str, float] = defaultdict(float)
    for group in cqs[cq_name]["spec"]["resourceGroups"]:
        for flavor in group["flavors"]:
            for res in group["coveredResources"]:
                total[res] += capacity(cqs, cq_name, flavor["name"], res)
    return dict(total)


def queue_of(namespace: str) -> str:
    (lq,) = [q for q in local_queues() if q["metadata"]["namespace"] == namespace]
    return lq["spec"]["clusterQueue"]


def gpu_tolerations(per_pod: dict[str, float]) -> list[dict]:
    """The tolerations Flyte adds to a pod (plugins.k8s.resource-tolerations) for the resources it requests."""
    configured = flyte_values()["configuration"]["inline"]["plugins"]["k8s"].get("resource-tolerations", {})
    return [t for res, ts in configured.items() if per_pod.get(res) for t in ts]


def pod_sets(profile) -> dict[str, tuple[dict[str, float], int]]:
    """The profile's pod sets as Kueue sees them: per-pod requests and pod count."""
    train = {"cpu": qty(profile.train_cpu), "memory": qty(profile.train_memory)}
    if profile.gpus_per_node:
        train[GPU] = float(profile.gpus_per_node)
    data = {"cpu": qty(profile.data_cpu), "memory": qty(profile.data_memory)}
    return {"train": (train, profile.nnodes), "data": (data, 1)}


# ----------------------------------------------------------------------------------------------
# Tests on the checked-in objects


def test_cluster_queues_follow_kueues_rules():
    errors = [e for cq in cluster_queues().values() for e in cluster_queue_errors(cq)]
    assert not errors, "\n".join(errors)


def test_references_resolve_and_cohorts_have_members():
    errors = reference_errors(flavors(), cluster_queues(), local_queues(), namespace_labels())
    assert not errors, "\n".join(errors)
    assert {"team-research", "team-platform"} <= set(cluster_queues())
    assert all(cq["spec"].get("cohort") for cq in cluster_queues().values()), "every team queue can borrow"


def test_gpu_and_cpu_flavors_exist():
    gpu_flavors = {name for name, rf in flavors().items() if rf["spec"].get("nodeTaints")}
    assert {"h100-80gb", "h200-141gb"} <= gpu_flavors and "cpu" in flavors()
    for cq in cluster_queues().values():
        (group,) = cq["spec"]["resourceGroups"]
        assert {"cpu", "memory", GPU} <= set(group["coveredResources"])
        assert [f["name"] for f in group["flavors"]][0] == "cpu", "CPU-only pod sets must try the cpu flavor first"


def test_every_pretrain_namespace_has_the_profiles_queue():
    queues = {(q["metadata"]["namespace"], q["metadata"]["name"]) for q in local_queues()}
    names = {p.queue for p in cluster_profiles().values()}
    facts = registration_facts()
    names |= {f["pod_labels"][QUEUE_LABEL] for f in facts["profiles"].values()} | {facts["module_pod_labels"][QUEUE_LABEL]}
    names |= {lp[QUEUE_LABEL] for lp in facts["launch_plan_labels"].values()}
    assert names == {"pretrain"}, names
    missing = [(ns, q) for ns in PRETRAIN_NAMESPACES for q in names if (ns, q) not in queues]
    assert not missing, f"no LocalQueue {missing}"


def test_priority_classes_cover_the_profiles_and_launch_plans():
    classes = {d["metadata"]["name"]: d["value"] for d in objects("kueue/priority-classes.yaml", "WorkloadPriorityClass")}
    facts = registration_facts()
    used = {p.priority_class for p in cluster_profiles().values()}
    used |= {f["pod_labels"][PRIORITY_LABEL] for f in facts["profiles"].values()} | {facts["module_pod_labels"][PRIORITY_LABEL]}
    used |= {lp[PRIORITY_LABEL] for lp in facts["launch_plan_labels"].values()}
    assert {"production", "research", "nightly"} <= used, used
    assert used <= set(classes), f"no WorkloadPriorityClass for {used - set(classes)}"
    assert classes["production"] > classes["research"] > classes["nightly"] > 0
    assert facts["launch_plan_labels"]["pretrain_nightly"][PRIORITY_LABEL] == "nightly"
    assert facts["launch_plan_labels"]["pretrain_default"][PRIORITY_LABEL] == cluster_profiles()["gpu-2x8"].priority_class


def test_kueue_configuration_enables_the_integrations():
    config = kueue_configuration()
    assert not schema_errors(config, "kueue-configuration.json", "Configuration"), schema_errors(
        config, "kueue-configuration.json", "Configuration"
    )
    assert {"kubeflow.org/pytorchjob", "pod"} <= set(config["integrations"]["frameworks"])
    selector = config["managedJobsNamespaceSelector"]
    for ns, labels in namespace_labels().items():
        assert selector_matches(selector, labels), f"Kueue would not manage the plain pods of {ns}"
    for ns in SYSTEM_NAMESPACES:
        assert not selector_matches(selector, {"kubernetes.io/metadata.name": ns}), f"Kueue would gate pods in {ns}"
    assert config["waitForPodsReady"]["enable"] is True


def test_kueue_chart_values_use_known_keys():
    (values,) = load_docs("kueue/values.yaml")
    known = {
        "nameOverride", "fullnameOverride", "enablePrometheus", "enableCertManager", "enableVisibilityAPF",
        "enableKueueViz", "kubernetesClusterDomain", "controllerManager", "managerConfig", "metricsService",
        "webhookService", "mutatingWebhook", "kueueViz", "metrics",
    }  # fmt: skip
    assert set(values) <= known, set(values) - known
    assert set(values["controllerManager"]) <= {
        "featureGates", "manager", "replicas", "imagePullSecrets", "readinessProbe", "livenessProbe",
        "nodeSelector", "tolerations", "topologySpreadConstraints", "podDisruptionBudget",
    }  # fmt: skip
    manager = values["controllerManager"]["manager"]
    assert not k8s_model_errors(manager["resources"], "V1ResourceRequirements", "manager.resources")


@pytest.mark.parametrize("namespace", PRETRAIN_NAMESPACES)
def test_every_profile_is_admissible_in_every_pretrain_namespace(namespace):
    cqs, rfs = cluster_queues(), flavors()
    for name, profile in cluster_profiles().items():
        for podset, (per_pod, count) in pod_sets(profile).items():
            flavor = assign_flavor(cqs, rfs, queue_of(namespace), per_pod, count, gpu_tolerations(per_pod))
            assert flavor, f"{name}: the {podset} pods ({count} x {per_pod}) never fit {queue_of(namespace)}"
            on_gpu_nodes = bool(rfs[flavor]["spec"].get("nodeTaints"))
            assert on_gpu_nodes == bool(per_pod.get(GPU)), f"{name}: {podset} pods would run on flavor {flavor}"


def test_cpu_only_pods_never_take_gpu_nodes():
    """Even with the cpu flavor out of quota, a pod set without GPUs must not be assigned a GPU flavor."""
    cqs, rfs = copy.deepcopy(cluster_queues()), flavors()
    for cq in cqs.values():
        for r in cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"]:
            r["nominalQuota"], r["borrowingLimit"] = 0, 0
    for cq_name in cqs:
        assert assign_flavor(cqs, rfs, cq_name, {"cpu": 1.0, "memory": 2.0**30}, 1, []) is None


def test_resource_quotas_cover_everything_kueue_can_admit():
    quotas = {q["metadata"]["namespace"]: q["spec"]["hard"] for q in objects("k8s/resource-quotas.yaml", "ResourceQuota")}
    cqs = cluster_queues()
    assert set(quotas) == set(PRETRAIN_NAMESPACES)
    for ns, hard in quotas.items():
        for res, amount in max_admissible(cqs, queue_of(ns)).items():
            limit = qty(hard[f"requests.{res}"])
            assert limit >= amount, f"{ns}: ResourceQuota requests.{res}={hard[f'requests.{res}']} < {amount} Kueue may admit"
        largest_job = max(p.nnodes for p in cluster_profiles().values())
        assert qty(hard["count/pytorchjobs.kubeflow.org"]) >= 1 and qty(hard["pods"]) >= largest_job + 1


def test_nominal_quotas_fit_the_documented_node_pools():
    """Per flavor, the teams' nominal quotas add up to at most the pools described in cluster-queues.yaml."""
    pools = {"cpu": {"cpu": 360, "memory": 1440 * 2**30}, "h100-80gb": {GPU: 32, "cpu": 736, "memory": 7600 * 2**30}}
    pools["h200-141gb"] = {GPU: 16, "cpu": 368, "memory": 3800 * 2**30}
    used: dict[tuple[str, str], float] = defaultdict(float)
    for cq in cluster_queues().values():
        for f in cq["spec"]["resourceGroups"][0]["flavors"]:
            for r in f["resources"]:
                used[f["name"], r["name"]] += qty(r["nominalQuota"])
    for (flavor, res), total in used.items():
        assert total <= pools[flavor].get(res, 0) + 1e-9, f"{flavor}/{res}: nominal quotas {total} exceed the pool"
    assert math.isclose(used["h100-80gb", GPU], 32) and math.isclose(used["h200-141gb", GPU], 16)


# ----------------------------------------------------------------------------------------------
# The checkers reject bad input


def _cq() -> dict:
    return copy.deepcopy(cluster_queues()["team-platform"])


def _edit_resource(cq: dict, flavor: int, resource: int, **fields) -> dict:
    cq["spec"]["resourceGroups"][0]["flavors"][flavor]["resources"][resource].update(fields)
    return cq


@pytest.mark.parametrize(
    "bad, expected",
    [
        (_edit_resource(_cq(), 1, 2, lendingLimit=32), "lendingLimit exceeds nominalQuota"),
        (_edit_resource(_cq(), 1, 2, nominalQuota=-1), "non-negative"),
        ({**_cq(), "spec": {k: v for k, v in _cq()["spec"].items() if k != "cohort"}}, "need a cohort"),
        (_edit_resource(_cq(), 1, 2, name="cpu"), "must be coveredResources"),
    ],
)
def test_cluster_queue_checker_rejects_bad_queues(bad, expected):
    errors = cluster_queue_errors(bad)
    assert any(expected in e for e in errors), errors


def test_cluster_queue_checker_rejects_a_resource_in_two_groups():
    cq = _cq()
    cq["spec"]["resourceGroups"].append(copy.deepcopy(cq["spec"]["resourceGroups"][0]))
    errors = cluster_queue_errors(cq)
    assert any("more than one resource group" in e for e in errors), errors


def test_reference_checker_rejects_broken_references():
    rfs, cqs, lqs, nss = flavors(), cluster_queues(), local_queues(), namespace_labels()

    def check(rfs=rfs, cqs=cqs, lqs=lqs, nss=nss):
        return "\n".join(reference_errors(rfs, cqs, lqs, nss))

    assert "has no ResourceFlavor" in check(rfs={k: v for k, v in rfs.items() if k != "h200-141gb"})
    assert "cohort ml-platform has only" in check(cqs={"team-platform": cqs["team-platform"]}, lqs=[])
    renamed = copy.deepcopy(lqs)
    renamed[0]["spec"]["clusterQueue"] = "team-reserach"
    assert "'team-reserach' does not exist" in check(lqs=renamed)
    relabelled = {**nss, "pretrain-development": {"pretrain.example.org/team": "platform"}}
    assert "does not select pretrain-development" in check(nss=relabelled)
    assert "is not defined" in check(nss={k: v for k, v in nss.items() if k != "pretrain-production"})


def test_admission_checker_rejects_jobs_that_cannot_fit():
    cqs, rfs = cluster_queues(), flavors()
    gpu_pod = {"cpu": 64.0, "memory": 900.0 * 2**30, GPU: 8.0}
    tolerations = gpu_tolerations(gpu_pod)
    assert assign_flavor(cqs, rfs, "team-research", gpu_pod, 2, tolerations) == "h100-80gb"
    assert assign_flavor(cqs, rfs, "team-research", gpu_pod, 5, tolerations) is None  # 40 GPUs > 16 + 8 + 8
    assert assign_flavor(cqs, rfs, "team-research", gpu_pod, 2, []) is None  # no toleration for the GPU taint
    with_disk = {**gpu_pod, "ephemeral-storage": 10.0 * 2**30}
    assert assign_flavor(cqs, rfs, "team-research", with_disk, 1, tolerations) is None  # resource not covered
