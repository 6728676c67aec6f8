"""Which steps a rerun executes, read from flytekit's own cache log (real local execution).

Unchanged → every step a hit; training config changed → train, evaluate, register rerun;
tokenizer changed → everything from prepare; the same corpus under another path → a hit;
continued pretraining → the registered model's weights and tokenizer are reused.
"""

import os
import re
import shutil
from pathlib import Path

import pytest

from storage import open_store
from tests.data_utils import distinct_docs
from tests.test_workflow_e2e import BIN, run, write_config

pytestmark = pytest.mark.slow
CACHED = ["prepare_data", "validate_data", "train_model", "evaluate_model", "register_model"]
LOG_LINE = re.compile(r"Checking cache for task named\s+tasks\.\w+\.(\w+)|Cache (hit|miss)")


def cache_outcomes(output: str) -> dict[str, str]:
    """{task: 'hit' | 'miss'} from flytekit's INFO log."""
    outcomes, task = {}, None
    for match in LOG_LINE.finditer(output):
        if match.group(1):
            task = match.group(1)
        elif task:
            outcomes[task], task = match.group(2), None
    return outcomes


def write_corpus(root: Path) -> Path:
    # Distinct documents: near-duplicate de-duplication would keep only one of a templated set.
    root.mkdir(parents=True)
    for i, text in enumerate(distinct_docs(40, words_per_doc=150)):
        (root / f"doc{i}.txt").write_text(text)
    return root


@pytest.fixture
def pipeline(tmp_path):
    env = {"HOME": str(tmp_path / "home"), "FLYTE_SDK_LOGGING_LEVEL": "20", "COLUMNS": "400", "PYTHONUNBUFFERED": "1"}
    store = str(tmp_path / "store")
    corpus = write_corpus(tmp_path / "corpus")
    small = {"steps": 4, "checkpoint_every": 4}

    def execute(name: str, corpus_path: Path = corpus, **overrides) -> tuple[dict[str, str], str]:
        sections = {"data": {"sources": [str(corpus_path)], "max_documents": 0}, "train": small, **overrides}
        if "train" in overrides:
            sections["train"] = {**small, **overrides["train"]}
        config = write_config(tmp_path / f"{name}.yaml", store, **sections)
        result = run(
            [str(BIN / "pyflyte"), "run", "workflows/pretrain.py", "pretrain", "--config", str(config)], {**os.environ, **env}
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        output = result.stdout + result.stderr
        return cache_outcomes(output), output

    execute.tmp_path = tmp_path
    execute.store = store
    return execute


def test_cache_follows_config_and_content(pipeline):
    cold, _ = pipeline("cold")
    assert [cold[t] for t in CACHED] == ["miss"] * 5

    unchanged, _ = pipeline("unchanged")
    assert [unchanged[t] for t in CACHED] == ["hit"] * 5

    new_lr, _ = pipeline("train-changed", train={"lr": 0.001})
    assert [new_lr[t] for t in CACHED] == ["hit", "hit", "miss", "miss", "miss"]

    moved = shutil.copytree(pipeline.tmp_path / "corpus", pipeline.tmp_path / "elsewhere" / "corpus")
    same_content, _ = pipeline("moved-corpus", corpus_path=moved)
    assert [same_content[t] for t in CACHED] == ["hit"] * 5

    new_vocab, _ = pipeline("tokenizer-changed", tokenizer={"vocab_size": 320})
    assert [new_vocab[t] for t in CACHED] == ["miss"] * 5


def test_continued_pretraining_starts_from_the_registered_model(pipeline):
    pipeline("base")
    store = open_store(pipeline.store)
    base_card = store.get_json("models/gpt-e2e/1/card.json")

    more = write_corpus(pipeline.tmp_path / "new-data")
    (more / "extra.txt").write_text("Fresh documents arrived overnight. " * 40)
    outcomes, output = pipeline("continued", corpus_path=more, train={"init_from": "gpt-e2e:latest"})
    assert outcomes["prepare_data"] == "miss" and outcomes["train_model"] == "miss"
    assert "initialised runs/" in output and "models/gpt-e2e/1" in output

    card = store.get_json("models/gpt-e2e/2/card.json")
    assert card["lineage"]["base_model"] == "models/gpt-e2e/1"
    assert card["lineage"]["tokenizer_sha256"] == base_card["lineage"]["tokenizer_sha256"]  # vocabulary kept
    assert card["lineage"]["dataset_version"] != base_card["lineage"]["dataset_version"]
    # Starting from trained weights, the first loss is already far below a fresh model's.
    assert card["metrics"]["first_train_loss"] < base_card["metrics"]["first_train_loss"] - 0.3

    # The quality gate: the first model took `production`; the second was scored against it
    # on the same validation rows, and the alias moved only if it was not worse.
    assert base_card["gate"]["promoted"] and base_card["gate"]["baseline"] == ""
    gate = card["gate"]
    assert gate["baseline"] == "models/gpt-e2e/1" and gate["baseline_bits_per_byte"] > 0
    assert gate["promoted"] == (gate["candidate_bits_per_byte"] <= gate["baseline_bits_per_byte"] + gate["tolerance"])
    holder = store.get_json("models/gpt-e2e/aliases/production.json")["version"]
    assert holder == (2 if gate["promoted"] else 1)
