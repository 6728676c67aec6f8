"""Offline validation of infra/: every file parses, every object validates, and each checker rejects bad input.

The checkers live here and are shared by tests/test_infra_*.py:

- Kubernetes core objects: walked against the models of the installed ``kubernetes`` client
  (field names from ``attribute_map``, types from ``openapi_types``), then built with
  ``Model.from_dict`` for required fields and strict types.
- Kueue objects: JSON Schemas in infra/schemas/ (derived from the Kueue CRDs) with ``jsonschema``,
  plus their metadata against the ObjectMeta model.
- IAM: a small evaluator of S3 identity policies against a per-role specification.
- Flyte: the chart's Helm ``tpl`` escapes and the cluster resource manager's ``{{ var }}``
  substitution, reimplemented to render what Flyte would apply.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes.client as k8s
import pytest
import yaml
from kubernetes.utils.quantity import parse_quantity

ROOT = Path(__file__).resolve().parent.parent
INFRA = ROOT / "infra"
DOMAINS = ("development", "staging", "production")
PROJECT = "pretrain"
PRETRAIN_NAMESPACES = tuple(f"{PROJECT}-{d}" for d in DOMAINS)


# ----------------------------------------------------------------------------------------------
# Loading


def infra_files(*suffixes: str) -> list[Path]:
    return sorted(p for p in INFRA.rglob("*") if p.is_file() and p.suffix in suffixes)


@cache
def load_docs(rel: str) -> tuple[dict, ...]:
    """The YAML documents of infra/<rel> (empty documents dropped)."""
    return tuple(d for d in yaml.safe_load_all((INFRA / rel).read_text()) if d is not None)


@cache
def load_json(rel: str) -> dict:
    return json.loads((INFRA / rel).read_text())


def objects(rel: str, kind: str | None = None) -> list[dict]:
    return [copy.deepcopy(d) for d in load_docs(rel) if kind is None or d.get("kind") == kind]


def by_name(docs: list[dict]) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs}


# ----------------------------------------------------------------------------------------------
# Kubernetes core objects, validated against the kubernetes client's models

PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float), "datetime": str, "date": str, "bytes": str}
CORE_KINDS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "ResourceQuota"): "V1ResourceQuota",
    ("v1", "LimitRange"): "V1LimitRange",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
}
NAMESPACED = {"ServiceAccount", "ResourceQuota", "LimitRange", "ConfigMap", "Role", "RoleBinding", "LocalQueue"}
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUOTA_RESOURCE = re.compile(
    r"^(pods|services|secrets|configmaps|persistentvolumeclaims|replicationcontrollers|resourcequotas"
    r"|(requests\.|limits\.)?(cpu|memory|ephemeral-storage)|requests\.storage"
    r"|requests\.[a-z0-9.-]+/[a-z0-9.-]+|count/[a-z0-9.-]+)$"
)


def model_errors(obj: Any, type_name: str, path: str = "") -> list[str]:
    """Unknown fields and wrong types of ``obj`` read as the client model ``type_name``."""
    if type_name.startswith("List["):
        if not isinstance(obj, list):
            return [f"{path}: expected a list, got {type(obj).__name__}"]
        return [e for i, item in enumerate(obj) for e in model_errors(item, type_name[5:-1], f"{path}[{i}]")]
    if type_name.startswith("Dict[str, "):
        if not isinstance(obj, dict):
            return [f"{path}: expected a mapping, got {type(obj).__name__}"]
        return [e for k, v in obj.items() for e in model_errors(v, type_name[10:-1], f"{path}.{k}")]
    if type_name == "object":
        return []
    if type_name in PRIMITIVES:
        wanted = PRIMITIVES[type_name]
        if isinstance(obj, bool) and type_name != "bool" or not isinstance(obj, wanted):
            return [f"{path}: expected {type_name}, got {type(obj).__name__} {obj!r}"]
        return []
    model = getattr(k8s, type_name)
    if not isinstance(obj, dict):
        return [f"{path}: expected a {type_name} mapping, got {type(obj).__name__}"]
    wire = {json_key: attr for attr, json_key in model.attribute_map.items()}
    errors = []
    for key, value in obj.items():
        if key not in wire:
            errors.append(f"{path}.{key}: unknown field of {type_name}")
        else:
            errors += model_errors(value, model.openapi_types[wire[key]], f"{path}.{key}")
    return errors


def k8s_model_errors(obj: Any, model_name: str, path: str = "") -> list[str]:
    """Field names and types, then required fields and strict types through ``Model.from_dict``."""
    errors = model_errors(obj, model_name, path)
    if not errors:
        try:
            getattr(k8s, model_name).from_dict(obj)
        except Exception as e:  # pydantic.ValidationError: required field missing, wrong type
            errors.append(f"{path}: {model_name}: {' '.join(str(e).split())[:300]}")
    return errors


def metadata_errors(obj: dict, where: str) -> list[str]:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return [f"{where}: metadata missing"]
    errors = k8s_model_errors(meta, "V1ObjectMeta", f"{where}.metadata")
    name = meta.get("name")
    kind = obj.get("kind")
    pattern = DNS1123_LABEL if kind == "Namespace" else DNS1123_SUBDOMAIN
    if not isinstance(name, str) or not pattern.match(name) or len(name) > (63 if kind == "Namespace" else 253):
        errors.append(f"{where}: metadata.name {name!r} is not a valid {kind} name")
    if kind in NAMESPACED and not meta.get("namespace"):
        errors.append(f"{where}: {kind} is namespaced but has no metadata.namespace")
    if kind not in NAMESPACED and "namespace" in meta:
        errors.append(f"{where}: {kind} is cluster-scoped but has metadata.namespace")
    return errors


def core_object_errors(obj: Any, where: str = "object") -> list[str]:
    if not isinstance(obj, dict):
        return [f"{where}: not a mapping"]
    model = CORE_KINDS.get((obj.get("apiVersion"), obj.get("kind")))
    if model is None:
        return [f"{where}: unknown apiVersion/kind {obj.get('apiVersion')}/{obj.get('kind')}"]
    if "status" in obj:
        return [f"{where}: status does not belong in a manifest"]
    errors = k8s_model_errors(obj, model, where) + metadata_errors(obj, where)
    if obj["kind"] == "ResourceQuota" and not errors:
        for res, qty in (obj.get("spec") or {}).get("hard", {}).items():
            if not QUOTA_RESOURCE.match(res):
                errors.append(f"{where}: {res!r} is not a resource a ResourceQuota can limit")
            try:
                parse_quantity(qty)
            except ValueError:
                errors.append(f"{where}: {res}: {qty!r} is not a quantity")
    return errors


# ----------------------------------------------------------------------------------------------
# Kueue objects, validated against infra/schemas/*.json

KUEUE_SCHEMAS = {
    "ResourceFlavor": "resourceflavor.json",
    "ClusterQueue": "clusterqueue.json",
    "LocalQueue": "localqueue.json",
    "WorkloadPriorityClass": "workloadpriorityclass.json",
}


@cache
def validator(schema_file: str) -> jsonschema.protocols.Validator:
    schema = load_json(f"schemas/{schema_file}")
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def schema_errors(obj: Any, schema_file: str, where: str) -> list[str]:
    return [
        f"{where}: {'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in sorted(validator(schema_file).iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    ]


def kueue_object_errors(obj: Any, where: str = "object") -> list[str]:
    if not isinstance(obj, dict) or obj.get("kind") not in KUEUE_SCHEMAS:
        return [f"{where}: not a Kueue object this deployment uses"]
    errors = schema_errors(obj, KUEUE_SCHEMAS[obj["kind"]], where)
    if isinstance(obj.get("metadata"), dict):
        errors += metadata_errors(obj, where)
    return errors


def object_errors(obj: Any, where: str = "object") -> list[str]:
    """Any manifest of this deployment: Kueue objects by schema, the rest by the Kubernetes models."""
    if isinstance(obj, dict) and str(obj.get("apiVersion", "")).startswith("kueue.x-k8s.io/"):
        return kueue_object_errors(obj, where)
    return core_object_errors(obj, where)


# ----------------------------------------------------------------------------------------------
# Label selectors and quantities


def selector_matches(selector: dict | None, labels: dict[str, str]) -> bool:
    """metav1.LabelSelector semantics: None selects nothing, {} selects everything."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def qty(value: Any) -> float:
    return float(parse_quantity(value))


# ----------------------------------------------------------------------------------------------
# IAM identity policies for S3

OBJECT_READ = {"s3:GetObject"}
OBJECT_WRITE = {"s3:PutObject", "s3:AbortMultipartUpload"}
OBJECT_DELETE = {"s3:DeleteObject"}
BUCKET_LIST = {"s3:ListBucket"}
S3_ARN = "arn:aws:s3:::"


@dataclass
class RoleSpec:
    """What a role may do: S3 locations as ``bucket/prefix/`` (a bucket alone for ListBucket)."""

    read: set[str] = field(default_factory=set)
    write: set[str] = field(default_factory=set)
    delete: set[str] = field(default_factory=set)
    list: set[str] = field(default_factory=set)


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def policy_errors(doc: Any, spec: RoleSpec) -> list[str]:
    """Everything the policy grants beyond ``spec``, and any construct that hides what it grants."""
    if not isinstance(doc, dict) or doc.get("Version") != "2012-10-17":
        return ['policy: Version must be "2012-10-17"']
    statements = doc.get("Statement")
    if not isinstance(statements, list) or not statements:
        return ["policy: Statement must be a non-empty list"]
    errors = []
    allowed = {**{a: spec.read for a in OBJECT_READ}, **{a: spec.write for a in OBJECT_WRITE}}
    allowed |= {a: spec.delete for a in OBJECT_DELETE} | {a: spec.list for a in BUCKET_LIST}
    for i, st in enumerate(statements):
        where = f"Statement[{i}] {st.get('Sid', '')}".strip()
        extra = set(st) - {"Sid", "Effect", "Action", "Resource"}
        if extra:
            errors.append(f"{where}: unexpected {sorted(extra)} (NotAction/NotResource/Condition/Principal hide grants)")
        if st.get("Effect") != "Allow":
            errors.append(f"{where}: only Allow statements are expected")
        for action in _as_list(st.get("Action", [])):
            if action not in allowed:
                errors.append(f"{where}: action {action!r} is not an explicit, known S3 action for this store")
                continue
            for resource in _as_list(st.get("Resource", [])):
                if not isinstance(resource, str) or not resource.startswith(S3_ARN):
                    errors.append(f"{where}: resource {resource!r} is not an S3 ARN")
                    continue
                path = resource[len(S3_ARN) :]
                if any(c in path[:-1] for c in "*?") or path in ("", "*"):
                    errors.append(f"{where}: resource {resource!r} has a wildcard before its end")
                    continue
                if action in BUCKET_LIST:
                    if "/" in path or path not in spec.list:
                        errors.append(f"{where}: {action} on {resource!r}: role may list only {sorted(spec.list)}")
                    continue
                if "/" not in path:
                    errors.append(f"{where}: {action} needs object ARNs (bucket/key), got bucket {resource!r}")
                    continue
                prefix = path.removesuffix("*")
                if not any(prefix.startswith(p) for p in allowed[action]):
                    errors.append(f"{where}: {action} on {resource!r} is outside {sorted(allowed[action]) or 'nothing'}")
    return errors


def policy_allows(doc: dict, action: str, arn: str) -> bool:
    """Whether an Allow statement matches (IAM wildcard matching; the checked policies have no conditions)."""
    for st in doc["Statement"]:
        if st.get("Effect") == "Allow" and "Condition" not in st:
            actions = [a.lower() for a in _as_list(st.get("Action", []))]
            if any(fnmatch.fnmatchcase(action.lower(), a) for a in actions):
                if any(fnmatch.fnmatchcase(arn, r) for r in _as_list(st.get("Resource", []))):
                    return True
    return False


# ----------------------------------------------------------------------------------------------
# Flyte: Helm tpl escapes and cluster resource templates

HELM_RAW = re.compile(r"\{\{`(.*?)`\}\}", re.S)
FLYTE_VAR = re.compile(r"\{\{ ?([A-Za-z0-9_]+) ?\}\}")


def helm_tpl(value: Any, path: str = "") -> tuple[Any, list[str]]:
    """``value`` as Helm's ``tpl`` renders it, for values that use only raw-string escapes ``{{`...`}}``.

    Any other ``{{`` would be evaluated by Helm (``{{ project }}`` fails: function "project" not defined).
    """
    if isinstance(value, dict):
        out, errors = {}, []
        for k, v in value.items():
            out[k], e = helm_tpl(v, f"{path}.{k}")
            errors += e
        return out, errors
    if isinstance(value, list):
        rendered = [helm_tpl(v, f"{path}[{i}]") for i, v in enumerate(value)]
        return [r for r, _ in rendered], [e for _, es in rendered for e in es]
    if isinstance(value, str):
        if "{{" in HELM_RAW.sub("", value) or "}}" in HELM_RAW.sub("", value):
            return value, [f"{path}: {value!r} would be evaluated by Helm's tpl: escape it as {{{{`...`}}}}"]
        return HELM_RAW.sub(lambda m: m.group(1), value), []
    return value, []


def custom_data(values: dict) -> dict[str, dict[str, str]]:
    """cluster_resources.customData as {domain: {variable: value}}."""
    out: dict[str, dict[str, str]] = {}
    for entry in values["configuration"]["inline"]["cluster_resources"]["customData"]:
        for domain, variables in entry.items():
            for var in variables:
                for name, source in var.items():
                    assert set(source) == {"value"}, f"customData {domain}.{name}: expected {{value: ...}}, got {source}"
                    out.setdefault(domain, {})[name] = str(source["value"])
    return out


def render_flyte_template(text: str, project: str, domain: str, namespace: str, data: dict[str, str]) -> tuple[str, list]:
    """What flyteadmin's cluster resource controller applies: literal ``{{ var }}`` substitution."""
    variables = {"namespace": namespace, "project": project, "domain": domain, **data}
    for name, value in variables.items():
        text = text.replace(f"{{{{ {name} }}}}", value)
    return text, sorted(set(FLYTE_VAR.findall(text)))


def namespace_for(values: dict, project: str, domain: str) -> str:
    template, errors = helm_tpl(values["configuration"]["inline"]["namespace_mapping"]["template"])
    assert not errors, errors
    return template.replace("{{ project }}", project).replace("{{ domain }}", domain)


@cache
def flyte_values() -> dict:
    (values,) = load_docs("flyte/values.yaml")
    return values


def rendered_cluster_resources(project: str = PROJECT) -> dict[str, list[tuple[str, dict]]]:
    """{namespace: [(template file, object)]} as Flyte's cluster resource manager renders them."""
    values = flyte_values()
    data = custom_data(values)
    out: dict[str, list[tuple[str, dict]]] = {}
    for domain in DOMAINS:
        namespace = namespace_for(values, project, domain)
        for name, text in sorted(values["clusterResourceTemplates"]["inline"].items()):
            rendered, unresolved = render_flyte_template(text, project, domain, namespace, data.get(domain, {}))
            assert not unresolved, f"{name} in {domain}: no value for {unresolved} in customData"
            out.setdefault(namespace, []).append((name, yaml.safe_load(rendered)))
    return out


# ----------------------------------------------------------------------------------------------
# What registration produces: cluster profiles, labels, images

CLUSTER_PROFILES = sorted((ROOT / "configs" / "cluster").glob("*.yaml"))
REGISTERED_PROFILE = ROOT / "configs" / "cluster" / "gpu-2x8.yaml"  # the profile infra/README.md registers with
FACTS_SCRIPT = """
import dataclasses, json, sys
from pipeline.cluster import load_cluster
from tasks import placement
from workflows.pretrain import pretrain_default, pretrain_nightly

def image(spec):
    fields = [f.name for f in dataclasses.fields(spec)]
    return {name: getattr(spec, name) for name in fields if isinstance(getattr(spec, name), (str, list, type(None)))}

profiles = {}
for path in sys.argv[1:]:
    cluster = load_cluster(path)
    image_spec = placement.training_image(cluster)
    kinds = {"data": placement.data_task, "train": placement.train_task,
             "evaluate": placement.evaluate_task, "registry": placement.registry_task}
    profiles[path] = {
        "pod_labels": placement.train_task(cluster)["pod_template"].labels,
        "service_accounts": {k: f(cluster)["pod_template"].pod_spec.service_account_name for k, f in kinds.items()},
        "training_image": image(image_spec),
    }
plans = {"pretrain_default": pretrain_default, "pretrain_nightly": pretrain_nightly}
print(json.dumps({
    "launch_plan_labels": {name: plan.labels.values for name, plan in plans.items()},
    "module_pod_labels": placement.train_task()["pod_template"].labels,
    "profiles": profiles,
    "cuda_base": placement.CUDA_BASE,
    "train_packages": placement.TRAIN_PACKAGES,
    "python": "%d.%d" % sys.version_info[:2],
}))
"""


@cache
def cluster_profiles() -> dict[str, Any]:
    """Each configs/cluster/*.yaml as pipeline.cluster.load_cluster reads it."""
    from pipeline.cluster import load_cluster

    return {p.stem: load_cluster(str(p)) for p in CLUSTER_PROFILES}


@cache
def registration_facts() -> dict[str, Any]:
    """What `PRETRAIN_CLUSTER=configs/cluster/gpu-2x8.yaml pyflyte register` sees, from a fresh interpreter
    (the launch plans' labels are fixed at import): the launch plans' labels, and for every profile the
    labels of tasks.placement.pod_template() and the training ImageSpec."""
    import os
    import subprocess
    import sys

    command = [sys.executable, "-c", FACTS_SCRIPT, *map(str, CLUSTER_PROFILES)]
    env = {**os.environ, "PRETRAIN_CLUSTER": str(REGISTERED_PROFILE)}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    facts["profiles"] = {Path(path).stem: f for path, f in facts["profiles"].items()}
    return facts


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
        "images/Dockerfile.train",
        *(f"iam/{d}/{r}.json" for d in DOMAINS for r in ("data", "train", "registry", "reader")),
        *(f"iam/trust/{d}/{r}.json" for d in DOMAINS for r in ("data", "train", "registry", "reader")),
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


def test_core_checker_accepts_good_objects():
    for good in (NAMESPACE, QUOTA, SERVICE_ACCOUNT):
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
