"""Flyte (flyte-binary values, flytectl project-domain attributes), the training operator chart values, and the
MLflow servers' chart values with the tracking URI the task pods get."""

from __future__ import annotations

import copy
import json
import re
from urllib.parse import urlsplit

import pytest
from flyteidl.admin import matchable_resource_pb2
from google.protobuf.json_format import ParseDict, ParseError

from tests.helpers import (
    DOMAINS,
    INFRA,
    MLFLOW_CHART_VERSION,
    MLFLOW_NAMESPACE,
    PRETRAIN_NAMESPACES,
    PROJECT,
    by_name,
    chart_fullname,
    cluster_profiles,
    custom_data,
    flyte_values,
    helm_tpl,
    k8s_model_errors,
    load_docs,
    mlflow_release,
    mlflow_values,
    namespace_for,
    objects,
    qty,
    render_flyte_template,
    rendered_cluster_resources,
)

ATTRIBUTES = INFRA / "flyte" / "project-domain-attributes"
GPU = "nvidia.com/gpu"

# Keys of the chart values this deployment may set: a dict nests, a set lists leaf keys, None is free-form.
FLYTE_BINARY_KEYS = {
    "nameOverride": None,
    "fullnameOverride": None,
    "commonLabels": None,
    "commonAnnotations": None,
    "flyte-core-components": {
        "admin": {"disabled", "disableScheduler", "disableClusterResourceManager", "seedProjects"},
        "propeller": {"disabled", "disableWebhook"},
        "dataCatalog": {"disabled"},
    },
    "configuration": {
        "database": {"username", "password", "passwordPath", "host", "port", "dbname", "options"},
        "storage": {
            "metadataContainer": None,
            "userDataContainer": None,
            "provider": None,
            "providerConfig": {
                "s3": {"region", "disableSSL", "v2Signing", "endpoint", "authType", "accessKey", "secretKey"},
                "gcs": None,
                "azure": None,
            },
        },
        "logging": {"level": None, "plugins": {"kubernetes": None, "cloudwatch": None, "stackdriver": None, "custom": None}},
        "auth": {
            "enabled": None,
            "enableAuthServer": None,
            "oidc": {"baseUrl", "clientId", "clientSecret"},
            "internal": {"clientId", "clientSecret", "clientSecretHash", "audience"},
            "flyteClient": {"clientId", "redirectUri", "scopes", "audience"},
            "authorizedUris": None,
            "clientSecretsExternalSecretRef": None,
        },
        "co-pilot": None,
        "agentService": None,
        "externalConfigMap": None,
        "externalSecretRef": None,
        "inline": None,  # Flyte's own configuration: checked by INLINE_KEYS
        "inlineConfigMap": None,
        "inlineSecretRef": None,
        "labels": None,
        "annotations": None,
    },
    "clusterResourceTemplates": {"externalConfigMap", "inline", "inlineConfigMap", "labels", "annotations"},
    "deployment": {
        "image",
        "extraEnvVars",
        "extraEnvVarsConfigMap",
        "extraEnvVarsSecret",
        "command",
        "args",
        "livenessProbe",
        "readinessProbe",
        "startupProbe",
        "lifecycleHooks",
        "resources",
        "podSecurityContext",
        "waitForDB",
        "genAdminAuthSecret",
        "labels",
        "annotations",
        "podLabels",
        "podAnnotations",
        "extraVolumeMounts",
        "extraVolumes",
        "sidecars",
        "initContainers",
        "extraPodSpec",
    },  # fmt: skip
    "service": None,
    "ingress": {
        "create",
        "labels",
        "host",
        "separateGrpcIngress",
        "commonAnnotations",
        "httpAnnotations",
        "grpcAnnotations",
        "ingressClassName",
        "httpIngressClassName",
        "grpcIngressClassName",
        "tls",
        "httpTls",
        "grpcTls",
        "httpExtraPaths",
        "grpcExtraPaths",
    },  # fmt: skip
    "rbac": {"create", "labels", "annotations", "extraRules"},
    "serviceAccount": {"create", "name", "labels", "annotations", "imagePullSecrets"},
    "flyteagent": None,
    "enabled_plugins": {"tasks": {"task-plugins": {"enabled-plugins", "default-for-task-types"}}},
}
# Sections of Flyte's configuration (flyteadmin, flytepropeller, flyteplugins) used in configuration.inline
INLINE_KEYS = {
    "namespace_mapping": {"template"},
    "task_resources": {"defaults": {"cpu", "memory", "gpu", "storage", "ephemeralStorage"}, "limits": None},
    "cluster_resources": {"templatePath", "customData", "refreshInterval", "standaloneDeployment"},
    "propeller": {
        "rawoutput-prefix",
        "metadata-prefix",
        "workers",
        "max-workflow-retries",
        "workflow-reeval-duration",
        "downstream-eval-duration",
        "limit-namespace",
        "gc-interval",
        "max-ttl-hours",
        "literal-offloading-config",
    },  # fmt: skip
    "plugins": {
        "k8s": {
            "inject-finalizer",
            "gpu-resource-name",
            "resource-tolerations",
            "default-labels",
            "default-annotations",
            "default-env-vars",
            "default-env-vars-from-env",
            "default-node-selector",
            "default-tolerations",
            "default-affinity",
            "scheduler-name",
            "interruptible-tolerations",
            "interruptible-node-selector",
            "interruptible-node-selector-requirement",
            "non-interruptible-node-selector-requirement",
            "default-pod-template-name",
            "default-pod-security-context",
            "default-security-context",
            "default-cpus",
            "default-memory",
            "co-pilot",
            "delete-resource-on-finalize",
            "create-container-error-grace-period",
            "image-pull-backoff-grace-period",
            "pod-pending-timeout",
        },  # fmt: skip
        "logs": None,
        "k8s-array": None,
        "kf-operator": {"timeout"},
    },
    "tasks": None,
    "storage": None,
    "flyteadmin": None,
    "auth": None,
    "server": None,
    "scheduler": None,
    "logger": None,
    "otel": None,
}
TRAINING_OPERATOR_KEYS = {
    "nameOverride": None,
    "fullnameOverride": None,
    "commonLabels": None,
    "image": {"registry", "repository", "tag", "pullPolicy", "pullSecrets"},
    "replicas": None,
    "serviceAccount": {"create", "name", "annotations"},
    "rbac": {"create", "annotations"},
    "service": {"type", "port"},
    **dict.fromkeys(["labels", "annotations", "sidecars", "volumes", "nodeSelector", "affinity", "tolerations"]),
    **dict.fromkeys(["priorityClassName", "podSecurityContext", "env", "envFrom", "volumeMounts", "resources"]),
    "securityContext": None,
}


def key_errors(values: dict, shape: dict | set | None, path: str = "") -> list[str]:
    if shape is None or not isinstance(values, dict):
        return []
    if isinstance(shape, set):
        return [f"{path}.{k}: unknown key" for k in values if k not in shape]
    errors = []
    for key, value in values.items():
        if key not in shape:
            errors.append(f"{path}.{key}: unknown key")
        else:
            errors += key_errors(value, shape[key], f"{path}.{key}")
    return errors


def attribute_file(domain: str, kind: str) -> dict:
    (doc,) = load_docs(f"flyte/project-domain-attributes/{domain}-{kind}.yaml")
    return copy.deepcopy(doc)


def parse_attributes(doc: dict, message) -> object:
    """A flytectl --attrFile document as flytectl reads it: project/domain plus the message's own fields, strictly."""
    body = {k: v for k, v in doc.items() if k not in ("project", "domain", "workflow")}
    return ParseDict(body, message(), ignore_unknown_fields=False)


def inline() -> dict:
    return flyte_values()["configuration"]["inline"]


# ----------------------------------------------------------------------------------------------
# flyte-binary values


def test_flyte_values_use_known_keys():
    values = flyte_values()
    errors = key_errors(values, FLYTE_BINARY_KEYS) + key_errors(inline(), INLINE_KEYS, ".configuration.inline")
    assert not errors, errors


def test_pytorch_plugin_is_enabled_and_the_default_for_pytorch_tasks():
    plugins = flyte_values()["enabled_plugins"]["tasks"]["task-plugins"]
    assert {"container", "sidecar", "k8s-array", "pytorch"} <= set(plugins["enabled-plugins"])
    assert plugins["default-for-task-types"]["pytorch"] == "pytorch"
    assert set(plugins["default-for-task-types"].values()) <= set(plugins["enabled-plugins"])
    multi_node = [name for name, p in cluster_profiles().items() if p.nnodes >= 2]
    assert multi_node, "a profile that registers the train task as a PyTorchJob (type pytorch)"


def test_storage_is_an_s3_bucket_the_roles_can_use():
    storage = flyte_values()["configuration"]["storage"]
    assert storage["provider"] == "s3" and storage["providerConfig"]["s3"]["region"]
    assert storage["providerConfig"]["s3"]["authType"] == "iam", "credentials come from IRSA, not keys in values"
    bucket = storage["metadataContainer"]
    assert storage["userDataContainer"] == bucket == "pretrain-flyte"
    propeller = inline()["propeller"]
    assert propeller["rawoutput-prefix"] == f"s3://{bucket}/data"
    assert propeller["metadata-prefix"] == "metadata/propeller"
    backend = json.loads((INFRA / "iam" / "flyte-backend.json").read_text())
    assert any(f"arn:aws:s3:::{bucket}/*" in st["Resource"] for st in backend["Statement"])
    for domain in DOMAINS:
        # each domain's runs write raw outputs under <project>/<domain>/, metadata under <project>-<domain>-<name>/
        raw = attribute_file(domain, "execution-config")["raw_output_data_config"]["output_location_prefix"]
        assert raw == f"s3://{bucket}/{PROJECT}/{domain}/data"
        for role in ("data", "train", "registry"):
            policy = json.loads((INFRA / "iam" / domain / f"{role}.json").read_text())
            writes = {r for st in policy["Statement"] if "s3:PutObject" in st["Action"] for r in st["Resource"]}
            expected = {
                f"arn:aws:s3:::{bucket}/{PROJECT}/{domain}/*",
                f"arn:aws:s3:::{bucket}/metadata/propeller/{PROJECT}-{domain}-*",
            }
            assert expected <= writes, (domain, role)


def test_namespace_mapping_is_project_dash_domain_and_helm_safe():
    _, errors = helm_tpl(inline(), "configuration.inline")
    assert not errors, errors
    rendered, _ = helm_tpl(inline()["namespace_mapping"]["template"])
    assert rendered == "{{ project }}-{{ domain }}"
    assert tuple(namespace_for(flyte_values(), PROJECT, d) for d in DOMAINS) == PRETRAIN_NAMESPACES


def test_pretrain_project_is_seeded():
    assert PROJECT in flyte_values()["flyte-core-components"]["admin"]["seedProjects"]


def test_cluster_resource_templates_render_the_checked_in_manifests():
    """What Flyte's cluster resource manager applies in each pretrain namespace equals infra/k8s + the LocalQueues."""
    checked_in = (
        objects("k8s/namespaces.yaml") + objects("k8s/resource-quotas.yaml") + objects("k8s/service-accounts.yaml")
    ) + objects("kueue/local-queues.yaml")
    checked_in += objects("k8s/mlflow.yaml")  # the ExternalName Service `mlflow` of each pretrain namespace

    def namespace_of(obj):
        return obj["metadata"]["name"] if obj["kind"] == "Namespace" else obj["metadata"]["namespace"]

    for namespace, rendered in rendered_cluster_resources().items():
        ours = sorted(json.dumps(o, sort_keys=True) for o in checked_in if namespace_of(o) == namespace)
        flytes = sorted(json.dumps(o, sort_keys=True) for _, o in rendered)
        assert flytes == ours, f"{namespace}: Flyte's templates and the checked-in manifests differ"


def test_custom_data_defines_every_template_variable_in_every_domain():
    data = custom_data(flyte_values())
    assert set(data) == set(DOMAINS)
    templates = flyte_values()["clusterResourceTemplates"]["inline"]
    for domain in DOMAINS:
        for name, text in templates.items():
            _, unresolved = render_flyte_template(text, PROJECT, domain, f"{PROJECT}-{domain}", data[domain])
            assert not unresolved, f"{name} in {domain}: no customData for {unresolved}"
    broken = {k: v for k, v in data["staging"].items() if k != "projectQuotaNvidiaGpu"}
    _, unresolved = render_flyte_template(templates["002_resource_quota.yaml"], PROJECT, "staging", "pretrain-staging", broken)
    assert unresolved == ["projectQuotaNvidiaGpu"]


def test_kubernetes_pieces_of_the_values_validate():
    values = flyte_values()
    errors = []
    for i, rule in enumerate(values["rbac"]["extraRules"]):
        errors += k8s_model_errors(rule, "V1PolicyRule", f"rbac.extraRules[{i}]")
    for i, volume in enumerate(values["deployment"]["extraVolumes"]):
        errors += k8s_model_errors(volume, "V1Volume", f"deployment.extraVolumes[{i}]")
    for i, mount in enumerate(values["deployment"]["extraVolumeMounts"]):
        errors += k8s_model_errors(mount, "V1VolumeMount", f"deployment.extraVolumeMounts[{i}]")
    errors += k8s_model_errors(values["deployment"]["resources"], "V1ResourceRequirements", "deployment.resources")
    for i, tls in enumerate(values["ingress"]["tls"]):
        errors += k8s_model_errors(tls, "V1IngressTLS", f"ingress.tls[{i}]")
    tolerations = inline()["plugins"]["k8s"]["resource-tolerations"]
    for res, items in tolerations.items():
        errors += [e for t in items for e in k8s_model_errors(t, "V1Toleration", f"resource-tolerations.{res}")]
    assert not errors, errors
    password = values["configuration"]["database"]["passwordPath"]
    assert any(password.startswith(m["mountPath"] + "/") for m in values["deployment"]["extraVolumeMounts"])


def test_control_plane_may_manage_what_the_templates_and_plugins_create():
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in flyte_values()["rbac"]["extraRules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    needed = {("kubeflow.org", "pytorchjobs")}
    for _, text in flyte_values()["clusterResourceTemplates"]["inline"].items():
        rendered, _ = render_flyte_template(text, PROJECT, "development", "pretrain-development", {})
        kind = rendered.split("kind:")[1].split()[0]
        group = rendered.split("apiVersion:")[1].split()[0].rpartition("/")[0]
        if kind != "Namespace":  # the chart's own ClusterRole covers namespaces
            needed.add((group, kind.lower() + "s"))
    for key in needed:
        assert {"create", "get", "list", "patch", "update"} <= granted.get(key, set()), f"no RBAC for {key}"


def test_every_pod_of_a_flyte_task_enters_kueue_and_requests_only_covered_resources():
    k8s_plugin = inline()["plugins"]["k8s"]
    profiles = cluster_profiles().values()
    assert k8s_plugin["default-labels"]["kueue.x-k8s.io/queue-name"] in {p.queue for p in profiles}
    assert k8s_plugin["gpu-resource-name"] == GPU and set(k8s_plugin["resource-tolerations"]) == {GPU}
    # Flyte turns a non-zero default into a pod request; Kueue admits only covered resources.
    flyte_to_k8s = {"cpu": "cpu", "memory": "memory", "gpu": GPU, "ephemeralStorage": "ephemeral-storage"}
    flyte_to_k8s |= {"ephemeral_storage": "ephemeral-storage", "storage": "ephemeral-storage"}
    defaults = [inline()["task_resources"]["defaults"]] + [attribute_file(d, "task-resources")["defaults"] for d in DOMAINS]
    requested = {flyte_to_k8s[k] for d in defaults for k, v in d.items() if qty(v) > 0}
    for cq in objects("kueue/cluster-queues.yaml", "ClusterQueue"):
        covered = {r for g in cq["spec"]["resourceGroups"] for r in g["coveredResources"]}
        assert requested | {GPU} <= covered, f"{cq['metadata']['name']} does not cover {requested - covered}"


# ----------------------------------------------------------------------------------------------
# flytectl project-domain attributes


@pytest.mark.parametrize("domain", DOMAINS)
def test_task_resource_attributes_parse_and_fit_the_profiles(domain):
    doc = attribute_file(domain, "task-resources")
    assert (doc["project"], doc["domain"]) == (PROJECT, domain)
    attrs = parse_attributes(doc, matchable_resource_pb2.TaskResourceAttributes)
    limits, defaults = attrs.limits, attrs.defaults
    for name in ("cpu", "memory", "gpu"):
        assert qty(getattr(defaults, name) or 0) <= qty(getattr(limits, name)), f"{domain}: default {name} above limit"
    global_limits = inline()["task_resources"]["limits"]
    for name in ("cpu", "memory", "gpu"):
        assert qty(getattr(limits, name)) <= qty(global_limits[name]), f"{domain}: {name} limit above Flyte's global limit"
    for profile_name, p in cluster_profiles().items():
        for what, cpu, mem in (("train", p.train_cpu, p.train_memory), ("data", p.data_cpu, p.data_memory)):
            where = f"{domain}: {profile_name} {what} task"
            assert qty(cpu) <= qty(limits.cpu), f"{where} requests {cpu} CPU > limit {limits.cpu}"
            assert qty(mem) <= qty(limits.memory), f"{where} requests {mem} > limit {limits.memory}"
        assert p.gpus_per_node <= qty(limits.gpu), f"{domain}: {profile_name} needs {p.gpus_per_node} GPUs per pod"


@pytest.mark.parametrize("domain", DOMAINS)
def test_execution_configs_parse_and_label_runs_for_kueue(domain):
    doc = attribute_file(domain, "execution-config")
    assert (doc["project"], doc["domain"]) == (PROJECT, domain)
    config = parse_attributes(doc, matchable_resource_pb2.WorkflowExecutionConfig)
    labels = dict(config.labels.values)
    classes = by_name(objects("kueue/priority-classes.yaml", "WorkloadPriorityClass"))
    assert labels["kueue.x-k8s.io/queue-name"] in {p.queue for p in cluster_profiles().values()}
    assert labels["kueue.x-k8s.io/priority-class"] in classes
    assert config.max_parallelism > 0


@pytest.mark.parametrize(
    "kind, edit, message",
    [
        ("task-resources", lambda d: d["limits"].update(cpus="8"), "cpus"),
        ("task-resources", lambda d: d["limits"].update(gpu=8), "gpu"),
        ("task-resources", lambda d: d.update(default=d.pop("defaults")), "default"),
        ("execution-config", lambda d: d.update(label=d.pop("labels")), "label"),
        ("execution-config", lambda d: d.update(labels=d["labels"]["values"]), "kueue.x-k8s.io"),
        ("execution-config", lambda d: d.update(max_parallelism="many"), "max_parallelism"),
    ],
)
def test_attribute_parser_rejects_bad_files(kind, edit, message):
    doc = attribute_file("production", kind)
    edit(doc)
    message_type = {
        "task-resources": matchable_resource_pb2.TaskResourceAttributes,
        "execution-config": matchable_resource_pb2.WorkflowExecutionConfig,
    }[kind]
    with pytest.raises(ParseError, match=message):
        parse_attributes(doc, message_type)


def test_key_checker_rejects_misspelt_keys():
    values = copy.deepcopy(flyte_values())
    values["configuraton"] = values.pop("configuration")
    values["enabled_plugins"]["tasks"]["task-plugins"]["enabled_plugins"] = ["pytorch"]
    errors = key_errors(values, FLYTE_BINARY_KEYS)
    assert ".configuraton: unknown key" in errors and ".enabled_plugins.tasks.task-plugins.enabled_plugins: unknown key" in errors
    bad_inline = {**inline(), "namespace_maping": {"template": "x"}}
    assert key_errors(bad_inline, INLINE_KEYS) == [".namespace_maping: unknown key"]


# ----------------------------------------------------------------------------------------------
# Training operator chart values


def test_training_operator_values():
    (values,) = load_docs("training-operator/values.yaml")
    assert not key_errors(values, TRAINING_OPERATOR_KEYS), key_errors(values, TRAINING_OPERATOR_KEYS)
    assert values["image"]["repository"] == "kubeflow/training-operator"
    assert values["image"]["tag"] not in ("", "latest") and values["image"]["tag"].startswith("v1.")
    errors = k8s_model_errors(values["securityContext"], "V1SecurityContext", "securityContext")
    errors += k8s_model_errors(values["podSecurityContext"], "V1PodSecurityContext", "podSecurityContext")
    errors += k8s_model_errors(values["resources"], "V1ResourceRequirements", "resources")
    assert not errors, errors
    cpu_pool = by_name(objects("kueue/resource-flavors.yaml", "ResourceFlavor"))["cpu"]["spec"]["nodeLabels"]
    assert values["nodeSelector"].items() <= cpu_pool.items(), "the operator runs on the CPU pool"


# ----------------------------------------------------------------------------------------------
# MLflow: the chart values of each domain's server (infra/mlflow) and the tracking URI of the task pods

# Keys of the community-charts mlflow chart this deployment may set (as FLYTE_BINARY_KEYS): a misspelt
# key is silently ignored by Helm, e.g. a `backendStore.postgress` would leave the in-memory SQLite.
MLFLOW_CHART_KEYS = {
    **dict.fromkeys(["replicaCount", "nameOverride", "fullnameOverride", "imagePullSecrets", "strategy"]),
    "image": {"repository", "pullPolicy", "tag"},
    "serviceAccount": {"create", "automount", "annotations", "name"},
    **dict.fromkeys(["podAnnotations", "extraPodLabels", "podSecurityContext", "securityContext"]),
    "service": {"enabled", "type", "port", "name", "annotations"},
    "ingress": {"enabled", "className", "annotations", "hosts", "tls"},
    "log": {"enabled", "level"},
    "telemetry": {"enabled"},
    "backendStore": {
        **dict.fromkeys(["databaseMigration", "databaseConnectionCheck", "defaultSqlitePath"]),
        "postgres": {"enabled", "host", "port", "database", "user", "password", "driver"},
        "existingDatabaseSecret": {"name", "usernameKey", "passwordKey"},
    },
    "postgresql": None,  # the Bitnami subchart's own values
    "mysql": None,
    "artifactRoot": {
        **dict.fromkeys(["proxiedArtifactStorage", "defaultArtifactRoot", "defaultArtifactsDestination"]),
        "s3": {"enabled", "bucket", "path", "awsAccessKeyId", "awsSecretAccessKey", "existingSecret"},
        "azureBlob": None,
        "gcs": None,
    },
    **dict.fromkeys(["extraArgs", "extraFlags", "extraEnvVars", "extraSecretNamesForEnvFrom", "serviceMonitor"]),
    **dict.fromkeys(["extraVolumes", "extraVolumeMounts", "flaskServerSecretKey"]),
    "auth": {
        **dict.fromkeys(["enabled", "adminUsername", "adminPassword", "defaultPermission", "appName"]),
        **dict.fromkeys(["authorizationFunction", "sqliteFile", "sqliteFullPath", "configPath", "configFile"]),
        "existingAdminSecret": {"name", "usernameKey", "passwordKey"},
        "postgres": {
            **dict.fromkeys(["enabled", "host", "port", "database", "user", "password", "driver"]),
            "existingSecret": {"name", "usernameKey", "passwordKey"},
        },
    },
    **dict.fromkeys(["resources", "nodeSelector", "tolerations", "affinity", "livenessProbe", "readinessProbe"]),
}
SECRET_KEYS = re.compile(r"password|secret|accesskey", re.IGNORECASE)


def tracking_uri() -> str:
    """MLFLOW_TRACKING_URI of every task pod (plugins.k8s.default-env-vars)."""
    env = {k: v for item in inline()["plugins"]["k8s"]["default-env-vars"] for k, v in item.items()}
    return env["MLFLOW_TRACKING_URI"]


def inline_secrets(values, path: str = "") -> list[str]:
    """Every non-empty value under a key that names a credential (not the names of a Secret's keys)."""
    if isinstance(values, dict):
        return [e for k, v in values.items() if not k.startswith("existing") for e in inline_secrets(v, f"{path}.{k}")]
    return [path] if values not in ("", None, False) and SECRET_KEYS.search(path.rpartition(".")[2]) else []


def test_mlflow_values_use_known_keys_and_valid_kubernetes_pieces():
    for rel in ["mlflow/values.yaml", *(f"mlflow/{d}.yaml" for d in DOMAINS)]:
        (values,) = load_docs(rel)
        assert not key_errors(values, MLFLOW_CHART_KEYS, rel), key_errors(values, MLFLOW_CHART_KEYS, rel)
    values = mlflow_values("production")
    errors = k8s_model_errors(values["podSecurityContext"], "V1PodSecurityContext", "podSecurityContext")
    errors += k8s_model_errors(values["securityContext"], "V1SecurityContext", "securityContext")
    errors += k8s_model_errors(values["resources"], "V1ResourceRequirements", "resources")
    assert not errors, errors
    assert all(isinstance(v, str) for v in [*values["extraArgs"].values(), *values["extraEnvVars"].values()])
    cpu_pool = by_name(objects("kueue/resource-flavors.yaml", "ResourceFlavor"))["cpu"]["spec"]["nodeLabels"]
    assert values["nodeSelector"].items() <= cpu_pool.items(), "the servers run on the CPU pool"


@pytest.mark.parametrize("domain", DOMAINS)
def test_each_domains_mlflow_keeps_runs_in_postgres_and_artifacts_in_its_prefix(domain):
    values = mlflow_values(domain)
    store = values["backendStore"]
    postgres = store["postgres"]
    assert postgres["enabled"] is True and postgres["host"] and postgres["port"] == 5432, "a real database, not SQLite"
    assert postgres["database"] == f"mlflow_{domain}"
    assert not values["postgresql"]["enabled"] and not values["mysql"]["enabled"]
    secret = store["existingDatabaseSecret"]
    assert secret == {"name": f"mlflow-{domain}-db", "usernameKey": "username", "passwordKey": "password"}
    assert not inline_secrets(values), f"credentials belong in Secrets and IRSA: {inline_secrets(values)}"
    artifacts = values["artifactRoot"]
    assert artifacts["proxiedArtifactStorage"] is True, "--serve-artifacts: only the server's role touches the prefix"
    assert artifacts["s3"]["enabled"] is True
    assert (artifacts["s3"]["bucket"], artifacts["s3"]["path"]) == ("pretrain", f"mlflow-artifacts/{domain}")
    assert not any(artifacts.get(other, {}).get("enabled") for other in ("azureBlob", "gcs"))
    account = values["serviceAccount"]
    assert account["create"] is False and account["name"] == f"mlflow-{domain}"
    (sa,) = [a for a in objects("k8s/mlflow.yaml", "ServiceAccount") if a["metadata"]["name"] == account["name"]]
    assert sa["metadata"]["namespace"] == MLFLOW_NAMESPACE
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].endswith(f":role/pretrain-{domain}-mlflow")
    assert sa["automountServiceAccountToken"] is False


@pytest.mark.parametrize("domain", DOMAINS)
def test_each_domains_mlflow_requires_a_user_whose_password_is_a_secret(domain):
    """Issue 50 finding 4: the cluster's MLflow had no authentication, so every pod of the domain's namespace,
    the read-only role's included, could create, delete or move runs, registered models and aliases."""
    values = mlflow_values(domain)
    auth = values["auth"]
    assert auth["enabled"] is True and auth["appName"] == "basic-auth"
    assert auth["authorizationFunction"] == "mlflow.server.auth:authenticate_request_basic_auth"
    assert auth["defaultPermission"] == "READ", "every user reads; only what a user created (or is granted) it edits"
    assert auth["existingAdminSecret"] == {"name": f"mlflow-{domain}-admin", "usernameKey": "username", "passwordKey": "password"}
    assert not auth["adminUsername"] and not auth["adminPassword"], "the admin comes from the Secret only"
    users = auth["postgres"]  # users and permissions outlive the pod: in the domain's database server, not SQLite
    assert users["enabled"] is True and users["host"] == values["backendStore"]["postgres"]["host"]
    assert users["database"] == f"mlflow_auth_{domain}" and users["existingSecret"]["name"] == f"mlflow-{domain}-db"
    assert not inline_secrets(values)
    # The task pods sign in as the tasks' user from a Secret of their namespace; never a literal in the template.
    from tasks.placement import TRACKING_SECRET, pod_template

    cluster = cluster_profiles()["gpu-2x8"]
    env = {e.name: e for e in pod_template("pretrain-train", cluster).pod_spec.containers[0].env}
    assert env["MLFLOW_TRACKING_URI"].value.startswith("http")
    for name, key in (("MLFLOW_TRACKING_USERNAME", "username"), ("MLFLOW_TRACKING_PASSWORD", "password")):
        assert env[name].value is None and env[name].value_from.secret_key_ref.to_dict() == {
            "name": TRACKING_SECRET,
            "key": key,
            "optional": None,
        }


def ca_bundle_path(volumes: list[dict], mounts: list[dict]) -> str:
    """The folder the RDS CA bundle's ConfigMap is mounted at (read-only), from a pod's volumes and mounts."""
    (volume,) = [v for v in volumes if v.get("configMap", {}).get("name") == "rds-ca-bundle"]
    (mount,) = [m for m in mounts if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    return mount["mountPath"]


def test_every_postgres_connection_checks_the_servers_certificate():
    """Issue 50 finding 4: Postgres was reached with ``sslmode=require``, which encrypts but checks no certificate:
    whoever answers on the database's address gets the passwords. Flyte's and each MLflow's connections now verify
    the server's certificate and name against the RDS CA bundle, mounted in the pod that connects."""
    database = flyte_values()["configuration"]["database"]
    options = dict(option.split("=", 1) for option in database["options"].split())
    assert options["sslmode"] == "verify-full"
    deployment = flyte_values()["deployment"]
    folder = ca_bundle_path(deployment["extraVolumes"], deployment["extraVolumeMounts"])
    assert options["sslrootcert"] == f"{folder}/global-bundle.pem"
    for domain in DOMAINS:
        values = mlflow_values(domain)
        env = values["extraEnvVars"]
        assert env["PGSSLMODE"] == "verify-full"  # libpq: the runs' and the users' databases alike
        assert env["PGSSLROOTCERT"] == f"{ca_bundle_path(values['extraVolumes'], values['extraVolumeMounts'])}/global-bundle.pem"
        # The chart's migration init container gets neither: it is off, and `mlflow db upgrade` runs by hand.
        assert values["backendStore"]["databaseMigration"] is False
    weaker = [
        p for p in INFRA.rglob("*") if p.is_file() and re.search(r"sslmode[=: ]+(disable|allow|prefer|require)\b", p.read_text())
    ]
    assert not weaker, weaker


def test_every_pod_tracks_into_its_own_domains_mlflow_service():
    """MLFLOW_TRACKING_URI names, in each pretrain namespace, an ExternalName Service pointing at the Service
    the chart creates for release mlflow-<domain>, on its port; the server answers that Host header."""
    from mlflow.server.security_utils import is_allowed_host_header

    uri = tracking_uri()
    parts = urlsplit(uri)
    assert parts.scheme == "http" and parts.hostname and parts.port, uri
    remote = {name: p for name, p in cluster_profiles().items() if p.remote}
    assert remote, "a cluster profile whose pods run on the cluster"
    assert {name: p.tracking_uri for name, p in remote.items()} == dict.fromkeys(remote, uri)
    rendered = {ns: [o for _, o in objs if o["kind"] == "Service"] for ns, objs in rendered_cluster_resources().items()}
    checked_in = objects("k8s/mlflow.yaml", "Service")
    databases = set()
    for domain, namespace in zip(DOMAINS, PRETRAIN_NAMESPACES, strict=True):
        values = mlflow_values(domain)
        server = f"{chart_fullname(mlflow_release(domain), values)}.{MLFLOW_NAMESPACE}.svc.cluster.local"
        for services in (rendered[namespace], [s for s in checked_in if s["metadata"]["namespace"] == namespace]):
            (service,) = [s for s in services if s["metadata"]["name"] == parts.hostname]
            assert service["spec"] == {"type": "ExternalName", "externalName": server}, (namespace, service)
        assert values["service"]["port"] == parts.port
        allowed = [h.strip() for h in values["extraEnvVars"]["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")]
        for host in (parts.netloc, f"{server}:{parts.port}", f"localhost:{parts.port}", "10.0.3.7:5000"):
            assert is_allowed_host_header(allowed, host), f"{domain}'s server refuses Host {host}"
        assert not is_allowed_host_header(allowed, f"mlflow.attacker.example:{parts.port}")
        databases.add((values["backendStore"]["postgres"]["database"], values["artifactRoot"]["s3"]["path"]))
    assert len(databases) == len(DOMAINS), "each domain its own database and artifact prefix"


def test_mlflow_chart_version_is_pinned_and_the_same_everywhere():
    """infra/README.md installs release mlflow-<domain> of each domain with the version the values name."""
    files = ["README.md", "mlflow/values.yaml", *(f"mlflow/{d}.yaml" for d in DOMAINS)]
    found = {rel: MLFLOW_CHART_VERSION.findall((INFRA / rel).read_text()) for rel in files}
    assert all(found.values()), f"no pinned `community-charts/mlflow --version X.Y.Z` in {[r for r, v in found.items() if not v]}"
    assert len({v for versions in found.values() for v in versions}) == 1, found
    readme = (INFRA / "README.md").read_text()
    loop = f"helm install {mlflow_release('$d')} community-charts/mlflow --version {found['README.md'][0]} --namespace mlflow"
    assert loop in readme and "-f infra/mlflow/values.yaml -f infra/mlflow/$d.yaml" in readme
