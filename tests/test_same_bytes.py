"""Same inputs, same bytes (issue 18 item 7): two runs of the demo config into two fresh stores,
each with a fresh flytekit cache, give the same dataset version, bitwise-equal checkpoint
tensors and the same card metrics.

The runs use the demo's settings (``pretrain run`` without ``--config``: configs/tiny-cpu.yaml's
values, the standard library as corpus, TP 2) with six overrides only, to keep the pair
under about three minutes: ``data.max_documents`` 120 with ``data.min_chars`` 1000 (some documents
read are skipped, so the summary's kept, read and skip reasons are figures apart), ``train.steps`` 12 with
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
Each run's end-of-run summary is checked figure by figure against its records (``assert_summary``).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from common.contracts import CARD, MANIFEST, VALIDATION_RESULT, committed_steps, dataset_prefix, validation_prefix
from registry.registry import show
from runs.reading import load_run
from storage import open_store
from tests.helpers import BIN, ROOT, run_metrics
from tracking.client import client
from tracking.uri import resolve_uri
from training.checkpointing.snapshot import checkpoint_tensors, comparable_metrics, differences

pytestmark = pytest.mark.slow

OVERRIDES = {
    "data": {"max_documents": 120, "min_chars": 1000},
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
        store = open_store(str(root / "store"))
        assert_summary(output, registered, store)
        entry = registered["uri"].removeprefix(f"{store.uri.rstrip('/')}/")
        results.append((store, store.get_json(f"{entry}/{CARD}")))
    return results


def assert_summary(output: str, registered: dict, store) -> None:
    """Issue 33: a run ends with what it made, in words (pipeline.summary, printed by track_run), before
    the JSON line ``--json`` adds. Every figure is read back from the line and checked against the run's
    own records, read here apart from pipeline.summary: the card and aliases (``pretrain registry show``),
    the dataset's manifest and validation result, the run's per-step metrics and its committed evaluation
    (``pretrain runs show``'s view), the MLflow run tagged with the model. Swapped or stale figures fail."""
    lines = output.strip().splitlines()
    entry = show(store, f"{registered['name']}:{registered['version']}")
    card, m = entry.card, entry.card.metrics
    (start,) = [i for i, line in enumerate(lines) if line.startswith("pretrain: registered ")]
    summary = lines[start:-1]
    assert summary[0] == f"pretrain: registered {card.name}:{card.version} ({', '.join(entry.aliases)})", summary
    assert "latest" in entry.aliases
    # Issue 51: which stages ran, with their times (a fresh store: none from cache), each also said as it ended.
    stages = summary.pop(1)
    ran = re.fullmatch(r"  stages      ran: (.*)", stages)
    assert ran and "from cache" not in stages, stages
    *named, brief = ran.group(1).split(", ")
    timed = dict(re.fullmatch(r"(\w+) ([\d,.]+) s(?: \(\d+×\))?", part).groups() for part in named)
    assert {"prepare_mixture", "train_model", "evaluate_model"} <= timed.keys(), stages
    assert not {"track_run", "prepare_data"} & timed.keys(), stages  # the last word; a task a dynamic workflow ran
    assert all(float(t.replace(",", "")) >= 0.5 for t in timed.values()) and re.fullmatch(r"\d+ more under 0.5 s", brief)
    assert f"stage train_model: {timed['train_model']} s" in lines, stages
    assert re.search(r"^stage check_settings: [\d.]+ s$", output, re.MULTILINE), stages
    assert "  stage prepare_data:" in output and "stage scan_partition" not in output, stages  # nested, then left out
    # No silence before step 1: the ranks starting, then what they train (its size and cost), then the steps.
    starting = re.search(r"^train_model: starting 2 ranks \(torch elastic\)$", output, re.MULTILINE)
    assert starting and starting.start() < output.index("\nmodel: ") < output.index("\nstep     1/"), output[:3000]
    figures = summary[1 : next(i for i, line in enumerate(summary) if line.startswith("next:"))]
    labels = [line.split()[0] for line in figures if line.startswith("  ")]
    assert labels == ["data", "validation", "training", "evaluation", "gate"], summary  # no lm-eval tasks here
    assert_data_lines(store, card.lineage.dataset_version, summary[1], summary[2])

    run_id = card.lineage.training_run.rsplit("/", 1)[-1]
    view = load_run(store, run_id)
    training = re.fullmatch(
        r"  training    (\d+) steps \(([\d,]+) tokens\), loss (\S+) \(step 1\) → (\S+) \(mean of the last 10 steps\), "
        r"([\d,]+) tokens/s \(median step\), MFU ([\d.]+)%; (.*)",
        summary[3],
    )
    assert training, summary[3]
    steps, tokens, first, final, tokens_per_s, mfu, layout = training.groups()
    assert int(steps) == card.lineage.training_steps == view.steps_done == len(view.metrics) == 12, (summary[3], view.steps_done)
    # The budget in tokens: every step's global batch of seq_len-token rows (the run's own config and dataset).
    train_cfg, seq_len = view.config["train"], store.get_json(f"{card.lineage.dataset_manifest}")["seq_len"]
    assert int(tokens.replace(",", "")) == 12 * train_cfg["global_batch_size"] * seq_len == m["tokens_trained"], summary[3]
    # First -> final: step 1's loss -> the mean of the last applied steps', from metrics.jsonl (a swap fails: they differ).
    assert (first, final) == (f"{view.metrics[0]['loss']:.3f}", f"{view.final_loss:.3f}") and first != final, summary[3]
    assert view.first_loss == view.metrics[0]["loss"] and view.metrics[0]["step"] == 1
    # Throughput and MFU: the card's (the median step of the last layout), each one step's record.
    assert tokens_per_s == f"{m['tokens_per_second']:,.0f}", (summary[3], m)
    assert mfu == f"{100 * m['mfu']:.1f}", (summary[3], m)
    assert m["tokens_per_second"] in [r["tokens_per_s"] for r in view.metrics] and m["mfu"] in [r["mfu"] for r in view.metrics]
    assert layout == card.layouts[-1].describe() and layout.startswith("steps 1-12: tensor_parallel=2,"), summary[3]

    evaluation = re.fullmatch(
        r"  evaluation  val_loss (\S+), perplexity (\S+), bits_per_byte (\S+) on ([\d,]+) held-out tokens "
        r"\((\d+) batch(?:es)? of (\d+) sequences\)",
        summary[4],
    )
    assert evaluation, summary[4]
    tokens, batches, batch_size = (int(g.replace(",", "")) for g in evaluation.groups()[3:])
    assert tokens == m["val_tokens"] and batch_size == card.config["evaluation"]["batch_size"], summary[4]
    assert batches == -(-tokens // card.config["data"]["seq_len"] // batch_size), summary[4]
    (evaluated,) = [e for e in view.evaluations if e["uri"] == store.url(card.lineage.evaluation)]  # the one registered
    printed = dict(zip(("val_loss", "perplexity", "bits_per_byte"), map(float, evaluation.groups()[:3]), strict=True))
    for key, value in printed.items():
        assert abs(value - evaluated[key]) <= 0.5e-4 and abs(value - m[key]) <= 0.5e-4, (key, summary[4], evaluated, m)
    assert math.isclose(printed["perplexity"], math.exp(printed["val_loss"]), rel_tol=1e-3), summary[4]

    # The gate: its recorded decision and reason; promoted = the gate alias on this version.
    assert summary[5] == f"  gate        {card.gate.reason}", (summary[5], card.gate)
    assert card.gate.promoted == (card.gate.alias in entry.aliases) and card.gate.candidate_bits_per_byte == m["bits_per_byte"]
    assert card.gate.promoted and card.gate.baseline == "", card.gate  # a fresh store: nothing held the alias

    # The commands work as printed from the folder the run started in (ROOT), the venv active or not.
    on_path = shutil.which("pretrain") and Path(shutil.which("pretrain")).resolve() == (BIN / "pretrain").resolve()
    cli = "pretrain" if on_path else str((BIN / "pretrain").relative_to(ROOT))
    assert summary[6] == "next:" + ("" if on_path else f" (or `source {BIN.relative_to(ROOT)}/activate` once, then `pretrain …`)")
    commands = [line.split("   (")[0].strip() for line in summary[7:]]  # $PRETRAIN_STORE is the store: no --store
    assert commands[:3] == [
        f"{cli} runs show {run_id}",
        f"{cli} runs report {run_id}",
        f"{cli} registry show {card.name}:{card.version}",
    ]
    assert commands[3:] == [f"{cli} ui --run {mlflow_run_of(store, f'{card.name}:{card.version}')}"], summary
    shown = subprocess.run(commands[0].split(), cwd=ROOT, env={**os.environ, "PRETRAIN_STORE": store.uri}, capture_output=True)
    assert shown.returncode == 0 and run_id in shown.stdout.decode(), shown
    # One name for people (issue 51): the card's, the training run's (runs show), the MLflow run's.
    assert card.run_name.startswith(f"{card.name} on ") and f"run {run_id} ({card.run_name})" in shown.stdout.decode()
    assert not any(line.startswith("{") for line in lines[:-1])  # no JSON but the --json line


def assert_data_lines(store, version: str, data_line: str, validation_line: str) -> None:
    """The summary's data and validation lines against the dataset's manifest and validation result."""
    stats = store.get_json(f"{dataset_prefix(version)}/{MANIFEST}")["stats"]
    data = re.fullmatch(
        r"  data +([\d,]+) of ([\d,]+) documents kept(?: \(skipped: (.*)\))?, ([\d,]+) tokens; dataset (\w+)", data_line
    )
    assert data, data_line
    kept, read, skipped, tokens, shown_version = data.groups()
    assert (_count(kept), _count(read)) == (stats["documents_kept"], stats["documents_read"]), (data_line, stats)
    assert _count(tokens) == stats["train_tokens"] + stats["val_tokens"] and shown_version == version, (data_line, stats)
    reasons = {k.removeprefix("skipped_"): n for k, n in stats.items() if k.startswith("skipped_") and k != "skipped_total" and n}
    shown = dict(pair.rsplit(" ", 1) for pair in skipped.split(", ") if pair != "…") if skipped else {}
    assert {reason: _count(n) for reason, n in shown.items()} == {r: reasons[r] for r in shown}, (data_line, stats)
    assert bool(shown) == bool(reasons), (data_line, stats)
    assert stats["documents_read"] - stats["documents_kept"] == sum(reasons.values()) == stats["skipped_total"]

    result = store.get_json(f"{validation_prefix(dataset_prefix(version))}/{VALIDATION_RESULT}")
    met = sum(1 for outcome in result["outcomes"] if outcome["success"])
    verdict = "PASS" if result["success"] else "FAIL"
    assert validation_line == f"  validation  {verdict}: {met} of {len(result['outcomes'])} expectations met", (
        validation_line,
        result,
    )
    assert verdict == "PASS" and met == len(result["outcomes"]) > 0


def _count(text: str) -> int:
    return int(text.replace(",", ""))


def mlflow_run_of(store, model: str) -> str:
    """The id of the one active MLflow run tagged with ``model`` (name:version) of ``store``, found through
    MLflow's own search (as ``pretrain ui`` shows runs), not through the pipeline's lookup."""
    mlflow = client(resolve_uri())
    experiments = [e.experiment_id for e in mlflow.search_experiments()]
    query = f"tags.`pretrain.model` = '{model}' and tags.`pretrain.store` = '{store.uri}'"
    runs = mlflow.search_runs(experiments, filter_string=query)
    assert len(runs) == 1, (model, store.uri, [r.info.run_id for r in runs])
    return runs[0].info.run_id


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
