"""Same inputs, same bytes (issue 18 item 7): two runs of the demo config into two fresh stores,
each with a fresh flytekit cache, give the same dataset version, bitwise-equal checkpoint
tensors and the same card metrics.

The runs use the demo's settings (``pretrain run`` without ``--config``: configs/tiny-cpu.yaml's
values, the standard library as corpus, TP 2) with five overrides only, to keep the pair
under about three minutes: ``data.max_documents`` 120, ``train.steps`` 12 with
``train.checkpoint_every`` 6 (two checkpoints, the second final), ``evaluation.max_batches`` 2
and ``evaluation.lm_eval_tasks`` [] (lm-eval is ~30 s per run; tests/test_lm_eval*.py). The
store is given by ``$PRETRAIN_STORE`` (the config's ``store: ""``), so the config holds nothing else.
The two runs go side by side: they share nothing, and the same computation beside another must
not change a byte either.

Compared: the dataset version and every file of the dataset (manifest, tokenizer, shards);
every tensor of both checkpoints (model weights and the AdamW moments ``exp_avg`` /
``exp_avg_sq``, ``training.checkpointing.snapshot``: the key sets must match too); each checkpoint's
``meta.json`` (the loader state and the optimizer's step count); the per-step losses and grad
norms; the card's metrics except the timing ones (``training.checkpointing.snapshot.TIMING_METRICS``:
tokens per second and MFU measure the machine's speed, not the computation), and its samples.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from common.contracts import CARD, committed_steps
from storage import open_store
from tests.helpers import BIN, ROOT, run_metrics
from training.checkpointing.snapshot import checkpoint_tensors, comparable_metrics, differences

pytestmark = pytest.mark.slow

OVERRIDES = {
    "data": {"max_documents": 120},
    "train": {"steps": 12, "checkpoint_every": 6},
    "evaluation": {"max_batches": 2, "lm_eval_tasks": []},
}


def demo_runs(roots: list[Path], config: Path) -> list[tuple]:
    """``pretrain run`` of the demo config into a fresh store and a fresh flytekit cache under each root,
    all at once (the runs share nothing, and doing the same computation side by side must not change a
    byte either): each run's (store, card)."""
    procs = []
    for root in roots:
        env = {**os.environ, "HOME": str(root / "home"), "PRETRAIN_STORE": str(root / "store"), "PYTHONUNBUFFERED": "1"}
        root.mkdir(parents=True)
        with open(root / "stdout", "wb") as out, open(root / "stderr", "wb") as err:
            command = [str(BIN / "pretrain"), "run", "--config", str(config), "--json"]
            procs.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=err))
    try:
        codes = [proc.wait(timeout=900) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = []
    for root, code in zip(roots, codes, strict=True):
        output = (root / "stdout").read_text(errors="replace")
        assert code == 0, output[-3000:] + (root / "stderr").read_text(errors="replace")[-3000:]
        registered = json.loads(output.strip().splitlines()[-1])
        assert_summary(output, registered)
        store = open_store(str(root / "store"))
        entry = registered["uri"].removeprefix(f"{store.uri.rstrip('/')}/")
        results.append((store, store.get_json(f"{entry}/{CARD}")))
    return results


def assert_summary(output: str, registered: dict) -> None:
    """Issue 33: a run ends with what it made, in words (pipeline.summary, printed by track_run), before
    the JSON line ``--json`` adds."""
    lines = output.strip().splitlines()
    head = f"pretrain: registered {registered['name']}:{registered['version']} (latest"
    (start,) = [i for i, line in enumerate(lines) if line.startswith(head)]
    summary = lines[start:-1]
    labels = [line.split()[0] for line in summary[1:] if line.startswith("  ") and not line.startswith("  pretrain")]
    assert labels == ["data", "validation", "training", "evaluation", "gate"], summary  # no lm-eval tasks here
    assert re.search(r"^  data +\d[\d,]* of \d[\d,]* documents kept", summary[1]), summary
    assert summary[2].startswith("  validation  PASS: ") and "expectations met" in summary[2], summary
    training = r"12 steps, loss \d+\.\d{3} → \d+\.\d{3}, [\d,]+ tokens/s, MFU [\d.]+%; steps 1-12: tensor_parallel=2"
    assert re.search(training, summary[3]), summary
    assert re.search(r"^  evaluation  val_loss \d+\.\d{4}, perplexity [\d.]+, bits_per_byte [\d.]+$", summary[4]), summary
    assert "next:" in summary and any(line.startswith("  pretrain runs show ") for line in summary), summary
    assert any(line.startswith("  pretrain runs report ") for line in summary), summary  # the Decks, one page
    assert any(re.match(r"  pretrain ui --run [0-9a-f]{32} ", line) for line in summary), summary  # this MLflow run
    assert not any(line.startswith("{") for line in lines[:-1])  # no JSON but the --json line


@pytest.mark.long("two whole demo pipelines (stdlib corpus, TP 2), side by side")
def test_two_runs_of_the_demo_give_the_same_bytes(tmp_path):
    config = tmp_path / "demo-short.yaml"
    config.write_text(yaml.safe_dump(OVERRIDES))
    (store_a, card_a), (store_b, card_b) = demo_runs([tmp_path / "a", tmp_path / "b"], config)

    # The dataset: the same version (a hash of the manifest), and the same bytes in every file.
    version = card_a["lineage"]["dataset_version"]
    assert card_b["lineage"]["dataset_version"] == version
    dataset = f"datasets/{version}/"
    files = [key for key in store_a.list(dataset) if "/validation/" not in key]
    assert any("/shards/" in key for key in files) and store_b.list(dataset)
    assert [k for k in store_b.list(dataset) if "/validation/" not in k] == files
    assert all(store_a.get_bytes(key) == store_b.get_bytes(key) for key in files)

    # Training: the same run id (config + dataset + code), the same checkpoints, every tensor equal.
    run_id = card_a["lineage"]["training_run"]
    assert card_b["lineage"]["training_run"] == run_id
    assert committed_steps(store_a, run_id) == committed_steps(store_b, run_id) == [6, 12]
    for step in (6, 12):
        prefix = f"{run_id}/checkpoints/step-{step:07d}"
        tensors_a, tensors_b = checkpoint_tensors(store_a, prefix), checkpoint_tensors(store_b, prefix)
        assert any(key.startswith("optimizer.state.exp_avg_sq.") for key in tensors_a)  # moments are in there
        assert len(tensors_a) >= 3 * 8, sorted(tensors_a)
        assert differences(tensors_a, tensors_b) == []
        meta_a, meta_b = (s.get_json(f"{prefix}/meta.json") for s in (store_a, store_b))
        assert meta_a["optimizer_step"] == meta_b["optimizer_step"] == step
        assert meta_a.get("loader") == meta_b.get("loader")

    # Per-step records: the computed fields equal, step for step.
    computed = ("step", "loss", "grad_norm", "lr")
    records_a, records_b = run_metrics(store_a, run_id), run_metrics(store_b, run_id)
    assert [r["step"] for r in records_a] == list(range(1, 13))
    assert [{k: r[k] for k in computed} for r in records_a] == [{k: r[k] for k in computed} for r in records_b]

    # The cards: the same metrics but timing ones, the same samples.
    metrics_a = comparable_metrics(card_a["metrics"])
    assert {"val_loss", "bits_per_byte", "final_train_loss", "tokens_trained"} <= metrics_a.keys()
    assert metrics_a == comparable_metrics(card_b["metrics"])
    assert (card_a["sample"], card_a["sampled"]) == (card_b["sample"], card_b["sampled"])
