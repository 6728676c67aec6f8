"""The whole workflow under `pyflyte run` (real Flyte local execution, Elastic with two
ranks) against the real S3 server, then again to show every step served from cache."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from storage import open_store
from tests.conftest import TINY_DATA, TINY_TOKENIZER

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def write_config(path: Path, store: str, **overrides) -> Path:
    config = {
        "store": store,
        "data": dict(TINY_DATA),
        "tokenizer": dict(TINY_TOKENIZER),
        "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4},
        "train": {"steps": 12, "micro_batch_size": 4, "global_batch_size": 8, "warmup_steps": 2, "checkpoint_every": 6},
        "evaluation": {"max_batches": 2, "batch_size": 4, "sample_tokens": 8},
        "registry": {"model_name": "gpt-e2e"},
    }
    for section, values in overrides.items():
        config[section] = {**config.get(section, {}), **values}
    path.write_text(yaml.safe_dump(config))
    return path


def run(args: list[str], env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def flyte_env(s3_env, tmp_path):
    # A private HOME: flytekit's local cache lives in ~/.flyte.
    return {**os.environ, **s3_env, "HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}


def test_pipeline_end_to_end_on_s3_then_from_cache(s3_server, flyte_env, tmp_path):
    store_uri = f"s3://{s3_server.bucket}/e2e"
    config = write_config(tmp_path / "tiny.yaml", store_uri)
    command = [str(BIN / "pyflyte"), "run", "workflows/pretrain.py", "pretrain", "--config", str(config)]

    started = time.monotonic()
    first = run(command, flyte_env)
    cold = time.monotonic() - started
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    steps = [line for line in first.stdout.splitlines() if line.startswith("step ")]
    assert len(steps) == 12
    first_loss, last_loss = (float(line.split("loss ")[1].split()[0]) for line in (steps[0], steps[-1]))
    assert last_loss < first_loss

    listed = run([str(BIN / "pretrain"), "registry", "list", "--json", "--store", store_uri], flyte_env)
    assert listed.returncode == 0, listed.stderr
    (entry,) = json.loads(listed.stdout)
    assert entry["name"] == "gpt-e2e" and entry["version"] == 1
    assert entry["aliases"] == ["latest", "production"]  # the first model passes the quality gate
    assert {"val_loss", "perplexity", "final_train_loss"} <= set(entry["metrics"])

    store = open_store(store_uri)
    card = store.get_json("models/gpt-e2e/1/card.json")
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
    assert json.loads((tmp_path / "downloaded" / "evaluation.json").read_text())["val_loss"] == card["metrics"]["val_loss"]

    started = time.monotonic()
    second = run(command, flyte_env)
    warm = time.monotonic() - started
    assert second.returncode == 0, second.stderr[-3000:]
    assert not any(line.startswith("step ") for line in second.stdout.splitlines()), "train ran again"
    assert "documents kept" not in second.stdout + second.stderr, "prepare ran again"
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
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no-such-dir" in errors[0] and "does not exist" in errors[0]
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
