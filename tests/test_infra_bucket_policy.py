"""infra/s3/pretrain-bucket-policy.json: the bucket refuses to rewrite the registry.

Objects under ``store/<domain>/models/`` can only be created (``If-None-Match: *``), aliases also replaced
if unchanged (``If-Match``); nothing there can be deleted. The policy is checked three ways: its
shape; the evaluator of tests/helpers.py on its Deny statements (the Null and Bool conditions it uses,
Resource and NotResource wildcards) against requests it must refuse and requests it must let through,
and against broken copies of it; and against the very requests the registry sends to a real
S3 server during a registration, a promotion and a multipart copy (recorded from boto3).
"""

from __future__ import annotations

import copy
import os

import pytest

from registry.registry import promote, register
from tests.helpers import INFRA, load_json, matching_statements, registry_inputs, report

POLICY = "s3/pretrain-bucket-policy.json"
STORE = "pretrain/store/"  # the bucket and prefix of the stores
BUCKET = STORE + "production/"  # a domain's store, s3://pretrain/store/<domain> (infra/README.md)
ARN = "arn:aws:s3:::"


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def denied(policy: dict, action: str, path: str, context: dict[str, str]) -> list[str]:
    """The Sids of the Deny statements that refuse ``action`` on ``bucket/key`` with ``context``
    (tests/helpers.py's evaluator: IAM wildcards, Resource/NotResource, the Null and Bool conditions;
    it raises on any condition it does not evaluate)."""
    return [st.get("Sid", "?") for st in matching_statements(policy, action, ARN + path, context) if st["Effect"] == "Deny"]


def put(if_none_match: bool = False, if_match: bool = False, creation: bool = True) -> dict[str, str]:
    """The condition keys of a PutObject-authorized request: PutObject, CompleteMultipartUpload
    (``creation``) or CreateMultipartUpload/UploadPart (not ``creation``: they take no conditional
    headers)."""
    context = {"s3:ObjectCreationOperation": str(creation).lower()}
    if if_none_match:
        context["s3:if-none-match"] = "*"
    if if_match:
        context["s3:if-match"] = '"0123abcd"'
    return context


ENTRY = BUCKET + "models/gpt-tiny/4/"
ALIAS = BUCKET + "models/gpt-tiny/aliases/production.json"
UNDIVIDED = STORE + "models/gpt-tiny/"  # a store without a domain folder, s3://pretrain/store

MUST_DENY = [
    ("s3:PutObject", ENTRY + "card.json", put()),  # a plain overwrite of a committed card
    ("s3:PutObject", ENTRY + "card.json", put(if_match=True)),  # a replace "if unchanged" of a version
    ("s3:PutObject", ENTRY + "checkpoint/model/__0_0.distcp", put()),  # a multipart completion without If-None-Match
    ("s3:PutObject", ENTRY + "_COMMITTED", put()),
    ("s3:PutObject", ALIAS, put()),  # an alias moved without checking who moved it last
    ("s3:PutObject", BUCKET + "runs/9f0e/metrics.jsonl", put(if_match=True)),  # If-Match is for aliases only
    ("s3:DeleteObject", ENTRY + "card.json", {}),  # delete, then create again: a rewrite too
    ("s3:DeleteObjectVersion", ENTRY + "card.json", {}),
    ("s3:DeleteObject", ALIAS, {}),
    ("s3:PutObject", STORE + "development/models/gpt-tiny/1/card.json", put()),
    ("s3:PutObject", UNDIVIDED + "1/card.json", put()),
    ("s3:PutObject", UNDIVIDED + "1/card.json", put(if_match=True)),
    ("s3:PutObject", UNDIVIDED + "aliases/production.json", put()),
]
MUST_ALLOW = [
    ("s3:PutObject", ENTRY + "card.json", put(if_none_match=True)),  # register: create only
    ("s3:PutObject", ENTRY + "checkpoint/model/__0_0.distcp", put(creation=False)),  # CreateMultipartUpload, UploadPart
    ("s3:PutObject", ENTRY + "checkpoint/model/__0_0.distcp", put(if_none_match=True)),  # conditional completion
    ("s3:PutObject", ALIAS, put(if_none_match=True)),  # an alias's first write
    ("s3:PutObject", ALIAS, put(if_match=True)),  # an alias moved if unchanged
    ("s3:PutObject", BUCKET + "models/gpt-tiny/aliases/latest.json", put(if_match=True)),
    ("s3:PutObject", BUCKET + "datasets/3285529b5983f404/shards/train-000000.tar", put()),  # other stages as before
    ("s3:PutObject", BUCKET + "runs/9f0e/checkpoints/step-0000300/meta.json", put()),
    ("s3:DeleteObject", BUCKET + "runs/9f0e/checkpoints/step-0000150/meta.json", {}),  # keep_checkpoints
    ("s3:PutObject", BUCKET + "_probe/17", put()),
    ("s3:DeleteObject", BUCKET + "_probe/17", {}),
    ("s3:GetObject", ENTRY + "card.json", {}),
    ("s3:PutObject", UNDIVIDED + "1/card.json", put(if_none_match=True)),
    ("s3:PutObject", UNDIVIDED + "aliases/production.json", put(if_match=True)),
    ("s3:PutObject", STORE + "staging/models/gpt-tiny/aliases/latest.json", put(if_match=True)),
]


def violations(policy: dict) -> list[str]:
    out = [f"not denied: {a} {p} {c}" for a, p, c in MUST_DENY if not denied(policy, a, p, c)]
    out += [f"denied by {denied(policy, a, p, c)}: {a} {p} {c}" for a, p, c in MUST_ALLOW if denied(policy, a, p, c)]
    return out


def test_the_policy_only_denies_and_names_the_store_bucket():
    policy = load_json(POLICY)
    assert policy["Version"] == "2012-10-17" and policy["Statement"]
    for st in policy["Statement"]:
        assert st["Effect"] == "Deny" and st["Principal"] == "*", st  # it grants nothing: the roles do
        for resource in _as_list(st.get("Resource", st.get("NotResource"))):
            # the registry's objects, and the one run file replaced in place: its lease's heartbeat
            kept = "/models/" in resource or resource.endswith("/runs/*/lease.json")
            assert resource.startswith(ARN + STORE) and kept, resource
    assert (INFRA / POLICY).is_file()


def test_the_policy_refuses_rewrites_and_lets_the_pipeline_write():
    assert violations(load_json(POLICY)) == []


def _without_condition_key(policy: dict, sid: str, operator: str, key: str) -> dict:
    policy = copy.deepcopy(policy)
    for st in policy["Statement"]:
        if st["Sid"] == sid:
            del st["Condition"][operator][key]
            if not st["Condition"][operator]:
                del st["Condition"][operator]
    return policy


def _without_statement(policy: dict, sid: str) -> dict:
    policy = copy.deepcopy(policy)
    policy["Statement"] = [st for st in policy["Statement"] if st["Sid"] != sid]
    return policy


def _widened(policy: dict) -> dict:
    policy = copy.deepcopy(policy)
    policy["Statement"][0]["Resource"] = ARN + STORE + "*"
    return policy


@pytest.mark.parametrize(
    "broken",
    [
        lambda p: _without_condition_key(p, "DenyUnconditionalWritesToModels", "Null", "s3:if-match"),  # no alias CAS
        lambda p: _without_condition_key(p, "DenyUnconditionalWritesToModels", "Bool", "s3:ObjectCreationOperation"),
        lambda p: _without_statement(p, "DenyUnconditionalWritesToModels"),
        lambda p: _without_statement(p, "DenyReplacingObjectsOutsideAliases"),
        lambda p: _without_statement(p, "DenyDeletingModels"),
        _widened,  # would stop the data and train stages
    ],
    ids=["no-if-match-exemption", "multipart-parts-denied", "no-create-only", "versions-replaceable", "deletable", "widened"],
)
def test_the_checks_reject_broken_policies(broken):
    assert violations(broken(load_json(POLICY)))


# ----------------------------------------------------------------------------------------------
# The registry's real requests on a real S3 server pass the policy

# boto3 operation → (IAM action, object creation?) for the requests a registration sends
OPERATIONS = {
    "PutObject": ("s3:PutObject", True),
    "CompleteMultipartUpload": ("s3:PutObject", True),
    "CreateMultipartUpload": ("s3:PutObject", False),
    "UploadPart": ("s3:PutObject", False),
    "AbortMultipartUpload": ("s3:AbortMultipartUpload", False),
    "CopyObject": ("s3:PutObject", True),
    "DeleteObject": ("s3:DeleteObject", False),
    "DeleteObjects": ("s3:DeleteObject", False),
}


def _record(store) -> list[tuple[str, str, dict[str, str]]]:
    """Every write ``store``'s client sends from now on, as (action, bucket path, condition keys)."""
    sent: list[tuple[str, str, dict[str, str]]] = []

    def hook(params, model, **_):
        if model.name not in OPERATIONS:
            return
        action, creation = OPERATIONS[model.name]
        if "Key" not in params:  # DeleteObjects: one request for many keys, each a DeleteObject to the policy
            for obj in params["Delete"]["Objects"]:
                sent.append((action, BUCKET + obj["Key"][len(store.prefix) + 1 :], {}))
            return
        rel = params["Key"][len(store.prefix) + 1 :]
        context = {"s3:ObjectCreationOperation": str(creation).lower()} if action == "s3:PutObject" else {}
        if params.get("IfNoneMatch"):
            context["s3:if-none-match"] = params["IfNoneMatch"]
        if params.get("IfMatch"):
            context["s3:if-match"] = params["IfMatch"]
        if params.get("CopySource"):
            context["s3:x-amz-copy-source"] = str(params["CopySource"])
        sent.append((action, BUCKET + rel, context))

    store.client.meta.events.register("provide-client-params.s3", hook)
    return sent


def test_the_registrys_own_requests_pass_the_policy(s3_store):
    policy = load_json(POLICY)
    store = registry_inputs(s3_store, weights=os.urandom(11 * 1024 * 1024))
    store.multipart_threshold = store.multipart_chunk = 5 * 1024 * 1024  # the weights go in parts
    sent = _record(store)
    evaluation = {"evaluation": {"batch_size": 16, "max_batches": 16}}
    register(store, "gpt", report(2.0), config=evaluation, gate_alias="production")
    register(store, "gpt", report(1.0), config=evaluation, gate_alias="production")
    promote(store, "gpt:1", "staging")
    promote(store, "gpt:2", "staging")
    writes = [(a, p, c) for a, p, c in sent if p.startswith(BUCKET + "models/")]
    operations = {(a, c.get("s3:ObjectCreationOperation")) for a, _, c in writes}
    assert ("s3:PutObject", "false") in operations  # the multipart parts were recorded too
    assert any("s3:if-match" in c for _, p, c in writes if p.endswith("aliases/production.json"))
    refused = [(a, p, c, denied(policy, a, p, c)) for a, p, c in writes if denied(policy, a, p, c)]
    assert not refused, refused
    # ... and a writer that overwrites a committed card is refused by it
    store.put_bytes("models/gpt/1/card.json", b"{}")
    action, path, context = sent[-1]
    assert path == BUCKET + "models/gpt/1/card.json"
    assert denied(policy, action, path, context) == ["DenyUnconditionalWritesToModels"]


def test_the_run_leases_own_requests_pass_the_policy(s3_store):
    """The lease's heartbeat is a conditional replace (If-Match) of ``runs/<id>/lease.json``: the policy
    denied it, the lease swallowed the error, and on a protected bucket the heartbeat never advanced (an
    identical execution's takeover failed, gc judged a live run's lease dead after 10 minutes)."""
    from runs.lease import RunLease

    policy = load_json(POLICY)
    sent = _record(s3_store)
    lease = RunLease(s3_store, "runs/r1", log=lambda line: None)
    assert lease.try_acquire()
    assert lease.refresh() and lease.refresh()
    lease.release()
    actions = [(a, c) for a, p, c in sent if p.endswith("runs/r1/lease.json")]
    assert sum("s3:if-match" in c for _, c in actions) == 2 and any("s3:if-none-match" in c for _, c in actions)
    refused = [(a, p, c, denied(policy, a, p, c)) for a, p, c in sent if denied(policy, a, p, c)]
    assert not refused, refused
    # ... while a conditional replace of any other run file stays refused
    assert denied(policy, "s3:PutObject", BUCKET + "runs/r1/metrics.jsonl", put(if_match=True)) == [
        "DenyReplacingObjectsOutsideAliases"
    ]


def test_a_refused_heartbeat_is_said_not_swallowed(s3_store, monkeypatch):
    from runs.lease import RunLease
    from storage import StoreError

    said: list[str] = []
    lease = RunLease(s3_store, "runs/r2", log=said.append)
    assert lease.try_acquire()

    def refused(*args, **kwargs):
        raise StoreError("S3 AccessDenied: explicit deny in a resource-based policy")

    monkeypatch.setattr(s3_store, "put_json", refused)
    assert lease.refresh() and lease.refresh() and not lease.lost  # not lost: the store may let the next one through
    warnings = [line for line in said if "heartbeat" in line]
    assert len(warnings) == 1 and "AccessDenied" in warnings[0] and "runs/r2/lease.json" in warnings[0], said
    monkeypatch.undo()
    assert lease.refresh() and not lease.heartbeat_failing
    lease.release()
