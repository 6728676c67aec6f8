"""Identical executions (issue 18 item 2): the same registration replayed or made twice at once
gives one version, also after a registration SIGKILLed before its commit; two identical
``pretrain run`` started at the same moment on one store both finish, with one version and every
checkpoint complete, whether they share flytekit's local cache or not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from common.contracts import CARD_MARKDOWN, checkpoint_prefix, committed_steps, model_prefix
from registry.registry import list_models, read_card, register
from storage import open_store
from tests.helpers import BIN, ROOT, distinct_corpus, registry_inputs, report, write_config
from training.checkpoint import fetch

CONFIG = {"evaluation": {"batch_size": 4, "max_batches": 2}, "registry": {"model_name": "gpt"}}


def versions(store) -> list[int]:
    return [row["version"] for row in list_models(store)]


def test_a_replayed_registration_gives_the_same_version(store):
    registry_inputs(store)
    first = register(store, "gpt", report(2.0), config=CONFIG)
    again = register(store, "gpt", report(2.0), config=CONFIG)
    assert again == first and versions(store) == [1]
    assert len(store.list("models/gpt/registrations")) == 1

    other = register(store, "gpt", report(1.5), config=CONFIG)  # another evaluation: another registration
    assert other.version == 2
    late = register(store, "gpt", report(2.0), config=CONFIG)  # a replay long after: latest stays forward
    assert late == first and versions(store) == [1, 2]
    assert {row["version"]: row["aliases"] for row in list_models(store)} == {1: [], 2: ["latest"]}


def test_identical_registrations_at_once_give_one_version(store):
    registry_inputs(store)
    with ThreadPoolExecutor(4) as pool:
        refs = list(pool.map(lambda _: register(open_store(store.uri), "gpt", report(2.0), config=CONFIG), range(4)))
    assert all(ref == refs[0] for ref in refs) and versions(store) == [refs[0].version]
    assert {row["version"]: row["aliases"] for row in list_models(store)} == {refs[0].version: ["latest"]}
    card = read_card(store, refs[0].prefix)
    markdown = store.get_bytes(f"{refs[0].prefix}/{CARD_MARKDOWN}").decode()
    assert f"Registered {card.registered_at}" in markdown  # the card and its page from the same writer


def test_a_registration_killed_before_its_commit_is_completed_by_the_rerun(store, tmp_path):
    weights = os.urandom(200_000)
    registry_inputs(store, weights)
    script = f"from tests.helpers import register_killed_before_commit as r; r({store.uri!r}, 2.0, {CONFIG!r})"
    killed = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    entry = model_prefix("gpt", 1)
    written = store.get_json(f"{entry}/card.json")  # copied and carded, not committed: invisible
    assert not store.is_committed(entry) and versions(store) == []

    ref = register(store, "gpt", report(2.0), config=CONFIG)
    assert ref.version == 1 and versions(store) == [1]
    card = read_card(store, entry)
    assert card.registered_at == written["registered_at"]  # the killed writer's card is the card
    assert f"Registered {card.registered_at}" in store.get_bytes(f"{entry}/{CARD_MARKDOWN}").decode()
    assert store.get_bytes(f"{entry}/checkpoint/model/__0_0.distcp") == weights
    assert {row["version"]: row["aliases"] for row in list_models(store)} == {1: ["latest"]}


# ----------------------------------------------------------------------------------------------
# Two identical `pretrain run` at the same moment


def start(config: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(BIN / "pretrain"), "run", "--config", str(config)], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )


def waiting_lines(log: Path) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines() if "identical execution" in line or "took over" in line]


@pytest.mark.slow
@pytest.mark.parametrize("homes", ["shared-home", "separate-homes"])
def test_two_identical_runs_at_once_both_finish_with_one_version(tmp_path, homes):
    store_uri = str(tmp_path / "store")
    corpus = distinct_corpus(tmp_path / "corpus", n=30, words_per_doc=120)
    config = write_config(
        tmp_path / "tiny.yaml",
        store_uri,
        data={"sources": [str(corpus)], "max_documents": 0},
        train={"steps": 6, "checkpoint_every": 3, "keep_checkpoints": 3},
    )
    envs = []
    for i in range(2):
        home = tmp_path / ("home" if homes == "shared-home" else f"home-{i}")  # ~/.flyte holds the local cache
        envs.append({**os.environ, "HOME": str(home), "PYTHONUNBUFFERED": "1"})
    logs = [tmp_path / f"run-{i}.log" for i in range(2)]
    started = time.monotonic()
    procs = [start(config, env, log) for env, log in zip(envs, logs, strict=True)]
    try:
        codes = [p.wait(timeout=1500) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    elapsed = time.monotonic() - started
    texts = [log.read_text(errors="replace") for log in logs]
    assert codes == [0, 0], "\n\n".join(t[-4000:] for t in texts)
    printed = [json.loads(t.strip().splitlines()[-1]) for t in texts]
    assert printed[0] == printed[1] and printed[0]["version"] == 1, printed

    listed = subprocess.run(
        [str(BIN / "pretrain"), "registry", "list", "--json", "--store", store_uri],
        cwd=ROOT,
        env=envs[0],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert listed.returncode == 0, listed.stderr
    assert [(row["name"], row["version"]) for row in json.loads(listed.stdout)] == [("gpt-e2e", 1)]

    store = open_store(store_uri)
    (run,) = [f"runs/{name}" for name in store.children("runs")]  # both trained the same run
    assert committed_steps(store, run) == [3, 6]
    for step in (3, 6):  # every file committed is there, with the digest recorded at the save
        fetch(store, checkpoint_prefix(run, step), tmp_path / "fetched" / str(step))
    assert not store.exists(f"{run}/lease.json")  # released by whoever held it last
    metrics = [json.loads(line) for line in store.get_bytes(f"{run}/metrics.jsonl").decode().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 7))  # one run's steps, not two interleaved
    card = store.get_json("models/gpt-e2e/1/card.json")
    assert card["lineage"]["checkpoint"] == store.url(checkpoint_prefix(run, 6))
    waits = [waiting_lines(log) for log in logs]
    print(f"[{homes}] both finished in {elapsed:.0f} s; lines about the lease: {waits}")
