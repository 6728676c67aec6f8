"""A weighted mixture through the real pipeline: what reruns when one thing changes (flytekit's local cache,
observed), and a tiny `pretrain run` whose card lists every component with its weight and tokens."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys
from pathlib import Path

import pytest

from tests.helpers import BIN, ROOT, TINY_DATA, distinct_docs, run, write_config, write_corpus

# One process runs the data stage of each config in turn, in flytekit's local execution (its cache in $HOME),
# writing a step's file first where it has one, and notes each cached task's keys after each step.
_STAGES = """
import json, sys
from pathlib import Path
from pipeline.config import load_config
from tasks.data import prepare_mixture
from tests.helpers import BIN, ROOT, TINY_DATA, local_cache_entries
out = []
for step in json.loads(sys.argv[1]):
    if step.get("write"):
        Path(step["write"][0]).write_text(step["write"][1])
    cfg = load_config(step["config"])
    if step.get("fails"):
        try:
            prepare_mixture(store=cfg.store, data=cfg.data, tokenizer=cfg.tokenizer, validation=cfg.validation, base_model="")
        except Exception as e:
            out.append({"error": str(e)})
        continue
    blend = prepare_mixture(store=cfg.store, data=cfg.data, tokenizer=cfg.tokenizer, validation=cfg.validation, base_model="")
    manifest = json.loads((Path(cfg.store) / blend.prefix / "manifest.json").read_text())
    keys = {task: sorted(k) for task, k in local_cache_entries(Path.home()).items()}
    versions = [m["dataset"] for m in manifest["mixture"]]
    out.append({"datasets": versions, "blend": blend.version, "keys": keys, "manifest": manifest})
print("RESULT " + json.dumps(out))
"""

WEIGHTS = {"prose": 3.0, "notes": 1.0}


def corpora(root: Path) -> tuple[Path, Path]:
    docs = distinct_docs(40, seed=7, words_per_doc=120)
    prose = write_corpus(root / "prose", {f"p{i:02d}.txt": text for i, text in enumerate(docs[:24])})
    notes = write_corpus(root / "notes", {f"n{i:02d}.txt": text for i, text in enumerate(docs[24:])})
    near = docs[2].split(" ")
    near[7] = "changed"
    # Late in notes, past the tokenizer's sample: an exact and a near duplicate of prose's documents, and a
    # short one that a min_chars of 300 drops.
    (notes / "n97.txt").write_text(docs[1])
    (notes / "n98.txt").write_text(" ".join(near))
    (notes / "n99.txt").write_text(docs[0][:150])
    return prose, notes


def mixture_config(path: Path, store: str, prose: Path, notes: Path, weights=WEIGHTS, notes_keys=None, **sections) -> Path:
    data = {
        "mixture": [
            {"name": "prose", "sources": [str(prose)], "weight": weights["prose"]},
            {"name": "notes", "sources": [str(notes)], "weight": weights["notes"], **(notes_keys or {})},
        ],
        "max_documents": 0,
    }
    return write_config(path, store, data=data, tokenizer={"train_bytes": 8_000}, **sections)


def new_keys(before: dict[str, list[str]], after: dict[str, list[str]]) -> dict[str, int]:
    return {task: len(set(keys) - set(before.get(task, []))) for task, keys in after.items()}


def test_each_component_is_prepared_once_and_only_its_own_edits_prepare_it_again(tmp_path: Path) -> None:
    prose, notes = corpora(tmp_path / "corpus")
    store = str(tmp_path / "store")
    added = (str(notes / "n50.txt"), distinct_docs(1, seed=99, words_per_doc=120)[0])  # a file added to notes
    steps = [
        {"config": mixture_config(tmp_path / "cold.yaml", store, prose, notes)},
        {"config": mixture_config(tmp_path / "weights.yaml", store, prose, notes, weights={"prose": 1.0, "notes": 1.0})},
        {"config": mixture_config(tmp_path / "added.yaml", store, prose, notes), "write": added},
        {"config": mixture_config(tmp_path / "filter.yaml", store, prose, notes, notes_keys={"min_chars": 300})},
    ]
    short = write_corpus(tmp_path / "corpus" / "short", {"s.txt": "too short"})  # a component that yields no document
    steps.append({"config": mixture_config(tmp_path / "short.yaml", store, prose, short), "fails": True})
    script = tmp_path / "stages.py"
    script.write_text(_STAGES)
    env = {**os.environ, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    result = run([sys.executable, str(script), json.dumps(steps, default=str)], env)
    assert result.returncode == 0, result.stderr[-3000:]
    cold, weights, added, changed, empty = json.loads(result.stdout.split("RESULT ", 1)[1])
    # A component whose files yield no document stops the run before training, its file and the reason named.
    assert "too_short" in empty["error"] and str(short) in empty["error"], empty
    every = {"train_mixture_tokenizer": 1, "prepare_data": 2, "validate_data": 2, "dedup_across_components": 1}
    assert {task: len(keys) for task, keys in cold["keys"].items()} == every
    # Across components: notes' copy of a prose document and its near copy are counted and leave the blend.
    notes_share = cold["manifest"]["mixture"][1]
    assert notes_share["cross_component_duplicate_by_kind"] == {"exact": 1, "near": 1}
    assert notes_share["cross_component_duplicate"] == 2 and cold["manifest"]["stats"]["cross_component_duplicate"] == 2
    left_out = [
        e for e in cold["manifest"]["splits"]["train"]["shards"] + cold["manifest"]["splits"]["val"]["shards"] if "excluded" in e
    ]
    assert left_out and all(e["component"] == 1 for e in left_out)
    # Only the weights: the same component datasets, another blend, nothing prepared.
    assert weights["datasets"] == cold["datasets"] and weights["blend"] != cold["blend"]
    assert new_keys(cold["keys"], weights["keys"]) == dict.fromkeys(every, 0)
    # A file added to notes, past the tokenizer's sample: the tokenizer trained again to the same bytes, so
    # prose is served from the cache; notes is prepared again.
    one = {"train_mixture_tokenizer": 1, "prepare_data": 1, "validate_data": 1, "dedup_across_components": 1}
    assert added["datasets"][0] == cold["datasets"][0] and added["datasets"][1] != cold["datasets"][1]
    assert new_keys(weights["keys"], added["keys"]) == one
    # A filter of notes changed (its short last document dropped): notes again, prose from the cache.
    assert changed["datasets"][0] == cold["datasets"][0]
    assert changed["datasets"][1] not in (cold["datasets"][1], added["datasets"][1])
    assert new_keys(added["keys"], changed["keys"]) == one


def test_a_mixture_run_registers_a_card_with_every_components_weight_tokens_and_figures(
    tmp_path: Path, mlflow_tracking_uri: str
) -> None:
    prose, notes = corpora(tmp_path / "corpus")
    store = tmp_path / "store"
    train = {"steps": 8, "micro_batch_size": 4, "global_batch_size": 8, "warmup_steps": 2, "checkpoint_every": 8}
    config = mixture_config(tmp_path / "run.yaml", str(store), prose, notes, train=train, registry={"model_name": "gpt-mix"})
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    result = run([str(BIN / "pretrain"), "run", "--config", str(config)], env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    summary = result.stdout + result.stderr  # the end-of-run summary: each component's own validation
    assert "validation  prose PASS" in summary and "; notes PASS" in summary, summary[-1500:]
    shown = run([str(BIN / "pretrain"), "registry", "show", "gpt-mix:1", "--json", "--store", str(store)], env)
    card = json.loads(shown.stdout)
    shares = card["lineage"]["mixture"]
    assert [s["name"] for s in shares] == ["prose", "notes"] and [s["weight"] for s in shares] == [0.75, 0.25]
    trained = card["metrics"]["tokens_trained"]
    assert trained == 8 * 8 * TINY_DATA["seq_len"] and sum(s["tokens_trained"] for s in shares) == trained
    for share in shares:  # each component's share of the run's tokens within 1 % of its weight
        assert abs(share["tokens_trained"] / trained - share["weight"]) <= 0.01 * share["weight"], shares
        assert card["metrics"][f"tokens_trained.{share['name']}"] == share["tokens_trained"]
        assert 0 < share["epochs"] and share["dataset_version"] != card["lineage"]["dataset_version"]
    # Each component scored on its own rows; the overall figure lies between them.
    per = [card["metrics"][f"val_loss.{name}"] for name in ("prose", "notes")]
    assert min(per) <= card["metrics"]["val_loss"] <= max(per)
    assert all(card["metrics"][f"bits_per_byte.{name}"] > 0 for name in ("prose", "notes"))
    text = run([str(BIN / "pretrain"), "registry", "show", "gpt-mix:1", "--store", str(store)], env).stdout
    assert "mixture" in text and "2 components" in text and f"{shares[0]['tokens_trained']:,}" in text
    # MLflow (its SQLite store, read as it is): the components' figures under their own names, the weights as params.
    mlflow_run = re.search(r"recorded as MLflow run ([0-9a-f]{32})", summary)[1]
    with sqlite3.connect(mlflow_tracking_uri.removeprefix("sqlite:///")) as db:
        metrics = dict(db.execute("select key, value from latest_metrics where run_uuid = ?", (mlflow_run,)))
        params = dict(db.execute("select key, value from params where run_uuid = ?", (mlflow_run,)))
    for name in ("prose", "notes"):
        assert metrics[f"val_loss.{name}"] == pytest.approx(card["metrics"][f"val_loss.{name}"])
        assert metrics[f"bits_per_byte.{name}"] == pytest.approx(card["metrics"][f"bits_per_byte.{name}"])
        assert metrics[f"summary.tokens_trained.{name}"] == card["metrics"][f"tokens_trained.{name}"]
    assert params["data.mixture.prose.weight"] == "3.0" and params["data.mixture.notes.weight"] == "1.0"
    run_id = card["lineage"]["training_run"].removeprefix("runs/")
    runs = run([str(BIN / "pretrain"), "runs", "show", run_id, "--store", str(store)], env).stdout
    for share in shares:  # weight and tokens through the latest checkpoint (the last, here)
        assert f"{share['name']} {share['weight']:.3f} ({share['tokens_trained']:,} tokens)" in runs, runs
