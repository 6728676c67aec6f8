"""Which steps a rerun executes, read from flytekit's local cache (real local execution), and
what continued pretraining trained, read from the store.

Unchanged → every step a hit; training config changed → train, evaluate, register rerun;
tokenizer changed → everything from prepare; the same corpus under another path → a hit;
continued pretraining → the registered model's weights and tokenizer are reused.
"""

import os
import shutil
from pathlib import Path

import pytest

from storage import open_store
from tests.helpers import (
    BIN,
    CACHED_TASKS,
    cache_outcomes,
    distinct_corpus,
    local_cache_entries,
    run,
    run_metrics,
    training_run_of,
    write_config,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def pipeline(tmp_path):
    home = tmp_path / "home"  # a private HOME: flytekit's local cache lives in ~/.flyte
    env = {**os.environ, "HOME": str(home), "PYTHONUNBUFFERED": "1"}
    store = str(tmp_path / "store")
    corpus = distinct_corpus(tmp_path / "corpus")
    small = {"steps": 4, "checkpoint_every": 4}

    def execute(name: str, corpus_path: Path = corpus, **overrides) -> list[str]:
        """Run the workflow; each cached task's outcome, in CACHED_TASKS order."""
        sections = {"data": {"sources": [str(corpus_path)], "max_documents": 0}, "train": small, **overrides}
        if "train" in overrides:
            sections["train"] = {**small, **overrides["train"]}
        config = write_config(tmp_path / f"{name}.yaml", store, **sections)
        before = local_cache_entries(home)
        result = run([str(BIN / "pyflyte"), "run", "workflows/pretrain.py", "pretrain", "--config", str(config)], env)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        outcomes = cache_outcomes(before, local_cache_entries(home))
        return [outcomes[task] for task in CACHED_TASKS]

    execute.tmp_path = tmp_path
    execute.store = store
    return execute


def test_cache_follows_config_and_content(pipeline):
    assert pipeline("cold") == ["miss"] * 5
    assert pipeline("unchanged") == ["hit"] * 5
    assert pipeline("train-changed", train={"lr": 0.001}) == ["hit", "hit", "miss", "miss", "miss"]

    moved = shutil.copytree(pipeline.tmp_path / "corpus", pipeline.tmp_path / "elsewhere" / "corpus")
    assert pipeline("moved-corpus", corpus_path=moved) == ["hit"] * 5

    assert pipeline("tokenizer-changed", tokenizer={"vocab_size": 320}) == ["miss"] * 5


def test_continued_pretraining_starts_from_the_registered_model(pipeline):
    pipeline("base")
    store = open_store(pipeline.store)
    base_card = store.get_json("models/gpt-e2e/1/card.json")

    more = distinct_corpus(pipeline.tmp_path / "new-data")
    (more / "extra.txt").write_text("Fresh documents arrived overnight. " * 40)
    prepare, _, train, _, _ = pipeline("continued", corpus_path=more, train={"init_from": "gpt-e2e:latest"})
    assert prepare == "miss" and train == "miss"

    card = store.get_json("models/gpt-e2e/2/card.json")
    assert card["lineage"]["base_model"] == "models/gpt-e2e/1"
    assert card["lineage"]["tokenizer_sha256"] == base_card["lineage"]["tokenizer_sha256"]  # vocabulary kept
    assert card["lineage"]["dataset_version"] != base_card["lineage"]["dataset_version"]
    # A run of its own, trained from step 1 (not a resumed one)...
    training_run = training_run_of(store, card)
    assert training_run != training_run_of(store, base_card)
    metrics = run_metrics(store, training_run)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4] and metrics[0]["loss"] == card["metrics"]["first_train_loss"]
    # ...starting from trained weights: the first loss is already far below a fresh model's.
    assert card["metrics"]["first_train_loss"] < base_card["metrics"]["first_train_loss"] - 0.3

    # The quality gate: the first model took `production`; the second was scored against it
    # on the same validation rows, and the alias moved only if it was not worse.
    assert base_card["gate"]["promoted"] and base_card["gate"]["baseline"] == ""
    gate = card["gate"]
    assert gate["baseline"] == "models/gpt-e2e/1" and gate["baseline_bits_per_byte"] > 0
    assert gate["promoted"] == (gate["candidate_bits_per_byte"] <= gate["baseline_bits_per_byte"] + gate["tolerance"])
    holder = store.get_json("models/gpt-e2e/aliases/production.json")["version"]
    assert holder == (2 if gate["promoted"] else 1)
