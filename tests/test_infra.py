"""Offline validation of infra/: every file parses, every object validates, and each checker rejects bad input.

The checkers (Kubernetes models, Kueue schemas, IAM policies, Flyte templates) live in tests/helpers.py,
shared with tests/test_infra_*.py.
"""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from tests.helpers import (
    DOMAINS,
    INFRA,
    KUEUE_SCHEMAS,
    core_object_errors,
    helm_tpl,
    infra_files,
    kueue_object_errors,
    load_json,
    object_errors,
    objects,
    render_flyte_template,
    rendered_cluster_resources,
    selector_matches,
    validator,
)

# ================================================================================================
# Tests: every file parses and every object validates


def test_infra_tree_has_the_expected_files():
    expected = {
        "README.md",
        "flyte/values.yaml",
        "training-operator/values.yaml",
        "kueue/values.yaml",
        "kueue/resource-flavors.yaml",
        "kueue/cluster-queues.yaml",
        "kueue/local-queues.yaml",
        "kueue/priority-classes.yaml",
        "k8s/namespaces.yaml",
        "k8s/service-accounts.yaml",
        "k8s/resource-quotas.yaml",
        "k8s/mlflow.yaml",
        "mlflow/values.yaml",
        *(f"mlflow/{d}.yaml" for d in DOMAINS),
        "images/Dockerfile.train",
        *(f"iam/{d}/{r}.json" for d in DOMAINS for r in ("data", "train", "registry", "reader", "mlflow")),
        *(f"iam/trust/{d}/{r}.json" for d in DOMAINS for r in ("data", "train", "registry", "reader", "mlflow")),
        "iam/flyte-backend.json",
        "iam/trust/flyte-backend.json",
        *(f"flyte/project-domain-attributes/{d}-{a}.yaml" for d in DOMAINS for a in ("task-resources", "execution-config")),
        *(f"schemas/{s}" for s in [*KUEUE_SCHEMAS.values(), "kueue-configuration.json"]),
    }
    present = {str(p.relative_to(INFRA)) for p in INFRA.rglob("*") if p.is_file()}
    assert expected <= present, sorted(expected - present)


@pytest.mark.parametrize("path", infra_files(".yaml", ".yml", ".json"), ids=lambda p: str(p.relative_to(INFRA)))
def test_every_yaml_and_json_file_parses(path):
    if path.suffix == ".json":
        assert isinstance(json.loads(path.read_text()), dict)
    else:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs and all(isinstance(d, dict) for d in docs)


MANIFESTS = [
    "k8s/namespaces.yaml",
    "k8s/service-accounts.yaml",
    "k8s/resource-quotas.yaml",
    "k8s/mlflow.yaml",
    "kueue/resource-flavors.yaml",
    "kueue/cluster-queues.yaml",
    "kueue/local-queues.yaml",
    "kueue/priority-classes.yaml",
]


@pytest.mark.parametrize("rel", MANIFESTS)
def test_manifests_validate_offline(rel):
    """Kueue objects against the bundled schemas, the rest against the Kubernetes client models."""
    docs = objects(rel)
    errors = [e for i, d in enumerate(docs) for e in object_errors(d, f"{rel}[{i}]")]
    assert not errors, "\n".join(errors)
    keys = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(keys) == len(set(keys)), f"duplicate objects in {rel}"


def test_bundled_schemas_are_valid_and_strict():
    for schema_file in [*KUEUE_SCHEMAS.values(), "kueue-configuration.json"]:
        validator(schema_file)  # check_schema raises on an invalid schema
        schema = load_json(f"schemas/{schema_file}")
        assert schema["additionalProperties"] is False, schema_file


def test_flyte_cluster_resource_templates_render_to_valid_objects():
    for namespace, rendered in rendered_cluster_resources().items():
        for name, obj in rendered:
            assert not object_errors(obj, f"{namespace}/{name}"), object_errors(obj, f"{namespace}/{name}")
            meta = obj["metadata"]
            assert (meta["name"] if obj["kind"] == "Namespace" else meta["namespace"]) == namespace, name


# ================================================================================================
# Tests: the checkers reject bad input


def mutated(obj: dict, edit) -> dict:
    obj = copy.deepcopy(obj)
    edit(obj)
    return obj


NAMESPACE = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "pretrain-development", "labels": {"a": "b"}}}
QUOTA = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": "q", "namespace": "pretrain-development"},
    "spec": {
        "hard": {"requests.cpu": "4", "requests.nvidia.com/gpu": "8"},
        "scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["x"]}]},
    },
}
SERVICE_ACCOUNT = {
    "apiVersion": "v1",
    "kind": "ServiceAccount",
    "metadata": {"name": "pretrain-data", "namespace": "pretrain-development"},
    "automountServiceAccountToken": False,
}
EXTERNAL_NAME = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "mlflow", "namespace": "pretrain-development"},
    "spec": {"type": "ExternalName", "externalName": "mlflow-development.mlflow.svc.cluster.local"},
}
NETWORK_POLICY = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"name": "mlflow-development", "namespace": "mlflow"},
    "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": 5000, "protocol": "TCP"}]}]},
}


def test_core_checker_accepts_good_objects():
    for good in (NAMESPACE, QUOTA, SERVICE_ACCOUNT, EXTERNAL_NAME, NETWORK_POLICY):
        assert not core_object_errors(good), core_object_errors(good)


@pytest.mark.parametrize(
    "bad, expected",
    [
        (mutated(NAMESPACE, lambda o: o.update(metdata=o.pop("metadata"))), "unknown field of V1Namespace"),
        (mutated(NAMESPACE, lambda o: o["metadata"].update(lables={})), "unknown field of V1ObjectMeta"),
        (mutated(NAMESPACE, lambda o: o["metadata"].update(name="Pretrain_Dev")), "not a valid Namespace name"),
        (mutated(NAMESPACE, lambda o: o["metadata"].update(namespace="x")), "cluster-scoped"),
        (mutated(NAMESPACE, lambda o: o.update(apiVersion="v2")), "unknown apiVersion/kind"),
        (mutated(NAMESPACE, lambda o: o.update(status={"phase": "Active"})), "status does not belong"),
        (mutated(QUOTA, lambda o: o["spec"].update(hrad=o["spec"].pop("hard"))), "unknown field of V1ResourceQuotaSpec"),
        (mutated(QUOTA, lambda o: o["spec"].update(scope_selector=o["spec"].pop("scopeSelector"))), "unknown field"),
        (mutated(QUOTA, lambda o: o["spec"]["hard"].update(pods=10)), "expected str"),
        (mutated(QUOTA, lambda o: o["spec"].update(hard=["cpu"])), "expected a mapping"),
        (mutated(QUOTA, lambda o: o["spec"]["hard"].update({"nvidia.com/gpu": "8"})), "not a resource a ResourceQuota"),
        (mutated(QUOTA, lambda o: o["spec"]["hard"].update({"requests.cpu": "four"})), "not a quantity"),
        (mutated(QUOTA, lambda o: o["spec"]["scopeSelector"]["matchExpressions"][0].pop("operator")), "operator"),
        (mutated(QUOTA, lambda o: o["metadata"].pop("namespace")), "no metadata.namespace"),
        (mutated(SERVICE_ACCOUNT, lambda o: o.update(automountToken=False)), "unknown field of V1ServiceAccount"),
        (mutated(SERVICE_ACCOUNT, lambda o: o.update(automountServiceAccountToken="false")), "expected bool"),
        (mutated(SERVICE_ACCOUNT, lambda o: o["metadata"].pop("name")), "not a valid ServiceAccount name"),
        (mutated(EXTERNAL_NAME, lambda o: o["spec"].update(externalname="x")), "unknown field of V1ServiceSpec"),
        (mutated(EXTERNAL_NAME, lambda o: o["metadata"].pop("namespace")), "Service is namespaced"),
        (
            mutated(NETWORK_POLICY, lambda o: o["spec"]["ingress"][0].update(form=[])),
            "unknown field of V1NetworkPolicyIngressRule",
        ),
        (mutated(NETWORK_POLICY, lambda o: o["spec"].update(policyTypes="Ingress")), "expected a list"),
    ],
)
def test_core_checker_rejects_bad_objects(bad, expected):
    errors = core_object_errors(bad)
    assert any(expected in e for e in errors), errors


@pytest.mark.parametrize(
    "rel, edit, expected",
    [
        (
            "kueue/cluster-queues.yaml",
            lambda o: o["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0].update(nominalQuotas=1),
            "Additional properties are not allowed ('nominalQuotas'",
        ),
        (
            "kueue/cluster-queues.yaml",
            lambda o: o["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0].pop("nominalQuota"),
            "'nominalQuota' is a required property",
        ),
        (
            "kueue/cluster-queues.yaml",
            lambda o: o["spec"]["resourceGroups"][0].pop("coveredResources"),
            "'coveredResources' is a required property",
        ),
        (
            "kueue/cluster-queues.yaml",
            lambda o: o["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0].update(nominalQuota="12 cores"),
            "does not match",
        ),
        ("kueue/cluster-queues.yaml", lambda o: o["spec"].update(queueingStrategy="FIFO"), "is not one of"),
        ("kueue/cluster-queues.yaml", lambda o: o["spec"]["preemption"].update(withinClusterQueue="Lower"), "is not one of"),
        ("kueue/cluster-queues.yaml", lambda o: o["spec"].update(cohort="ML_Platform"), "does not match"),
        ("kueue/cluster-queues.yaml", lambda o: o.update(apiVersion="kueue.x-k8s.io/v1alpha1"), "was expected"),
        ("kueue/cluster-queues.yaml", lambda o: o["metadata"].update(namespace="x"), "cluster-scoped"),
        ("kueue/local-queues.yaml", lambda o: o["spec"].update(clusterqueue=o["spec"].pop("clusterQueue")), "clusterqueue"),
        ("kueue/local-queues.yaml", lambda o: o["metadata"].pop("namespace"), "no metadata.namespace"),
        ("kueue/resource-flavors.yaml", lambda o: o["spec"].update(nodeLabel={}), "nodeLabel"),
        (
            "kueue/resource-flavors.yaml",
            lambda o: o["spec"].update(nodeTaints=[{"key": "k", "effect": "NoScheduel"}]),
            "is not one of",
        ),
        ("kueue/priority-classes.yaml", lambda o: o.update(value="10000"), "is not of type 'integer'"),
        ("kueue/priority-classes.yaml", lambda o: o.pop("value"), "'value' is a required property"),
        ("kueue/priority-classes.yaml", lambda o: o.update(spec={"value": 1}), "Additional properties"),
        ("kueue/priority-classes.yaml", lambda o: o["metadata"].update(labelz={}), "unknown field of V1ObjectMeta"),
    ],
)
def test_kueue_checker_rejects_bad_objects(rel, edit, expected):
    errors = kueue_object_errors(mutated(objects(rel)[0], edit))
    assert any(expected in e for e in errors), errors


def test_helm_tpl_rejects_unescaped_flyte_templates():
    assert helm_tpl({"t": "{{`{{ project }}-{{ domain }}`}}"}) == ({"t": "{{ project }}-{{ domain }}"}, [])
    _, errors = helm_tpl({"t": "{{ project }}-{{ domain }}"}, "inline")
    assert errors and "inline.t" in errors[0]


def test_flyte_template_renderer_reports_unresolved_variables():
    text, unresolved = render_flyte_template("a: '{{ team }}'\nb: '{{ namespace }}'", "p", "d", "p-d", {})
    assert unresolved == ["team"] and "p-d" in text


def test_selector_semantics():
    labels = {"pretrain.example.org/team": "research"}
    assert selector_matches({}, labels) and not selector_matches(None, labels)
    assert selector_matches({"matchLabels": labels}, labels)
    assert not selector_matches({"matchLabels": {"pretrain.example.org/team": "platform"}}, labels)
    assert selector_matches({"matchExpressions": [{"key": "pretrain.example.org/team", "operator": "Exists"}]}, labels)
    assert not selector_matches({"matchExpressions": [{"key": "x", "operator": "Exists"}]}, labels)
    assert not selector_matches(
        {"matchExpressions": [{"key": "pretrain.example.org/team", "operator": "NotIn", "values": ["research"]}]}, labels
    )
