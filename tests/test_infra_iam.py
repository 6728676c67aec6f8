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
    RoleSpec,
    flyte_values,
    load_json,
    objects,
    policy_allows,
    policy_errors,
)

INCOMING = "pretrain/incoming/"  # configs/nightly.yaml: data.sources (shared by the domains, read-only)
FLYTE = "pretrain-flyte/"  # infra/flyte/values.yaml: configuration.storage
TASK_ROLES = ("data", "train", "registry", "reader")


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
    """What a task role of domain ``d`` may do. The store layout is README "Storage": datasets/, runs/,
    models/; _probe/ is where Store.check() (called by prepare_data) writes and deletes one object."""
    s = store(d)
    both = {"pretrain", "pretrain-flyte"}
    return {
        "data": RoleSpec(
            read={INCOMING, s + "datasets/", s + "models/", *flyte_read(d)},
            write={s + "datasets/", s + "_probe/", *flyte_write(d)},
            delete={s + "datasets/", s + "_probe/"},
            list=both,
        ),
        "train": RoleSpec(
            read={s + "datasets/", s + "models/", s + "runs/", *flyte_read(d)},
            write={s + "runs/", *flyte_write(d)},
            delete={s + "runs/"},
            list=both,
        ),
        "registry": RoleSpec(
            read={s + "runs/", s + "datasets/", s + "models/", *flyte_read(d)},
            write={s + "models/", *flyte_write(d)},
            list=both,
        ),
        "reader": RoleSpec(read={s + "datasets/", s + "runs/", s + "models/"}, list={"pretrain"}),
    }[role]


# One role per domain and identity ("<domain>/<role>": infra/iam/<domain>/<role>.json, IAM role
# pretrain-<domain>-<role>), plus Flyte's control plane, which serves every domain.
ROLES = {f"{d}/{r}": task_role_spec(r, d) for d in DOMAINS for r in TASK_ROLES}
ROLES["flyte-backend"] = RoleSpec(read={FLYTE}, write={FLYTE}, delete={FLYTE}, list={"pretrain-flyte"})


def arn(path: str) -> str:
    return f"arn:aws:s3:::{path}"


# (action, object) that each role must be able to do, from what its tasks call in the code;
# {S} is the domain's store (pretrain/store/<domain>), {D} the domain
TASK_NEEDS = {
    "data": [
        ("s3:ListBucket", "pretrain"),  # Store.list/children; HeadObject returns 404, not 403, on a missing key
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
        ("s3:ListBucket", "pretrain"),
        ("s3:GetObject", "{S}/datasets/3285529b5983f404/shards/train-000000.tar"),
        ("s3:GetObject", "{S}/models/gpt-tiny/3/card.json"),  # train.init_from
        ("s3:PutObject", "{S}/runs/9f0e/checkpoints/step-0000300/model/__0_0.distcp"),
        ("s3:PutObject", "{S}/runs/9f0e/metrics.jsonl"),
        ("s3:DeleteObject", "{S}/runs/9f0e/checkpoints/step-0000150/meta.json"),  # keep_checkpoints
        ("s3:GetObject", "{S}/runs/9f0e/metrics.jsonl"),  # evaluate_model, resume
        ("s3:PutObject", "pretrain-flyte/metadata/propeller/pretrain-{D}-x/n2/data/0/outputs.pb"),
    ],
    "registry": [
        ("s3:ListBucket", "pretrain"),
        ("s3:GetObject", "{S}/runs/9f0e/checkpoints/step-0000300/meta.json"),
        ("s3:GetObject", "{S}/datasets/3285529b5983f404/manifest.json"),
        ("s3:PutObject", "{S}/models/gpt-tiny/4/card.json"),
        ("s3:PutObject", "{S}/models/gpt-tiny/aliases/latest.json"),
        ("s3:PutObject", "pretrain-flyte/metadata/propeller/pretrain-{D}-x/n2/data/0/outputs.pb"),
    ],
    "reader": [
        ("s3:ListBucket", "pretrain"),
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


NEEDS = {f"{d}/{r}": for_domain(TASK_NEEDS[r], d) for d in DOMAINS for r in TASK_ROLES}
NEEDS["flyte-backend"] = FLYTE_BACKEND_NEEDS
MUST_NOT = {f"{d}/{r}": for_domain(TASK_MUST_NOT[r], d) for d in DOMAINS for r in TASK_ROLES}
MUST_NOT["flyte-backend"] = FLYTE_BACKEND_MUST_NOT


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
        for sa in objects("k8s/service-accounts.yaml", "ServiceAccount")
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
        ({**_data_policy(), "Version": "2008-10-17"}, "Version"),
        ({"Version": "2012-10-17", "Statement": []}, "non-empty"),
    ],
)
def test_policy_checker_rejects_bad_policies(bad, expected):
    errors = policy_errors(bad, ROLES["production/data"])
    assert any(expected in e for e in errors), errors


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
