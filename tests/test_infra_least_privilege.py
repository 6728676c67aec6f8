"""Least privilege in infra/ (issue 19, item 5): each domain's roles reach only that domain's prefixes and
are assumable only by that domain's ServiceAccounts; every pod meets Pod Security `restricted`; the
image's runtime user cannot write the installed packages. Each domain's MLflow server (issue 30) is the
same: its role reaches its artifacts only, only its domain's pods reach it."""

from __future__ import annotations

import copy
import itertools
import re

import pytest
import yaml

from tests.helpers import (
    CLUSTER_PROFILES,
    DOMAINS,
    INFRA,
    MLFLOW_NAMESPACE,
    PROJECT,
    ROOT,
    condition_holds,
    flyte_values,
    load_docs,
    load_json,
    mlflow_release,
    mlflow_values,
    objects,
    policy_allows,
    rendered_cluster_resources,
    selector_matches,
)

TASK_ROLES = ("data", "train", "registry", "reader")
STORE_AREAS = ("datasets", "runs", "models", "_probe")
GET, PUT, DELETE = "s3:GetObject", "s3:PutObject", "s3:DeleteObject"


def arn(path: str) -> str:
    return f"arn:aws:s3:::{path}"


def policy(domain: str, role: str) -> dict:
    return load_json(f"iam/{domain}/{role}.json")


def domain_objects(d: str) -> dict[str, str]:
    """One object in each store area and each Flyte prefix of domain ``d``."""
    out = {f"store/{area}": f"pretrain/store/{d}/{area}/x/part-0" for area in STORE_AREAS}
    out["flyte/metadata"] = f"pretrain-flyte/metadata/propeller/{PROJECT}-{d}-f6a1b2c3/n1/data/0/outputs.pb"
    out["flyte/raw"] = f"pretrain-flyte/{PROJECT}/{d}/data/ab/f6a1b2c3-n1-0/deck.html"
    out["flyte/code"] = f"pretrain-flyte/uploads/{PROJECT}/{d}/QWERTY/fast1a2b.tar.gz"
    return out


# ----------------------------------------------------------------------------------------------
# S3: one domain's roles are denied every other domain's prefixes

CROSS = [("development", "production"), ("staging", "production"), ("production", "development"), ("development", "staging")]


@pytest.mark.parametrize("role", TASK_ROLES)
@pytest.mark.parametrize("own, other", CROSS, ids=[f"{a}-on-{b}" for a, b in CROSS])
def test_a_domains_role_is_denied_another_domains_prefixes(own, other, role):
    doc = policy(own, role)
    granted = [
        (action, key)
        for key in domain_objects(other).values()
        for action in (GET, PUT, DELETE, "s3:AbortMultipartUpload")
        if policy_allows(doc, action, arn(key))
    ]
    assert not granted, f"{own}/{role} may touch {other}'s objects: {granted}"


@pytest.mark.parametrize("role", TASK_ROLES)
@pytest.mark.parametrize("domain", DOMAINS)
def test_no_role_reaches_the_old_shared_prefixes(domain, role):
    """Nothing is granted on the unprefixed layout every domain used to share, nor on Flyte's global prefixes."""
    doc = policy(domain, role)
    shared = ["pretrain/store/datasets/v/manifest.json", "pretrain/store/runs/r/metrics.jsonl"]
    shared += ["pretrain/store/models/gpt/1/card.json", "pretrain/store/_probe/1"]
    shared += ["pretrain-flyte/data/ab/abc-n1-0/deck.html", "pretrain-flyte/metadata/propeller/other-x/outputs.pb"]
    granted = [(a, k) for k in shared for a in (GET, PUT, DELETE) if policy_allows(doc, a, arn(k))]
    assert not granted, granted


# Within its domain, the split by stage: (area -> set of actions) each role has, exactly.
STAGES = {
    "data": {
        "store/datasets": {GET, PUT, DELETE},
        "store/models": {GET},
        "store/_probe": {PUT, DELETE},
    },
    "train": {"store/datasets": {GET}, "store/models": {GET}, "store/runs": {GET, PUT, DELETE}},
    "registry": {"store/runs": {GET}, "store/datasets": {GET}, "store/models": {GET, PUT}},
    "reader": {"store/datasets": {GET}, "store/runs": {GET}, "store/models": {GET}},
}
FLYTE_TASK_ACCESS = {"flyte/metadata": {GET, PUT}, "flyte/raw": {GET, PUT}, "flyte/code": {GET}}


@pytest.mark.parametrize("role", TASK_ROLES)
@pytest.mark.parametrize("domain", DOMAINS)
def test_each_stage_role_has_exactly_its_own_prefixes_within_its_domain(domain, role):
    doc = policy(domain, role)
    actual = {
        area: {a for a in (GET, PUT, DELETE) if policy_allows(doc, a, arn(key))} for area, key in domain_objects(domain).items()
    }
    expected = {area: set() for area in actual} | STAGES[role] | ({} if role == "reader" else FLYTE_TASK_ACCESS)
    assert actual == expected


# ListBucket: each domain's role lists its own prefixes (an s3:prefix condition), never another
# domain's, nor the whole bucket


def listing_prefixes(d: str) -> dict[str, list[str]]:
    """s3:prefix values of listings (and of HEADs of missing keys) in each store area and Flyte prefix of ``d``."""
    out = {f"store/{area}": [f"store/{d}/{area}/", f"store/{d}/{area}/x/", f"store/{d}/{area}/x/part-0"] for area in STORE_AREAS}
    out["flyte/metadata"] = [
        f"metadata/propeller/{PROJECT}-{d}-f6a1b2c3/",
        f"metadata/propeller/{PROJECT}-{d}-f6a1b2c3/n1/data/0/outputs.pb",
    ]
    out["flyte/raw"] = [f"{PROJECT}/{d}/", f"{PROJECT}/{d}/data/ab/f6a1b2c3-n1-0/"]
    out["flyte/code"] = [f"uploads/{PROJECT}/{d}/", f"uploads/{PROJECT}/{d}/QWERTY/fast1a2b.tar.gz"]
    return out


def lists(doc: dict, area: str, prefix: str | None) -> bool:
    bucket = "pretrain-flyte" if area.startswith("flyte/") else "pretrain"
    return policy_allows(doc, "s3:ListBucket", arn(bucket), {} if prefix is None else {"s3:prefix": prefix})


@pytest.mark.parametrize("role", TASK_ROLES)
@pytest.mark.parametrize("domain", DOMAINS)
def test_a_domains_role_lists_exactly_the_prefixes_it_reads_in_its_domain(domain, role):
    doc = policy(domain, role)
    reads = {area for area, actions in STAGES[role].items() if GET in actions} | (
        set() if role == "reader" else set(FLYTE_TASK_ACCESS)
    )
    for area, prefixes in listing_prefixes(domain).items():
        listed = [p for p in prefixes if lists(doc, area, p)]
        assert listed == (prefixes if area in reads else []), f"{domain}/{role} in {area}: may list {listed}"


@pytest.mark.parametrize("role", TASK_ROLES)
@pytest.mark.parametrize("own, other", CROSS, ids=[f"{a}-on-{b}" for a, b in CROSS])
def test_a_domains_role_is_denied_listing_another_domains_prefixes(own, other, role):
    doc = policy(own, role)
    listed = [(area, p) for area, prefixes in listing_prefixes(other).items() for p in prefixes if lists(doc, area, p)]
    listed += [("store", p) for p in (f"store/{other}/", f"store/{other}") if lists(doc, "store", p)]
    assert not listed, f"{own}/{role} may list {other}'s keys: {listed}"


@pytest.mark.parametrize("role", TASK_ROLES)
@pytest.mark.parametrize("domain", DOMAINS)
def test_no_role_lists_a_whole_bucket_or_the_whole_store(domain, role):
    """No Prefix (the s3:prefix key absent), Prefix "", and the roots above the domain's folders."""
    doc = policy(domain, role)
    whole = [None, "", "*", "s"]
    roots = {"store": [*whole, "store", "store/", f"store/{domain}", f"store/{domain}/"]}
    roots["flyte/raw"] = [*whole, "metadata/", "metadata/propeller/", f"{PROJECT}/", "uploads/", f"uploads/{PROJECT}/"]
    listed = [(area, p) for area, prefixes in roots.items() for p in prefixes if lists(doc, area, p)]
    assert not listed, f"{domain}/{role} may list {listed}"


@pytest.mark.parametrize("own, other", CROSS, ids=[f"{a}-on-{b}" for a, b in CROSS])
def test_a_domains_mlflow_server_is_denied_another_domains_artifacts_and_every_store(own, other):
    doc = policy(own, "mlflow")
    keys = [f"pretrain/mlflow-artifacts/{other}/1/0a1b2c/artifacts/charts/loss.png", *domain_objects(own).values()]
    keys += domain_objects(other).values()
    granted = [(a, k) for k in keys for a in (GET, PUT, DELETE) if policy_allows(doc, a, arn(k))]
    assert not granted, f"{own}/mlflow may touch {granted}"
    listed = [p for p in (None, "", "mlflow-artifacts/", f"mlflow-artifacts/{other}/", f"store/{own}/") if lists(doc, "store", p)]
    assert not listed, f"{own}/mlflow may list {listed}"
    assert lists(doc, "store", f"mlflow-artifacts/{own}/1/0a1b2c/artifacts/")


def test_the_domains_store_is_what_its_executions_use_and_its_roles_can_write():
    for domain in DOMAINS:
        (doc,) = load_docs(f"flyte/project-domain-attributes/{domain}-execution-config.yaml")
        envs = {e["key"]: e["value"] for e in doc["envs"]["values"]}
        assert envs["PRETRAIN_STORE"] == f"s3://pretrain/store/{domain}"
        raw = doc["raw_output_data_config"]["output_location_prefix"]
        assert raw == f"s3://pretrain-flyte/{PROJECT}/{domain}/data"
        store = envs["PRETRAIN_STORE"].removeprefix("s3://")
        assert policy_allows(policy(domain, "data"), PUT, arn(f"{store}/datasets/v/manifest.json"))
        assert policy_allows(policy(domain, "train"), PUT, arn(f"{raw.removeprefix('s3://')}/ab/x/outputs.pb"))


# ----------------------------------------------------------------------------------------------
# IRSA trust: a domain's role is assumable only by that domain's ServiceAccount of the same identity


def trust_admits(doc: dict, sub: str, aud: str = "sts.amazonaws.com") -> bool:
    """Whether an AssumeRoleWithWebIdentity from the cluster's OIDC provider with these claims is allowed
    (Allow statements whose Condition holds for the claims: ``condition_holds``, which raises on an
    operator or key it does not evaluate)."""
    for st in doc["Statement"]:
        if st.get("Effect") != "Allow" or st.get("Action") != "sts:AssumeRoleWithWebIdentity":
            continue
        provider = st["Principal"]["Federated"].partition("oidc-provider/")[2]
        claims = {f"{provider}:sub": sub, f"{provider}:aud": aud}
        carried = frozenset(k.lower() for k in claims)  # the web identity's claims; any other key raises
        if "Condition" not in st or condition_holds(st["Condition"], claims, known_keys=carried):
            return True
    return False


def account(domain: str, role: str) -> str:
    return f"system:serviceaccount:{PROJECT}-{domain}:pretrain-{role}"


@pytest.mark.parametrize("role", TASK_ROLES)
@pytest.mark.parametrize("domain", DOMAINS)
def test_trust_admits_only_the_domains_own_service_account(domain, role):
    doc = load_json(f"iam/trust/{domain}/{role}.json")
    everyone = [account(d, r) for d in DOMAINS for r in TASK_ROLES] + ["system:serviceaccount:flyte:flyte-binary"]
    admitted = [s for s in everyone if trust_admits(doc, s)]
    assert admitted == [account(domain, role)]
    assert not trust_admits(doc, account(domain, role), aud="something-else")


@pytest.mark.parametrize("domain", DOMAINS)
def test_mlflow_trust_admits_only_the_domains_server(domain):
    doc = load_json(f"iam/trust/{domain}/mlflow.json")
    servers = [f"system:serviceaccount:{MLFLOW_NAMESPACE}:{mlflow_release(d)}" for d in DOMAINS]
    everyone = servers + [account(d, r) for d in DOMAINS for r in TASK_ROLES] + ["system:serviceaccount:flyte:flyte-binary"]
    everyone += [f"system:serviceaccount:{PROJECT}-{domain}:{mlflow_release(domain)}"]  # the right name, another namespace
    assert [s for s in everyone if trust_admits(doc, s)] == [f"system:serviceaccount:{MLFLOW_NAMESPACE}:{mlflow_release(domain)}"]


def test_production_roles_reject_development_and_staging_accounts():
    for role in TASK_ROLES:
        doc = load_json(f"iam/trust/production/{role}.json")
        assert not trust_admits(doc, account("development", role))
        assert not trust_admits(doc, account("staging", role))
        assert not trust_admits(load_json(f"iam/trust/development/{role}.json"), account("production", role))


def test_trust_evaluator_is_not_vacuous():
    doc = copy.deepcopy(load_json("iam/trust/production/train.json"))
    (st,) = doc["Statement"]
    provider = st["Principal"]["Federated"].partition("oidc-provider/")[2]
    st["Condition"]["StringEquals"][f"{provider}:sub"] = [account(d, "train") for d in DOMAINS]
    assert trust_admits(doc, account("development", "train")), "the old, shared trust admitted every domain"
    st["Condition"] = {"StringLike": {f"{provider}:sub": "system:serviceaccount:*:pretrain-train"}}
    assert trust_admits(doc, account("staging", "train"))


def test_service_accounts_name_their_domains_role():
    for sa in objects("k8s/service-accounts.yaml", "ServiceAccount"):
        domain = sa["metadata"]["namespace"].removeprefix(f"{PROJECT}-")
        role = sa["metadata"]["labels"]["pretrain.example.org/role"]
        assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].endswith(f":role/pretrain-{domain}-{role}")


# ----------------------------------------------------------------------------------------------
# Pod Security Standards, `restricted` profile (v1.29 rules), on pod specs as the API sees them (camelCase)

RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range"}
SAFE_SYSCTLS |= {"net.ipv4.ip_unprivileged_port_start", "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time"}
SAFE_SYSCTLS |= {"net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}


def restricted_errors(spec: dict, where: str = "pod") -> list[str]:
    """Everything in a PodSpec that Pod Security Admission's `restricted` level rejects."""
    errors = []
    pod_sc = spec.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            errors.append(f"{where}: {field} is set")
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            errors.append(f"{where}: volume {volume.get('name')} of type {sorted(kinds - RESTRICTED_VOLUMES)}")
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            errors.append(f"{where}: unsafe sysctl {sysctl.get('name')}")
    if (pod_sc.get("seLinuxOptions") or {}).get("user") or (pod_sc.get("seLinuxOptions") or {}).get("role"):
        errors.append(f"{where}: seLinuxOptions user/role")
    if pod_sc.get("runAsUser") == 0:
        errors.append(f"{where}: runAsUser 0")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        errors.append(f"{where}: pod seccompProfile {pod_seccomp}")
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or []), *(spec.get("ephemeralContainers") or [])]
    if not containers:
        errors.append(f"{where}: no containers to check")
    for c in containers:
        cw = f"{where}: container {c.get('name')}"
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            errors.append(f"{cw}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            errors.append(f"{cw}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            errors.append(f"{cw}: capabilities must drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            errors.append(f"{cw}: adds capabilities {caps.get('add')}")
        if not (sc.get("runAsNonRoot") is True or (pod_sc.get("runAsNonRoot") is True and sc.get("runAsNonRoot") is not False)):
            errors.append(f"{cw}: runAsNonRoot must be true (pod or container)")
        if sc.get("runAsUser") == 0:
            errors.append(f"{cw}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost") and not (
            seccomp is None and pod_seccomp in ("RuntimeDefault", "Localhost")
        ):
            errors.append(f"{cw}: seccompProfile must be RuntimeDefault or Localhost (pod or container)")
        if sc.get("procMount") not in (None, "Default"):
            errors.append(f"{cw}: procMount {sc.get('procMount')}")
        if (sc.get("seLinuxOptions") or {}).get("user") or (sc.get("seLinuxOptions") or {}).get("role"):
            errors.append(f"{cw}: seLinuxOptions user/role")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            errors.append(f"{cw}: hostPort")
    return errors


def serialized_pod_specs() -> dict[str, dict]:
    """The pod spec flytekit registers for each kind of task under every cluster profile: the pod
    template of tasks/placement.py merged with the task's container (flytekit's own serializer)."""
    from flytekit.configuration import Image, ImageConfig, SerializationSettings
    from flytekit.core.utils import _serialize_pod_spec
    from flytekit.models import task as task_models

    from pipeline.cluster import load_cluster
    from tasks import placement

    image = Image(name="default", fqn="ghcr.io/example-org/pretrain", tag="test")
    settings = SerializationSettings(image_config=ImageConfig(default_image=image, images=[image]))
    container = task_models.Container(
        image="ghcr.io/example-org/pretrain:test",
        command=[],
        args=["pyflyte-fast-execute", "--dest-dir", "."],
        resources=task_models.Resources(requests=[], limits=[]),
        env={"FLYTE_INTERNAL_IMAGE": "x"},
        config={},
    )
    kinds = {"data": placement.data_task, "train": placement.train_task}
    kinds |= {"evaluate": placement.evaluate_task, "registry": placement.registry_task}
    out = {}
    for path, (kind, make) in itertools.product(CLUSTER_PROFILES, kinds.items()):
        template = make(load_cluster(str(path)))["pod_template"]
        out[f"{path.stem}/{kind}"] = _serialize_pod_spec(template, container, settings)
    return out


def test_task_pod_templates_satisfy_restricted_with_a_read_only_root():
    from tasks.placement import RUNTIME_UID

    specs = serialized_pod_specs()
    assert len(specs) == 4 * len(CLUSTER_PROFILES)
    for name, spec in specs.items():
        assert not restricted_errors(spec, name), restricted_errors(spec, name)
        (primary,) = spec["containers"]
        assert primary["name"] == "primary" and primary["image"] == "ghcr.io/example-org/pretrain:test", name
        assert primary["securityContext"]["readOnlyRootFilesystem"] is True, name
        assert spec["securityContext"]["runAsUser"] == RUNTIME_UID != 0, name
        mounts = {m["mountPath"]: m["name"] for m in primary["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        # writable places: /tmp (also $HOME) and /root (fast registration unpacks the code there)
        assert set(mounts) == {"/tmp", "/root"} and all("emptyDir" in volumes[v] for v in mounts.values()), name
        assert {"name": "HOME", "value": "/tmp"} in primary["env"], name


def test_train_task_keeps_its_shared_memory():
    """/dev/shm is the emptyDir (medium Memory) Flyte adds for shared_memory=True, an allowed volume type."""
    from pipeline.cluster import load_cluster
    from tasks import placement

    for path in CLUSTER_PROFILES:
        assert placement.train_task(load_cluster(str(path)))["shared_memory"] is True


def test_flyte_plugin_defaults_satisfy_restricted():
    """Any pod Flyte creates without a pod template of its own (and the PyTorchJob's replicas) gets these."""
    k8s = flyte_values()["configuration"]["inline"]["plugins"]["k8s"]
    spec = {
        "securityContext": k8s["default-pod-security-context"],
        "containers": [{"name": "primary", "securityContext": k8s["default-security-context"]}],
    }
    assert not restricted_errors(spec, "flyte plugin defaults")
    from tasks.placement import RUNTIME_UID

    assert k8s["default-pod-security-context"]["runAsUser"] == RUNTIME_UID


def test_training_operator_pod_satisfies_restricted():
    (values,) = load_docs("training-operator/values.yaml")
    spec = {
        "securityContext": values["podSecurityContext"],
        "containers": [
            {"name": "training-operator", "securityContext": values["securityContext"], "volumeMounts": values["volumeMounts"]}
        ],
        "volumes": values["volumes"],
    }
    assert not restricted_errors(spec, "training-operator")
    assert values["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("domain", DOMAINS)
def test_mlflow_server_container_satisfies_restricted(domain):
    """The server container meets `restricted`; namespace mlflow enforces `baseline` (the chart's init
    containers set no context) and audits and warns on `restricted`."""
    values = mlflow_values(domain)
    spec = {
        "securityContext": values["podSecurityContext"],
        "containers": [{"name": "mlflow", "securityContext": values["securityContext"]}],
    }
    assert not restricted_errors(spec, f"mlflow-{domain}")
    (namespace,) = [n for n in objects("k8s/mlflow.yaml", "Namespace") if n["metadata"]["name"] == MLFLOW_NAMESPACE]
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] in ("baseline", "restricted")
    assert labels["pod-security.kubernetes.io/audit"] == labels["pod-security.kubernetes.io/warn"] == "restricted"


def test_only_a_domains_pods_reach_its_mlflow_server():
    """Each server's NetworkPolicy selects that release's pods and admits only its domain's namespace, on its port."""
    policies = objects("k8s/mlflow.yaml", "NetworkPolicy")
    namespaces = {n["metadata"]["name"]: n for n in objects("k8s/namespaces.yaml", "Namespace")}
    for domain in DOMAINS:
        release = mlflow_release(domain)
        pod = {"app.kubernetes.io/name": "mlflow", "app.kubernetes.io/instance": release}  # the chart's selector labels
        selecting = [
            p
            for p in policies
            if p["metadata"]["namespace"] == MLFLOW_NAMESPACE and selector_matches(p["spec"]["podSelector"], pod)
        ]
        (netpol,) = selecting
        assert netpol["spec"]["policyTypes"] == ["Ingress"]
        (rule,) = netpol["spec"]["ingress"]
        assert rule["from"] and all(set(peer) == {"namespaceSelector"} for peer in rule["from"]), rule
        assert rule["ports"] == [{"port": mlflow_values(domain)["service"]["port"], "protocol": "TCP"}]
        admitted = []
        for name in [*namespaces, MLFLOW_NAMESPACE, "flyte", "default"]:
            labels = {"kubernetes.io/metadata.name": name, **namespaces.get(name, {"metadata": {}})["metadata"].get("labels", {})}
            if any(selector_matches(peer["namespaceSelector"], labels) for peer in rule["from"]):
                admitted.append(name)
        assert admitted == [f"{PROJECT}-{domain}"], (domain, admitted)


def test_pods_of_a_cluster_profile_track_into_its_server():
    """A profile whose pods run on the cluster puts its MLflow server in every task's pod template; the local one none."""
    for name, spec in serialized_pod_specs().items():
        profile = yaml.safe_load((ROOT / "configs" / "cluster" / f"{name.split('/')[0]}.yaml").read_text())
        (primary,) = spec["containers"]
        env = {e["name"]: e for e in primary["env"]}
        if profile.get("remote"):
            assert (
                profile["tracking_uri"].startswith("http") and env["MLFLOW_TRACKING_URI"]["value"] == profile["tracking_uri"]
            ), name
            # The server requires a user (issue 50 finding 4): the pod reads it from its namespace's Secret, as registered.
            for variable, key in (("MLFLOW_TRACKING_USERNAME", "username"), ("MLFLOW_TRACKING_PASSWORD", "password")):
                assert "value" not in env[variable], (name, variable)
                assert env[variable]["valueFrom"]["secretKeyRef"] == {"name": "mlflow-tracking", "key": key}, (name, variable)
        else:
            assert not {"MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"} & set(env), name


def test_flyte_binary_runs_as_non_root():
    """flyte-binary (namespace flyte, not a pretrain namespace) sets only a pod-level context: the chart has no container one."""
    sc = flyte_values()["deployment"]["podSecurityContext"]
    assert sc["enabled"] is True and sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"


def test_pretrain_namespaces_enforce_restricted():
    rendered = [o for objs in rendered_cluster_resources().values() for _, o in objs if o["kind"] == "Namespace"]
    namespaces = objects("k8s/namespaces.yaml", "Namespace") + rendered
    assert len(namespaces) == 2 * len(DOMAINS)
    for ns in namespaces:
        labels = ns["metadata"]["labels"]
        for mode in ("enforce", "audit", "warn"):
            assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted", (ns["metadata"]["name"], mode)


def _good_spec() -> dict:
    return {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "primary",
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }
        ],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda s: s["securityContext"].pop("runAsNonRoot"), "runAsNonRoot"),
        (lambda s: s["containers"][0]["securityContext"].update(runAsNonRoot=False), "runAsNonRoot"),
        (lambda s: s["securityContext"].update(runAsUser=0), "runAsUser 0"),
        (lambda s: s["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"), "allowPrivilegeEscalation"),
        (lambda s: s["containers"][0]["securityContext"].update(allowPrivilegeEscalation=True), "allowPrivilegeEscalation"),
        (lambda s: s["containers"][0]["securityContext"].update(capabilities={"drop": ["NET_RAW"]}), "drop ALL"),
        (lambda s: s["containers"][0]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]), "adds capabilities"),
        (lambda s: s["securityContext"].pop("seccompProfile"), "seccompProfile"),
        (lambda s: s["containers"][0]["securityContext"].update(seccompProfile={"type": "Unconfined"}), "seccompProfile"),
        (lambda s: s["containers"][0]["securityContext"].update(privileged=True), "privileged"),
        (lambda s: s.update(hostNetwork=True), "hostNetwork"),
        (lambda s: s.update(hostPID=True), "hostPID"),
        (lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "hostPath"),
        (lambda s: s["containers"][0].update(ports=[{"containerPort": 80, "hostPort": 80}]), "hostPort"),
        (lambda s: s.update(initContainers=[{"name": "init"}]), "container init"),
    ],
)
def test_restricted_checker_rejects_each_violation(edit, expected):
    spec = _good_spec()
    assert not restricted_errors(spec)
    edit(spec)
    errors = restricted_errors(spec)
    assert any(expected in e for e in errors), errors


# ----------------------------------------------------------------------------------------------
# The image: installed as root, run as a numeric non-root UID that cannot write site-packages


def test_dockerfile_installs_as_root_and_runs_as_the_pods_numeric_user():
    from tasks.placement import ROOT_OWNED_PYTHON, RUNTIME_UID

    text = (INFRA / "images" / "Dockerfile.train").read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    users = re.findall(r"^USER\s+(\S+)", code, re.M)
    assert users[-1] == f"{RUNTIME_UID}:{RUNTIME_UID}", users
    assert not re.search(r"chown[^\n]*flytekit[^\n]*/opt/micromamba", code), "the runtime user must not own the environment"
    assert ROOT_OWNED_PYTHON in code, "the environment ends root-owned and not group/world writable"
    assert "useradd --uid 1000" in code and 'test "$(id -u flytekit)" = 1000' in code


def test_imagespecs_hand_the_environment_to_root():
    from pipeline.cluster import load_cluster
    from tasks.placement import ROOT_OWNED_PYTHON, data_image, training_image

    for path in CLUSTER_PROFILES:
        cluster = load_cluster(str(path))
        for spec in (data_image(cluster), training_image(cluster)):
            assert spec.commands and spec.commands[-1] == ROOT_OWNED_PYTHON, (path.stem, spec.name)
    assert ROOT_OWNED_PYTHON == "chown -R root:root /opt/micromamba && chmod -R go-w /opt/micromamba"


@pytest.mark.parametrize("preset", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_presets_use_the_domains_own_store(preset: str) -> None:
    """A preset naming the undivided s3://pretrain/store would be denied by every domain's roles."""
    store = yaml.safe_load((ROOT / "configs" / preset).read_text()).get("store", "")
    assert store == "" or store.rstrip("/") in {f"s3://pretrain/store/{d}" for d in DOMAINS}
