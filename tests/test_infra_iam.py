"""IAM: each role's S3 policy grants what its tasks need and nothing else; IRSA trust matches the ServiceAccounts."""

from __future__ import annotations

import copy
import re

import pytest

from tests.test_infra import (
    INFRA,
    PRETRAIN_NAMESPACES,
    RoleSpec,
    flyte_values,
    load_json,
    objects,
    policy_allows,
    policy_errors,
)

STORE = "pretrain/store/"  # configs/nightly.yaml: store: s3://pretrain/store
INCOMING = "pretrain/incoming/"  # configs/nightly.yaml: data.sources
FLYTE = "pretrain-flyte/"  # infra/flyte/values.yaml: configuration.storage
FLYTE_WRITE = {FLYTE + "metadata/", FLYTE + "data/"}

# What each role may do. The store layout is README "Storage": datasets/, runs/, models/;
# _probe/ is where Store.check() (called by prepare_data) writes and deletes one object.
ROLES = {
    "data": RoleSpec(
        read={INCOMING, STORE + "datasets/", STORE + "models/", FLYTE},
        write={STORE + "datasets/", STORE + "_probe/", *FLYTE_WRITE},
        delete={STORE + "datasets/", STORE + "_probe/"},
        list={"pretrain", "pretrain-flyte"},
    ),
    "train": RoleSpec(
        read={STORE + "datasets/", STORE + "models/", STORE + "runs/", FLYTE},
        write={STORE + "runs/", *FLYTE_WRITE},
        delete={STORE + "runs/"},
        list={"pretrain", "pretrain-flyte"},
    ),
    "registry": RoleSpec(
        read={STORE + "runs/", STORE + "datasets/", STORE + "models/", FLYTE},
        write={STORE + "models/", *FLYTE_WRITE},
        list={"pretrain", "pretrain-flyte"},
    ),
    "reader": RoleSpec(read={STORE + "datasets/", STORE + "runs/", STORE + "models/"}, list={"pretrain"}),
    "flyte-backend": RoleSpec(read={FLYTE}, write={FLYTE}, delete={FLYTE}, list={"pretrain-flyte"}),
}


def arn(path: str) -> str:
    return f"arn:aws:s3:::{path}"


# (action, object) that each role must be able to do, from what its tasks call in the code
NEEDS = {
    "data": [
        ("s3:ListBucket", "pretrain"),  # Store.list/children; HeadObject returns 404, not 403, on a missing key
        ("s3:GetObject", "pretrain/incoming/batch-1/docs.jsonl.gz"),  # fingerprint_corpus, prepare_data
        ("s3:GetObject", "pretrain/store/models/gpt-tiny/aliases/latest.json"),  # find_base_model
        ("s3:GetObject", "pretrain/store/models/gpt-tiny/3/tokenizer.json"),  # prepare_data reuses the tokenizer
        ("s3:PutObject", "pretrain/store/datasets/3285529b5983f404/shards/train-000000.tar"),
        ("s3:AbortMultipartUpload", "pretrain/store/datasets/3285529b5983f404/shards/train-000000.tar"),
        ("s3:DeleteObject", "pretrain/store/datasets/3285529b5983f404/validation/report.html"),  # re-validation
        ("s3:PutObject", "pretrain/store/_probe/17"),  # Store.check()
        ("s3:DeleteObject", "pretrain/store/_probe/17"),
        ("s3:GetObject", "pretrain-flyte/metadata/propeller/pretrain-production-abc/n1/data/inputs.pb"),
        ("s3:PutObject", "pretrain-flyte/metadata/propeller/pretrain-production-abc/n1/data/0/outputs.pb"),
        ("s3:PutObject", "pretrain-flyte/data/ab/abc-n1-0/deck.html"),
    ],
    "train": [
        ("s3:ListBucket", "pretrain"),
        ("s3:GetObject", "pretrain/store/datasets/3285529b5983f404/shards/train-000000.tar"),
        ("s3:GetObject", "pretrain/store/models/gpt-tiny/3/card.json"),  # train.init_from
        ("s3:PutObject", "pretrain/store/runs/9f0e/checkpoints/step-0000300/model/__0_0.distcp"),
        ("s3:PutObject", "pretrain/store/runs/9f0e/metrics.jsonl"),
        ("s3:DeleteObject", "pretrain/store/runs/9f0e/checkpoints/step-0000150/meta.json"),  # keep_checkpoints
        ("s3:GetObject", "pretrain/store/runs/9f0e/metrics.jsonl"),  # evaluate_model, resume
        ("s3:PutObject", "pretrain-flyte/metadata/propeller/x/outputs.pb"),
    ],
    "registry": [
        ("s3:ListBucket", "pretrain"),
        ("s3:GetObject", "pretrain/store/runs/9f0e/checkpoints/step-0000300/meta.json"),
        ("s3:GetObject", "pretrain/store/datasets/3285529b5983f404/manifest.json"),
        ("s3:PutObject", "pretrain/store/models/gpt-tiny/4/card.json"),
        ("s3:PutObject", "pretrain/store/models/gpt-tiny/aliases/latest.json"),
        ("s3:PutObject", "pretrain-flyte/metadata/propeller/x/outputs.pb"),
    ],
    "reader": [
        ("s3:ListBucket", "pretrain"),
        ("s3:GetObject", "pretrain/store/models/gpt-tiny/4/card.json"),
        ("s3:GetObject", "pretrain/store/runs/9f0e/metrics.jsonl"),
        ("s3:GetObject", "pretrain/store/datasets/3285529b5983f404/validation/report.html"),
    ],
    "flyte-backend": [
        ("s3:ListBucket", "pretrain-flyte"),
        ("s3:PutObject", "pretrain-flyte/metadata/propeller/x/inputs.pb"),
        ("s3:GetObject", "pretrain-flyte/data/ab/deck.html"),
        ("s3:DeleteObject", "pretrain-flyte/metadata/propeller/x/inputs.pb"),
    ],
}
# ... and what each must not be able to do
MUST_NOT = {
    "data": [
        ("s3:PutObject", "pretrain/store/runs/9f0e/metrics.jsonl"),
        ("s3:PutObject", "pretrain/store/models/gpt-tiny/4/card.json"),
        ("s3:DeleteObject", "pretrain/store/models/gpt-tiny/3/card.json"),
        ("s3:DeleteObject", "pretrain/store/runs/9f0e/metrics.jsonl"),
        ("s3:PutObject", "pretrain/incoming/x.jsonl"),
        ("s3:DeleteObject", "pretrain/incoming/x.jsonl"),
        ("s3:PutObject", "pretrain/store/datasets"),  # no write to a key that merely starts like the prefix
        ("s3:DeleteBucket", "pretrain"),
    ],
    "train": [
        ("s3:PutObject", "pretrain/store/datasets/v/manifest.json"),
        ("s3:PutObject", "pretrain/store/models/gpt-tiny/4/card.json"),
        ("s3:DeleteObject", "pretrain/store/datasets/v/manifest.json"),
        ("s3:GetObject", "pretrain/incoming/x.jsonl"),
    ],
    "registry": [
        ("s3:PutObject", "pretrain/store/runs/9f0e/metrics.jsonl"),
        ("s3:PutObject", "pretrain/store/datasets/v/manifest.json"),
        ("s3:DeleteObject", "pretrain/store/models/gpt-tiny/4/card.json"),
        ("s3:DeleteObject", "pretrain/store/runs/9f0e/metrics.jsonl"),
    ],
    "reader": [
        ("s3:PutObject", "pretrain/store/models/gpt-tiny/4/card.json"),
        ("s3:DeleteObject", "pretrain/store/runs/9f0e/metrics.jsonl"),
        ("s3:GetObject", "pretrain/incoming/x.jsonl"),
        ("s3:GetObject", "pretrain-flyte/metadata/propeller/x/inputs.pb"),
    ],
    "flyte-backend": [
        ("s3:GetObject", "pretrain/store/models/gpt-tiny/4/card.json"),
        ("s3:ListBucket", "pretrain"),
    ],
}


def test_every_role_has_a_spec_a_policy_and_a_trust_policy():
    policies = {p.stem for p in (INFRA / "iam").glob("*.json")}
    trusts = {p.stem for p in (INFRA / "iam" / "trust").glob("*.json")}
    assert policies == trusts == set(ROLES)


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


def test_reader_can_only_get_and_list():
    policy = load_json("iam/reader.json")
    actions = {a for st in policy["Statement"] for a in st["Action"]}
    assert actions == {"s3:GetObject", "s3:ListBucket"}


# ----------------------------------------------------------------------------------------------
# IRSA: ServiceAccount annotations <-> role names <-> trust policies

ROLE_ARN = re.compile(r"^arn:aws:iam::(\d{12}):role/pretrain-([a-z-]+)$")
IRSA = "eks.amazonaws.com/role-arn"


def service_account_roles() -> dict[str, set[str]]:
    """{role: {system:serviceaccount:<ns>:<name>}} from every annotated ServiceAccount."""
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
        out.setdefault(match.group(2), set()).add(f"system:serviceaccount:{ns}:{name}")
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
        assert sa["metadata"]["annotations"][IRSA].endswith(f":role/pretrain-{role}"), sa["metadata"]
        assert sa["automountServiceAccountToken"] is False


def test_every_task_runs_as_a_service_account_that_exists_in_every_pretrain_namespace():
    from tests.test_infra import registration_facts

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
    return copy.deepcopy(load_json("iam/data.json"))


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
    errors = policy_errors(bad, ROLES["data"])
    assert any(expected in e for e in errors), errors


def test_policy_checker_rejects_each_real_policy_under_a_narrower_role():
    """The checker is not vacuous: each writing role's real policy fails every other role's specification."""
    for role in ROLES.keys() - {"reader"}:
        for other in ROLES.keys() - {role}:
            assert policy_errors(load_json(f"iam/{role}.json"), ROLES[other]), f"{role}.json passes as {other}"


def test_trust_checker_rejects_wrong_subjects():
    roles = service_account_roles()
    doc = copy.deepcopy(load_json("iam/trust/train.json"))
    assert not trust_errors(doc, roles["train"])
    assert trust_errors(doc, roles["data"])
    (st,) = doc["Statement"]
    provider = st["Principal"]["Federated"].partition("oidc-provider/")[2]
    st["Condition"] = {"StringLike": {f"{provider}:sub": "system:serviceaccount:*:*"}}
    assert any("StringLike" in e for e in trust_errors(doc, roles["train"]))
