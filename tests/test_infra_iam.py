"""IAM: each domain's role of each identity grants what its tasks need in that domain and nothing else;
IRSA trust matches the ServiceAccounts (cross-domain denials: tests/test_infra_least_privilege.py)."""

from __future__ import annotations

import copy
import re

import pytest

from tests.helpers import (
    DOMAINS,
    INFRA,
    PRETRAIN_NAMESPACES,
    PROJECT,
    PolicyEvaluationError,
    RoleSpec,
    flyte_values,
    iam_match,
    load_json,
    objects,
    policy_allows,
    policy_errors,
)

INCOMING = "pretrain/incoming/"  # configs/nightly.yaml: data.sources (shared by the domains, read-only)
FLYTE = "pretrain-flyte/"  # infra/flyte/values.yaml: configuration.storage
TASK_ROLES = ("data", "train", "registry", "reader")


def mlflow_artifacts(domain: str) -> str:
    """What the domain's MLflow server keeps in the bucket: its artifacts (infra/mlflow/<domain>.yaml)."""
    return f"pretrain/mlflow-artifacts/{domain}/"


def store(domain: str) -> str:
    """The store of a domain: s3://pretrain/store/<domain> ($PRETRAIN_STORE of its execution config)."""
    return f"pretrain/store/{domain}/"


def flyte_write(domain: str) -> set[str]:
    """Propeller's metadata of the domain's executions (<metadata-prefix>/<project>-<domain>-<name>/) and
    the domain's raw outputs (raw_output_data_config of flyte/project-domain-attributes)."""
    return {f"{FLYTE}metadata/propeller/{PROJECT}-{domain}-", f"{FLYTE}{PROJECT}/{domain}/"}


def flyte_read(domain: str) -> set[str]:
    """... and the code pyflyte register uploaded for the domain (flyteadmin's data proxy: uploads/<project>/<domain>/)."""
    return flyte_write(domain) | {f"{FLYTE}uploads/{PROJECT}/{domain}/"}


def task_role_spec(role: str, d: str) -> RoleSpec:
    """What a task role of domain ``d`` may do. The store layout is docs/running.md "Storage": datasets/, runs/,
    models/; _probe/ is where Store.check() (called by prepare_data) writes and deletes one object.
    Each lists exactly where it reads: its code lists and HEADs there (a HEAD of a missing key is a
    404 only to a caller that may list with that key as s3:prefix), and nowhere else."""
    s = store(d)
    read = {
        "data": {INCOMING, s + "datasets/", s + "models/", *flyte_read(d)},
        "train": {s + "datasets/", s + "models/", s + "runs/", *flyte_read(d)},
        "registry": {s + "runs/", s + "datasets/", s + "models/", *flyte_read(d)},
        "reader": {s + "datasets/", s + "runs/", s + "models/"},
    }[role]
    return {
        "data": RoleSpec(
            read=read,
            write={s + "datasets/", s + "_probe/", *flyte_write(d)},
            delete={s + "datasets/", s + "_probe/"},
            list=read,
        ),
        "train": RoleSpec(read=read, write={s + "runs/", *flyte_write(d)}, delete={s + "runs/"}, list=read),
        "registry": RoleSpec(read=read, write={s + "models/", *flyte_write(d)}, list=read),
        "reader": RoleSpec(read=read, list=read),
    }[role]


# One role per domain and identity ("<domain>/<role>": infra/iam/<domain>/<role>.json, IAM role
# pretrain-<domain>-<role>), plus Flyte's control plane, which serves every domain.
ROLES = {f"{d}/{r}": task_role_spec(r, d) for d in DOMAINS for r in TASK_ROLES}
ROLES["flyte-backend"] = RoleSpec(read={FLYTE}, write={FLYTE}, delete={FLYTE}, list={"pretrain-flyte"})
# Each domain's MLflow server (release mlflow-<domain>) serves its artifacts (--serve-artifacts): it alone
# reads, writes, lists and deletes (mlflow gc) its prefix, and nothing else.
for _d in DOMAINS:
    _artifacts = {mlflow_artifacts(_d)}
    ROLES[f"{_d}/mlflow"] = RoleSpec(read=_artifacts, write=_artifacts, delete=_artifacts, list=_artifacts)


def arn(path: str) -> str:
    return f"arn:aws:s3:::{path}"


# (action, object) that each role must be able to do, from what its tasks call in the code;
# {S} is the domain's store (pretrain/store/<domain>), {D} the domain
TASK_NEEDS = {
    "data": [
        ("s3:GetObject", "pretrain/incoming/batch-1/docs.jsonl.gz"),  # fingerprint_corpus, prepare_data
        ("s3:GetObject", "{S}/models/gpt-tiny/aliases/latest.json"),  # find_base_model
        ("s3:GetObject", "{S}/models/gpt-tiny/3/tokenizer.json"),  # prepare_data reuses the tokenizer
        ("s3:PutObject", "{S}/datasets/3285529b5983f404/shards/train-000000.tar"),
        ("s3:AbortMultipartUpload", "{S}/datasets/3285529b5983f404/shards/train-000000.tar"),
        ("s3:DeleteObject", "{S}/datasets/3285529b5983f404/validation/report.html"),  # re-validation
        ("s3:PutObject", "{S}/_probe/17"),  # Store.check()
        ("s3:DeleteObject", "{S}/_probe/17"),
        ("s3:GetObject", "pretrain-flyte/metadata/propeller/pretrain-{D}-abc/n1/data/inputs.pb"),
        ("s3:PutObject", "pretrain-flyte/metadata/propeller/pretrain-{D}-abc/n1/data/0/outputs.pb"),
        ("s3:PutObject", "pretrain-flyte/pretrain/{D}/data/ab/abc-n1-0/deck.html"),
        ("s3:GetObject", "pretrain-flyte/uploads/pretrain/{D}/QWERTY/fast1a2b.tar.gz"),  # fast-registered code
    ],
    "train": [
        ("s3:GetObject", "{S}/datasets/3285529b5983f404/shards/train-000000.tar"),
        ("s3:GetObject", "{S}/models/gpt-tiny/3/card.json"),  # train.init_from
        ("s3:PutObject", "{S}/runs/9f0e/checkpoints/step-0000300/model/__0_0.distcp"),
        ("s3:PutObject", "{S}/runs/9f0e/metrics.jsonl"),
        ("s3:DeleteObject", "{S}/runs/9f0e/checkpoints/step-0000150/meta.json"),  # keep_checkpoints
        ("s3:GetObject", "{S}/runs/9f0e/metrics.jsonl"),  # evaluate_model, resume
        ("s3:PutObject", "pretrain-flyte/metadata/propeller/pretrain-{D}-x/n2/data/0/outputs.pb"),
    ],
    "registry": [
        ("s3:GetObject", "{S}/runs/9f0e/checkpoints/step-0000300/meta.json"),
        ("s3:GetObject", "{S}/datasets/3285529b5983f404/manifest.json"),
        ("s3:PutObject", "{S}/models/gpt-tiny/4/card.json"),
        ("s3:PutObject", "{S}/models/gpt-tiny/aliases/latest.json"),
        ("s3:PutObject", "pretrain-flyte/metadata/propeller/pretrain-{D}-x/n2/data/0/outputs.pb"),
    ],
    "reader": [
        ("s3:GetObject", "{S}/models/gpt-tiny/4/card.json"),
        ("s3:GetObject", "{S}/runs/9f0e/metrics.jsonl"),
        ("s3:GetObject", "{S}/datasets/3285529b5983f404/validation/report.html"),
    ],
}
# ... and what each must not be able to do
TASK_MUST_NOT = {
    "data": [
        ("s3:PutObject", "{S}/runs/9f0e/metrics.jsonl"),
        ("s3:PutObject", "{S}/models/gpt-tiny/4/card.json"),
        ("s3:DeleteObject", "{S}/models/gpt-tiny/3/card.json"),
        ("s3:DeleteObject", "{S}/runs/9f0e/metrics.jsonl"),
        ("s3:PutObject", "pretrain/incoming/x.jsonl"),
        ("s3:DeleteObject", "pretrain/incoming/x.jsonl"),
        ("s3:PutObject", "{S}/datasets"),  # no write to a key that merely starts like the prefix
        ("s3:DeleteBucket", "pretrain"),
    ],
    "train": [
        ("s3:PutObject", "{S}/datasets/v/manifest.json"),
        ("s3:PutObject", "{S}/models/gpt-tiny/4/card.json"),
        ("s3:DeleteObject", "{S}/datasets/v/manifest.json"),
        ("s3:GetObject", "pretrain/incoming/x.jsonl"),
    ],
    "registry": [
        ("s3:PutObject", "{S}/runs/9f0e/metrics.jsonl"),
        ("s3:PutObject", "{S}/datasets/v/manifest.json"),
        ("s3:DeleteObject", "{S}/models/gpt-tiny/4/card.json"),
        ("s3:DeleteObject", "{S}/runs/9f0e/metrics.jsonl"),
    ],
    "reader": [
        ("s3:PutObject", "{S}/models/gpt-tiny/4/card.json"),
        ("s3:DeleteObject", "{S}/runs/9f0e/metrics.jsonl"),
        ("s3:GetObject", "pretrain/incoming/x.jsonl"),
        ("s3:GetObject", "pretrain-flyte/metadata/propeller/x/inputs.pb"),
    ],
}


FLYTE_BACKEND_NEEDS = [
    ("s3:ListBucket", "pretrain-flyte"),
    ("s3:PutObject", "pretrain-flyte/metadata/propeller/x/inputs.pb"),
    ("s3:GetObject", "pretrain-flyte/data/ab/deck.html"),
    ("s3:DeleteObject", "pretrain-flyte/metadata/propeller/x/inputs.pb"),
]
FLYTE_BACKEND_MUST_NOT = [
    ("s3:GetObject", "pretrain/store/models/gpt-tiny/4/card.json"),
    ("s3:ListBucket", "pretrain"),
]


def for_domain(pairs: list[tuple[str, str]], d: str) -> list[tuple[str, str]]:
    return [(a, o.format(S=store(d).rstrip("/"), D=d)) for a, o in pairs]


# What an MLflow server does with its artifacts: a run's files (links/store.json, charts/loss.png,
# validation/report.html) under <destination>/<experiment>/<run>/artifacts/, and mlflow gc's deletes.
# {M} is the domain's artifact prefix.
MLFLOW_NEEDS = [
    ("s3:PutObject", "{M}/1/0a1b2c/artifacts/charts/loss.png"),
    ("s3:AbortMultipartUpload", "{M}/1/0a1b2c/artifacts/validation/report.html"),
    ("s3:GetObject", "{M}/1/0a1b2c/artifacts/links/store.json"),
    ("s3:DeleteObject", "{M}/1/0a1b2c/artifacts/charts/loss.png"),
]
MLFLOW_MUST_NOT = [
    ("s3:GetObject", "pretrain/store/{D}/models/gpt-tiny/4/card.json"),
    ("s3:PutObject", "pretrain/store/{D}/runs/9f0e/metrics.jsonl"),
    ("s3:GetObject", "pretrain/incoming/x.jsonl"),
    ("s3:PutObject", "pretrain/mlflow-artifacts/x.png"),  # the other domains' parent
    ("s3:PutObject", "{M}-old/1/x.png"),  # a sibling that merely starts like the prefix
    ("s3:GetObject", "pretrain-flyte/metadata/propeller/pretrain-{D}-abc/inputs.pb"),
]


def mlflow_for_domain(pairs: list[tuple[str, str]], d: str) -> list[tuple[str, str]]:
    return [(a, o.format(M=mlflow_artifacts(d).rstrip("/"), D=d)) for a, o in pairs]


def other_domains_artifacts(d: str) -> list[tuple[str, str]]:
    others = [mlflow_artifacts(o) for o in DOMAINS if o != d]
    return [(a, f"{prefix}1/0a1b2c/artifacts/charts/loss.png") for prefix in others for a in ("s3:GetObject", "s3:PutObject")]


NEEDS = {f"{d}/{r}": for_domain(TASK_NEEDS[r], d) for d in DOMAINS for r in TASK_ROLES}
NEEDS["flyte-backend"] = FLYTE_BACKEND_NEEDS
NEEDS |= {f"{d}/mlflow": mlflow_for_domain(MLFLOW_NEEDS, d) for d in DOMAINS}
MUST_NOT = {f"{d}/{r}": for_domain(TASK_MUST_NOT[r], d) for d in DOMAINS for r in TASK_ROLES}
MUST_NOT["flyte-backend"] = FLYTE_BACKEND_MUST_NOT
MUST_NOT |= {f"{d}/mlflow": mlflow_for_domain(MLFLOW_MUST_NOT, d) + other_domains_artifacts(d) for d in DOMAINS}

# Listings (bucket, s3:prefix) that each task role's code sends: the store lists with
# Prefix=<store prefix>/<folder>/ (S3Store._iter_keys, boto3 list_objects_v2), and a HEAD of a
# missing key (Store.exists, is_committed) is answered 404, not 403, only to a caller that may list
# with that key as s3:prefix (403 would abort the task). {S} is the domain's store, {D} the domain.
FLYTE_LISTS = [  # flytekit (s3fs) HEADs and lists the Flyte paths a task reads
    ("pretrain-flyte", "metadata/propeller/pretrain-{D}-abc/n1/data/inputs.pb"),
    ("pretrain-flyte", "pretrain/{D}/data/ab/abc-n1-0/"),  # a FlyteDirectory's download
    ("pretrain-flyte", "uploads/pretrain/{D}/QWERTY/fast1a2b.tar.gz"),
]
TASK_LISTS = {
    "data": [
        ("pretrain", "incoming/batch-1/"),  # sources._s3_files: the corpus of data.sources
        ("pretrain", "{S}/datasets/work-3285529b/"),  # prepare: delete_prefix of the run's work prefix
        ("pretrain", "{S}/datasets/3285529b5983f404/_COMMITTED"),  # prepare: is_committed, the marker missing
        ("pretrain", "{S}/models/gpt-tiny/"),  # find_base_model: the versions (registry._versions)
        ("pretrain", "{S}/models/gpt-tiny/aliases/latest.json"),  # find_gate_holder: an alias not set yet
        *FLYTE_LISTS,
    ],
    "train": [
        ("pretrain", "{S}/runs/"),  # runs.run_ids
        ("pretrain", "{S}/runs/9f0e/checkpoints/"),  # contracts.committed_steps (resume)
        ("pretrain", "{S}/runs/9f0e/lease.json"),  # RunLease: exists, no lease yet
        ("pretrain", "{S}/datasets/3285529b5983f404/shards/"),
        ("pretrain", "{S}/models/gpt-tiny/4/hf/"),  # evaluate: the baseline's export
        *FLYTE_LISTS,
    ],
    "registry": [
        ("pretrain", "{S}/runs/9f0e/checkpoints/step-0000300/"),  # register: the checkpoint's files
        ("pretrain", "{S}/models/gpt-tiny/"),  # _versions
        ("pretrain", "{S}/models/gpt-tiny/registrations/ab12.json"),  # _claim_registration: no claim yet
        ("pretrain", "{S}/datasets/3285529b5983f404/_COMMITTED"),
        *FLYTE_LISTS,
    ],
    "reader": [
        ("pretrain", "{S}/runs/"),  # pretrain runs list
        ("pretrain", "{S}/models/"),  # pretrain registry list
        ("pretrain", "{S}/datasets/3285529b5983f404/validation/"),
        ("pretrain", "{S}/models"),  # the folder's own key: a HEAD of it, a listing without the slash
    ],
}
# ... and listings each must not send: the whole bucket (no prefix, or ""), the store of every domain
# or the whole domain, the areas it does not read, a sibling that merely starts like its prefix
TASK_MUST_NOT_LIST = {
    "data": [("pretrain", "{S}/runs/"), ("pretrain", "{S}/_probe/"), ("pretrain", "{S}/datasets-old/")],
    "train": [("pretrain", "incoming/"), ("pretrain", "{S}/_probe/")],
    "registry": [("pretrain", "incoming/"), ("pretrain", "{S}/_probe/")],
    "reader": [("pretrain", "incoming/"), ("pretrain", "{S}/_probe/"), ("pretrain-flyte", "pretrain/{D}/")],
}
for _listings in TASK_MUST_NOT_LIST.values():
    _listings += [("pretrain", None), ("pretrain", ""), ("pretrain", "store/"), ("pretrain", "{S}/"), ("pretrain", "{S}")]
    _listings += [("pretrain", "store/*"), ("pretrain-flyte", None), ("pretrain-flyte", ""), ("pretrain-flyte", "metadata/")]


# The MLflow server lists a run's artifacts (list_objects_v2, Prefix=<destination>/<experiment>/<run>/artifacts/)
MLFLOW_LISTS = [("pretrain", "mlflow-artifacts/{D}/1/0a1b2c/artifacts/"), ("pretrain", "mlflow-artifacts/{D}")]
MLFLOW_MUST_NOT_LIST = [
    ("pretrain", None),
    ("pretrain", ""),
    ("pretrain", "mlflow-artifacts/"),
    ("pretrain", "mlflow-artifacts/{D}-old/"),
    ("pretrain", "store/{D}/"),
    ("pretrain", "incoming/"),
    ("pretrain-flyte", None),
]


def lists_for_domain(listings: list[tuple[str, str | None]], d: str) -> list[tuple[str, str | None]]:
    key = store(d).removeprefix("pretrain/").rstrip("/")  # an s3:prefix is a key, without the bucket
    return [(b, None if p is None else p.format(S=key, D=d)) for b, p in listings]


def may_list(policy: dict, bucket: str, prefix: str | None) -> bool:
    """Whether ``policy`` lets a ListObjectsV2 on ``bucket`` with Prefix=``prefix`` (None: no Prefix) through."""
    return policy_allows(policy, "s3:ListBucket", arn(bucket), {} if prefix is None else {"s3:prefix": prefix})


def test_every_role_has_a_spec_a_policy_and_a_trust_policy():
    def roles_in(folder):
        per_domain = {f"{d}/{p.stem}" for d in DOMAINS for p in (folder / d).glob("*.json")}
        return per_domain | ({"flyte-backend"} if (folder / "flyte-backend.json").exists() else set())

    assert roles_in(INFRA / "iam") == roles_in(INFRA / "iam" / "trust") == set(ROLES)
    shared = [r for r in TASK_ROLES for f in (INFRA / "iam", INFRA / "iam" / "trust") if (f / f"{r}.json").exists()]
    assert not shared, f"task roles shared by every domain are gone: {shared}"


@pytest.mark.parametrize("role", sorted(ROLES))
def test_policy_grants_nothing_beyond_the_role(role):
    errors = policy_errors(load_json(f"iam/{role}.json"), ROLES[role])
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("role", sorted(ROLES))
def test_policy_grants_what_the_roles_tasks_need(role):
    policy = load_json(f"iam/{role}.json")
    missing = [(a, o) for a, o in NEEDS[role] if not policy_allows(policy, a, arn(o))]
    assert not missing, missing
    granted = [(a, o) for a, o in MUST_NOT[role] if policy_allows(policy, a, arn(o))]
    assert not granted, granted


@pytest.mark.parametrize("role", TASK_ROLES)
@pytest.mark.parametrize("domain", DOMAINS)
def test_each_role_lists_where_its_tasks_list_and_nowhere_else(domain, role):
    policy = load_json(f"iam/{domain}/{role}.json")
    refused = [(b, p) for b, p in lists_for_domain(TASK_LISTS[role], domain) if not may_list(policy, b, p)]
    assert not refused, f"{domain}/{role} may not list {refused}"
    granted = [(b, p) for b, p in lists_for_domain(TASK_MUST_NOT_LIST[role], domain) if may_list(policy, b, p)]
    assert not granted, f"{domain}/{role} may list {granted}"


@pytest.mark.parametrize("domain", DOMAINS)
def test_each_mlflow_server_lists_only_its_domains_artifacts(domain):
    policy = load_json(f"iam/{domain}/mlflow.json")
    own = [(b, p.format(D=domain)) for b, p in MLFLOW_LISTS]
    refused = [(b, p) for b, p in own if not may_list(policy, b, p)]
    assert not refused, f"{domain}/mlflow may not list {refused}"
    others = [(b, p if p is None else p.format(D=domain)) for b, p in MLFLOW_MUST_NOT_LIST]
    others += [("pretrain", f"mlflow-artifacts/{other}/1/") for other in DOMAINS if other != domain]
    granted = [(b, p) for b, p in others if may_list(policy, b, p)]
    assert not granted, f"{domain}/mlflow may list {granted}"


def test_flyte_backend_lists_its_whole_bucket_and_nothing_of_the_store():
    """Flyte's control plane serves every domain: pretrain-flyte unconditionally, never pretrain."""
    policy = load_json("iam/flyte-backend.json")
    assert may_list(policy, "pretrain-flyte", None) and may_list(policy, "pretrain-flyte", "metadata/propeller/")
    assert not any(may_list(policy, "pretrain", p) for p in (None, "", "store/production/", "incoming/"))


@pytest.mark.parametrize("domain", DOMAINS)
def test_reader_can_only_get_and_list(domain):
    policy = load_json(f"iam/{domain}/reader.json")
    actions = {a for st in policy["Statement"] for a in st["Action"]}
    assert actions == {"s3:GetObject", "s3:ListBucket"}


# ----------------------------------------------------------------------------------------------
# IRSA: ServiceAccount annotations <-> role names <-> trust policies

ROLE_ARN = re.compile(r"^arn:aws:iam::(\d{12}):role/pretrain-([a-z-]+)$")
DOMAIN_ROLE = re.compile(rf"^({'|'.join(DOMAINS)})-([a-z]+)$")
IRSA = "eks.amazonaws.com/role-arn"


def service_account_roles() -> dict[str, set[str]]:
    """{role: {system:serviceaccount:<ns>:<name>}} from every annotated ServiceAccount; a role
    pretrain-<domain>-<name> is "<domain>/<name>"."""
    out: dict[str, set[str]] = {}
    accounts = [
        (sa["metadata"]["namespace"], sa["metadata"]["name"], sa["metadata"]["annotations"][IRSA])
        for sa in objects("k8s/service-accounts.yaml", "ServiceAccount") + objects("k8s/mlflow.yaml", "ServiceAccount")
    ]
    values = flyte_values()
    accounts.append(("flyte", "flyte-binary", values["serviceAccount"]["annotations"][IRSA]))
    for ns, name, role_arn in accounts:
        match = ROLE_ARN.match(role_arn)
        assert match, f"{ns}/{name}: {role_arn!r} is not a pretrain role ARN"
        role = DOMAIN_ROLE.sub(r"\1/\2", match.group(2))
        out.setdefault(role, set()).add(f"system:serviceaccount:{ns}:{name}")
    return out


def trust_errors(doc: dict, subjects: set[str]) -> list[str]:
    errors = []
    (st,) = doc["Statement"]
    federated = st.get("Principal", {}).get("Federated", "")
    provider = federated.partition("oidc-provider/")[2]
    if not provider.startswith("oidc.eks.") or st.get("Action") != "sts:AssumeRoleWithWebIdentity":
        errors.append("trust: must be an EKS OIDC provider assuming with sts:AssumeRoleWithWebIdentity")
    if st.get("Effect") != "Allow" or set(st.get("Condition", {})) != {"StringEquals"}:
        errors.append("trust: exact StringEquals conditions only (no StringLike wildcards)")
    cond = st.get("Condition", {}).get("StringEquals", {})
    if cond.get(f"{provider}:aud") != "sts.amazonaws.com":
        errors.append("trust: audience must be sts.amazonaws.com")
    subs = cond.get(f"{provider}:sub")
    subs = set(subs if isinstance(subs, list) else [subs])
    if subs != subjects:
        errors.append(f"trust: subjects {sorted(subs)} != ServiceAccounts using the role {sorted(subjects)}")
    return errors


def test_service_accounts_exist_per_role_in_every_pretrain_namespace():
    accounts = {(sa["metadata"]["namespace"], sa["metadata"]["name"]) for sa in objects("k8s/service-accounts.yaml")}
    expected = {(ns, f"pretrain-{r}") for ns in PRETRAIN_NAMESPACES for r in ("data", "train", "registry", "reader")}
    assert accounts == expected
    for sa in objects("k8s/service-accounts.yaml"):
        role = sa["metadata"]["labels"]["pretrain.example.org/role"]
        domain = sa["metadata"]["namespace"].removeprefix(f"{PROJECT}-")
        assert sa["metadata"]["annotations"][IRSA].endswith(f":role/pretrain-{domain}-{role}"), sa["metadata"]
        assert sa["automountServiceAccountToken"] is False


@pytest.mark.slow
def test_every_task_runs_as_a_service_account_that_exists_in_every_pretrain_namespace():
    from tests.helpers import registration_facts

    accounts = {(sa["metadata"]["namespace"], sa["metadata"]["name"]) for sa in objects("k8s/service-accounts.yaml")}
    for profile, facts in registration_facts()["profiles"].items():
        used = facts["service_accounts"]
        assert used == {
            "data": "pretrain-data",
            "train": "pretrain-train",
            "evaluate": "pretrain-train",
            "registry": "pretrain-registry",
        }
        for kind, name in used.items():
            missing = [ns for ns in PRETRAIN_NAMESPACES if (ns, name) not in accounts]
            assert not missing, f"{profile}: {kind} tasks run as {name}, absent from {missing}"


def test_trust_policies_admit_exactly_the_service_accounts_of_the_role():
    roles = service_account_roles()
    assert set(roles) == set(ROLES), "every role is used by a ServiceAccount, every annotated role exists"
    for role, subjects in roles.items():
        errors = trust_errors(load_json(f"iam/trust/{role}.json"), subjects)
        assert not errors, f"{role}: {errors}"


# ----------------------------------------------------------------------------------------------
# The checkers reject bad policies


def _data_policy() -> dict:
    return copy.deepcopy(load_json("iam/production/data.json"))


def _add(statement: dict) -> dict:
    policy = _data_policy()
    policy["Statement"].append({"Effect": "Allow", **statement})
    return policy


_OWN = {"StringLike": {"s3:prefix": ["store/production/datasets", "store/production/datasets/*"]}}


def _list(condition: dict, bucket: str = "pretrain") -> dict:
    """The production data policy plus a ListBucket on ``bucket`` under ``condition`` ({}: none)."""
    return _add(
        {"Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{bucket}", **({"Condition": condition} if condition else {})}
    )


@pytest.mark.parametrize(
    "bad, expected",
    [
        (_add({"Action": "s3:*", "Resource": "arn:aws:s3:::pretrain/store/datasets/*"}), "'s3:*' is not an explicit"),
        (_add({"Action": "*", "Resource": "*"}), "'*' is not an explicit"),
        (_add({"Action": "s3:GetObject", "Resource": "*"}), "is not an S3 ARN"),
        (_add({"Action": "s3:GetObject", "Resource": "arn:aws:s3:::*"}), "wildcard"),
        (_add({"Action": "s3:Put*", "Resource": "arn:aws:s3:::pretrain/store/datasets/*"}), "not an explicit"),
        (_add({"Action": "s3:PutObject", "Resource": "arn:aws:s3:::pretrain/store/runs/*"}), "outside"),
        (_add({"Action": "s3:PutObject", "Resource": "arn:aws:s3:::pretrain/store/*"}), "outside"),
        (_add({"Action": "s3:DeleteObject", "Resource": "arn:aws:s3:::pretrain/store/models/*"}), "outside"),
        (_add({"Action": "s3:GetObject", "Resource": "arn:aws:s3:::pretrain/store/*/manifest.json"}), "wildcard"),
        (_add({"Action": "s3:PutObject", "Resource": "arn:aws:s3:::pretrain"}), "needs object ARNs"),
        (_add({"Action": "s3:ListBucket", "Resource": "arn:aws:s3:::other-bucket"}), "may list only"),
        (_add({"Action": "s3:DeleteBucket", "Resource": "arn:aws:s3:::pretrain"}), "not an explicit"),
        (_add({"NotAction": "s3:DeleteObject", "Resource": "arn:aws:s3:::pretrain/*"}), "NotAction"),
        (_add({"Action": "s3:GetObject", "Resource": "arn:aws:s3:::pretrain/*", "Condition": {}}), "Condition"),
        (_list({}), "on the whole bucket 'pretrain': role may list only"),  # the defect: every domain's keys
        (_list({"StringLike": {"s3:prefix": "store/*"}}), "with s3:prefix 'store/*': role may list only"),
        (_list({"StringLike": {"s3:prefix": "*"}}), "with s3:prefix '*': role may list only"),
        (_list({"StringLike": {"s3:prefix": ["store/production/models/*", ""]}}), "with s3:prefix '': role may"),
        (_list({"StringLike": {"s3:prefix": "store/development/datasets/*"}}), "may list only"),  # another domain
        (_list({"StringLike": {"s3:prefix": "store/production/datasets*"}}), "may list only"),  # datasets-old/ too
        (_list({"StringLike": {"s3:prefix": "store/production/runs/*"}}), "may list only"),  # an area it does not read
        (_list({"StringLike": {"s3:prefix": "store/production/*/x/"}}), "has a wildcard before its end"),
        (_list({"StringLike": {"s3:prefix": "store/?roduction/datasets/"}}), "has a wildcard before its end"),
        (_list({"StringEquals": {"s3:prefix": "store/"}}), "with s3:prefix 'store/': role may list only"),
        (_list({"NumericLessThan": {"s3:max-keys": "10"}}), "is not one StringLike/StringEquals on s3:prefix"),
        (_list({"StringLike": {"aws:SourceVpc": "vpc-*"}}), "is not one StringLike/StringEquals on s3:prefix"),
        (_list({"StringLikeIfExists": {"s3:prefix": "store/production/datasets/*"}}), "is not one StringLike"),
        (
            _add({"Action": "s3:GetObject", "Resource": "arn:aws:s3:::pretrain/*", "Condition": _OWN}),
            "may only limit s3:ListBucket",
        ),
        ({**_data_policy(), "Version": "2008-10-17"}, "Version"),
        ({"Version": "2012-10-17", "Statement": []}, "non-empty"),
    ],
)
def test_policy_checker_rejects_bad_policies(bad, expected):
    errors = policy_errors(bad, ROLES["production/data"])
    assert any(expected in e for e in errors), errors


def test_policy_checker_accepts_the_listing_forms_of_the_roles():
    """The bare folder (its own key) and ``folder/*``; a literal prefix inside; StringEquals too."""
    spec = ROLES["production/data"]
    assert not policy_errors(_list(_OWN), spec)
    assert not policy_errors(_list({"StringEquals": {"s3:prefix": ["store/production/models/", "incoming/batch-1/"]}}), spec)
    assert not policy_errors(
        _list({"StringLike": {"s3:prefix": "metadata/propeller/pretrain-production-*"}}, "pretrain-flyte"), spec
    )
    assert policy_errors(_list({"StringLike": {"s3:prefix": "metadata/propeller/*"}}, "pretrain-flyte"), spec)


def test_policy_checker_rejects_each_real_policy_under_a_narrower_role():
    """The checker is not vacuous: each writing role's real policy fails every other role's specification."""
    for role in [r for r in ROLES if not r.endswith("/reader")]:
        for other in ROLES.keys() - {role}:
            assert policy_errors(load_json(f"iam/{role}.json"), ROLES[other]), f"{role}.json passes as {other}"


def test_trust_checker_rejects_wrong_subjects():
    roles = service_account_roles()
    doc = copy.deepcopy(load_json("iam/trust/production/train.json"))
    assert not trust_errors(doc, roles["production/train"])
    assert trust_errors(doc, roles["production/data"])
    assert trust_errors(doc, roles["development/train"])
    (st,) = doc["Statement"]
    provider = st["Principal"]["Federated"].partition("oidc-provider/")[2]
    st["Condition"] = {"StringLike": {f"{provider}:sub": "system:serviceaccount:*:*"}}
    assert any("StringLike" in e for e in trust_errors(doc, roles["production/train"]))


# ----------------------------------------------------------------------------------------------
# The evaluator decides the conditions the policies use, and refuses the ones it does not know

BUCKET = "arn:aws:s3:::pretrain"


def _listing(condition: dict, effect: str = "Allow") -> dict:
    return {
        "Version": "2012-10-17",
        "Statement": [{"Effect": effect, "Action": "s3:ListBucket", "Resource": BUCKET, "Condition": condition}],
    }


def _lists(policy: dict, prefix: str | None = None, **headers: str) -> bool:
    """A ListBucket on pretrain with Prefix=``prefix`` (None: none); ``headers``: more condition keys (if_match=...)."""
    context = {f"s3:{k.replace('_', '-')}": v for k, v in headers.items()} | ({} if prefix is None else {"s3:prefix": prefix})
    return policy_allows(policy, "s3:ListBucket", BUCKET, context)


def test_iam_wildcards_are_star_and_question_mark_only():
    assert iam_match("store/*", "store/") and iam_match("store/*", "store/a/b/c")  # * crosses "/" and matches nothing
    assert iam_match("store/?/x", "store/a/x")
    assert not iam_match("store/?/x", "store//x") and not iam_match("store/?/x", "store/ab/x")  # ? is exactly one
    assert not iam_match("store/[ab]", "store/a") and iam_match("store/[ab]", "store/[ab]")  # no character classes
    assert not iam_match("Store/*", "store/a") and iam_match("S3:ListBucket", "s3:listbucket", ignore_case=True)


def test_conditions_or_their_values_and_their_keys_and_operators():
    one_of = _listing({"StringLike": {"s3:prefix": ["store/production/runs/*", "store/production/models/*"]}})
    assert _lists(one_of, "store/production/models/gpt/") and _lists(one_of, "store/production/runs/")  # values: OR
    assert not _lists(one_of, "store/production/datasets/")
    assert not _lists(one_of) and not _lists(one_of, "")  # no Prefix: the key is absent; "" matches no pattern here
    exact = _listing({"StringEquals": {"s3:prefix": "store/production/runs/*"}})  # StringEquals: * is a character
    assert _lists(exact, "store/production/runs/*") and not _lists(exact, "store/production/runs/x")
    both_keys = _listing({"StringLike": {"s3:prefix": "store/production/*", "s3:if-match": "?*"}})
    assert not _lists(both_keys, "store/production/runs/")  # one key of the two holds: keys AND
    assert _lists(both_keys, "store/production/runs/", if_match='"e1"')
    both_operators = _listing({"StringLike": {"s3:prefix": "store/production/*"}, "Null": {"s3:if-match": "true"}})
    assert _lists(both_operators, "store/production/runs/")
    assert not _lists(both_operators, "store/production/runs/", if_match='"e1"')  # operators AND
    assert not _lists(both_operators, "store/staging/runs/")
    assert _lists(_listing({"StringLike": {"S3:Prefix": "x/*"}}), "x/")  # key names are case-insensitive


def test_an_explicit_deny_wins_over_an_allow():
    policy = _listing({"StringLike": {"s3:prefix": "store/*"}})
    policy["Statement"] += _listing({"StringLike": {"s3:prefix": "store/production/*"}}, effect="Deny")["Statement"]
    assert _lists(policy, "store/staging/runs/")
    assert not _lists(policy, "store/production/runs/")
    real = copy.deepcopy(load_json("iam/production/reader.json"))
    assert _lists(real, "store/production/runs/")
    real["Statement"].append({"Effect": "Deny", "Action": "s3:*", "Resource": "*"})
    assert not _lists(real, "store/production/runs/")
    assert not policy_allows(real, "s3:GetObject", "arn:aws:s3:::pretrain/store/production/runs/r/metrics.jsonl")


@pytest.mark.parametrize(
    "condition, expected",
    [
        ({"NumericLessThan": {"s3:max-keys": "10"}}, "condition operator 'NumericLessThan' is not one this evaluator decides"),
        ({"StringNotLike": {"s3:prefix": "store/production/*"}}, "'StringNotLike' is not one this evaluator decides"),
        ({"StringLikeIfExists": {"s3:prefix": "store/*"}}, "'StringLikeIfExists' is not one"),
        ({"ForAnyValue:StringLike": {"s3:prefix": "store/*"}}, "'ForAnyValue:StringLike' is not one"),
        ({"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}, "'IpAddress' is not one"),
        (
            {"StringLike": {"aws:SourceVpc": "vpc-1"}},
            "condition key 'aws:SourceVpc' (StringLike) is not one a request here carries",
        ),
        ({"StringEquals": {"s3:delimiter": "/"}}, "condition key 's3:delimiter'"),
        ({"StringLike": {"s3:prefix": "home/${aws:username}/*"}}, "no policy variables"),
        ({"StringLike": {"s3:prefix": []}}, "takes plain strings"),
        ({"StringLike": {"s3:prefix": 3}}, "takes plain strings"),
        ({"Bool": {"s3:ObjectCreationOperation": "maybe"}}, "takes true or false"),
        ({"StringLike": {}}, "must map condition keys to values"),
        ({}, "a Condition is a non-empty object"),
        ("s3:prefix=store/", "a Condition is a non-empty object"),
    ],
)
def test_the_evaluator_raises_on_a_condition_it_cannot_evaluate(condition, expected):
    """Whatever the request: a Deny it skipped would read as allowed, an Allow it skipped as denied."""
    for effect in ("Allow", "Deny"):
        for context in ({}, {"s3:prefix": "store/production/runs/"}):
            with pytest.raises(PolicyEvaluationError) as raised:
                policy_allows(_listing(condition, effect), "s3:ListBucket", BUCKET, context)
            assert expected in str(raised.value)


@pytest.mark.parametrize(
    "statement, expected",
    [
        (
            {
                "Effect": "Deny",
                "Action": "s3:ListBucket",
                "Resource": "arn:aws:s3:::other",
                "Condition": {"DateLessThan": {"aws:CurrentTime": "2030-01-01"}},
            },
            "'DateLessThan'",
        ),
        (
            {"Effect": "Allow", "NotPrincipal": {"AWS": "x"}, "Action": "s3:GetObject", "Resource": "arn:aws:s3:::other/*"},
            "elements ['NotPrincipal']",
        ),
        (
            {"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::1:root"}, "Action": "s3:GetObject", "Resource": "*"},
            "only everyone",
        ),
        (
            {"Effect": "Allow", "Action": "s3:GetObject", "NotResource": "x", "Resource": "y"},
            "exactly one of Resource and NotResource",
        ),
        (
            {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::pretrain/${aws:username}/*"},
            "policy variables",
        ),
        ({"Effect": "allow", "Action": "s3:GetObject", "Resource": "*"}, "Effect must be Allow or Deny"),
    ],
)
def test_the_evaluator_raises_on_a_statement_it_cannot_evaluate_even_one_no_request_reaches(statement, expected):
    """Every statement is checked on every evaluation, also one on another bucket or action."""
    policy = copy.deepcopy(load_json("iam/production/reader.json"))
    policy["Statement"].append(statement)
    with pytest.raises(PolicyEvaluationError) as raised:
        policy_allows(policy, "s3:GetObject", "arn:aws:s3:::pretrain/store/production/runs/r/metrics.jsonl")
    assert expected in str(raised.value)
