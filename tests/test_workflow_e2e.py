"""The whole workflow under `pyflyte run` (real Flyte local execution, Elastic with two
ranks) against the real S3 server, then again to show every step served from cache.

What a run did is read from what it left behind: the store (the run's metrics.jsonl, committed
checkpoints, the registry entry) and flytekit's local cache, not from its console output. The
bad-input tests check the one line a user sees: that message is the product there.
"""

import json
import os
import time
from pathlib import Path

import pytest

from common.contracts import checkpoint_prefix
from storage import open_store
from tests.helpers import (
    BIN,
    CACHED_TASKS,
    cache_outcomes,
    local_cache_entries,
    run,
    run_metrics,
    training_run_of,
    write_config,
)

pytestmark = pytest.mark.slow
# Where the pipeline writes: datasets (with their validation reports), training runs, registry entries.
PIPELINE_PREFIXES = ("datasets/", "runs/", "models/")


@pytest.fixture
def flyte_env(s3_env, tmp_path):
    # A private HOME: flytekit's local cache lives in ~/.flyte.
    return {**os.environ, **s3_env, "HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}


def test_pipeline_end_to_end_on_s3_then_from_cache(s3_server, flyte_env, tmp_path):
    store_uri = f"s3://{s3_server.bucket}/e2e"
    lm_eval = {"lm_eval_tasks": ["heldout_cloze", "heldout_continuation"], "lm_eval_examples": 16}
    config = write_config(tmp_path / "tiny.yaml", store_uri, evaluation=lm_eval)
    command = [str(BIN / "pyflyte"), "run", "workflows/pretrain.py", "pretrain", "--config", str(config)]

    home = tmp_path / "home"

    started = time.monotonic()
    first = run(command, flyte_env)
    cold = time.monotonic() - started
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    cached = local_cache_entries(home)
    assert cache_outcomes({}, cached) == dict.fromkeys(CACHED_TASKS, "miss")

    listed = run([str(BIN / "pretrain"), "registry", "list", "--json", "--store", store_uri], flyte_env)
    assert listed.returncode == 0, listed.stderr
    (entry,) = json.loads(listed.stdout)
    assert entry["name"] == "gpt-e2e" and entry["version"] == 1
    assert entry["aliases"] == ["latest", "production"]  # the first model passes the quality gate
    assert {"val_loss", "perplexity", "final_train_loss"} <= set(entry["metrics"])

    store = open_store(store_uri)
    card = store.get_json("models/gpt-e2e/1/card.json")
    # The run the entry came from: 12 steps in its metrics.jsonl, checkpoints committed at 6 and 12.
    training_run = training_run_of(store, card)
    metrics = run_metrics(store, training_run)
    assert [m["step"] for m in metrics] == list(range(1, 13))
    assert metrics[-1]["loss"] < metrics[0]["loss"] and card["metrics"]["first_train_loss"] == metrics[0]["loss"]
    assert all(store.is_committed(checkpoint_prefix(training_run, step)) for step in (6, 12))
    assert card["lineage"]["checkpoint"] == store.url(checkpoint_prefix(training_run, 12))
    lineage = card["lineage"]
    assert lineage["dataset_version"] == entry["dataset"] and lineage["flyte_execution_id"]
    assert lineage["dataset_manifest"].startswith(store_uri) and len(lineage["tokenizer_sha256"]) == 64
    assert card["config"]["train"]["steps"] == 12 and card["code"]["commit"]
    store.download_dir("models/gpt-e2e/1", tmp_path / "downloaded")
    assert (tmp_path / "downloaded" / "checkpoint" / "model" / ".metadata").stat().st_size > 0
    assert (tmp_path / "downloaded" / "tokenizer.json").stat().st_size > 0
    assert store.get_json(f"datasets/{entry['dataset']}/validation/result.json")["success"]
    hf_loss = hf_validation_loss(store, entry["dataset"], tmp_path / "downloaded" / "hf")
    assert hf_loss == pytest.approx(card["metrics"]["val_loss"], abs=1e-4)
    evaluation = json.loads((tmp_path / "downloaded" / "evaluation.json").read_text())
    assert evaluation["val_loss"] == card["metrics"]["val_loss"]
    # lm-evaluation-harness ran on the export, over examples built from the held-out split: its
    # figures are on the card, each task's full result (16 examples, stderr) in evaluation.json.
    lm_eval = {k: v for k, v in card["metrics"].items() if k.startswith("lm_eval.")}
    expected = {"heldout_cloze": ("acc", "perplexity"), "heldout_continuation": ("acc", "acc_norm")}
    assert set(lm_eval) == {f"lm_eval.{task}.{metric}" for task, metrics in expected.items() for metric in metrics}
    assert all(0 <= lm_eval[f"lm_eval.{task}.acc"] <= 1 for task in expected) and lm_eval["lm_eval.heldout_cloze.perplexity"] > 1
    for task in expected:
        assert evaluation["lm_eval_results"]["candidate"][task]["n_samples"]["effective"] == 16
        assert "acc_stderr,none" in evaluation["lm_eval_results"]["candidate"][task]["results"]
    print(f"lm-eval on the card ({evaluation['lm_eval_results']['seconds']} s):", json.dumps(lm_eval))

    written = {prefix: store.list(prefix) for prefix in PIPELINE_PREFIXES}
    started = time.monotonic()
    second = run(command, flyte_env)
    warm = time.monotonic() - started
    assert second.returncode == 0, second.stderr[-3000:]
    assert cache_outcomes(cached, local_cache_entries(home)) == dict.fromkeys(CACHED_TASKS, "hit")
    # Nothing prepared, trained or registered again: the store holds exactly what it held.
    assert {prefix: store.list(prefix) for prefix in PIPELINE_PREFIXES} == written
    assert run_metrics(store, training_run) == metrics
    assert [r["version"] for r in json.loads(run(listed.args, flyte_env).stdout)] == [1]
    print(f"cold run {cold:.1f}s, cached rerun {warm:.1f}s")


def hf_validation_loss(store, dataset_version: str, hf_dir: Path) -> float:
    """The registered Hugging Face export's loss on the rows our evaluation scored (2 batches of 4)."""
    import torch
    from transformers import AutoModelForCausalLM

    from common.contracts import DatasetRef
    from data_prep.prepare import load_manifest, shard_urls
    from data_prep.shards import read_rows

    ref = DatasetRef(store=store.uri, version=dataset_version, prefix=f"datasets/{dataset_version}")
    rows = read_rows(shard_urls(store, ref, load_manifest(store, ref), "val"))[:8]
    model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    tokens = torch.from_numpy(rows.astype("int64"))
    with torch.no_grad():
        logits = model(tokens[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).item()


def test_missing_corpus_fails_before_writing(s3_server, flyte_env, tmp_path):
    store_uri = f"s3://{s3_server.bucket}/missing-corpus"
    config = write_config(tmp_path / "bad.yaml", store_uri, data={"sources": [str(tmp_path / "no-such-dir")]})
    result = run([str(BIN / "pretrain"), "run", "--config", str(config)], flyte_env)
    assert result.returncode == 2
    # One error, whose one problem names the key, the path and what is wrong.
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    problems = [line for line in result.stderr.splitlines() if "no-such-dir" in line]
    assert len(errors) == 1 and len(problems) == 1
    assert "data.sources" in problems[0] and "does not exist" in problems[0]
    assert open_store(store_uri).list("") == []


def test_rejected_credentials_fail_in_one_line(s3_server, flyte_env, tmp_path):
    store_uri = f"s3://{s3_server.bucket}/bad-credentials"
    config = write_config(tmp_path / "bad.yaml", store_uri)
    env = {**flyte_env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    result = run([str(BIN / "pretrain"), "run", "--config", str(config)], env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: S3 endpoint")
    assert "rejected the credentials" in result.stderr
    assert open_store(store_uri).list("") == []
