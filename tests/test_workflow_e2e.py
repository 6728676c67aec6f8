"""The whole workflow under `pyflyte run` (real Flyte local execution, Elastic with two ranks) against
the real S3 server, then again and again in one flytekit cache (one private HOME), each run changing
one thing, to see which steps it reruns.

One cold run serves every scenario that needs a trained, registered model (a cold pipeline costs a
minute on two cores): the module fixture runs it, and each test below runs on its store and cache,
asserting what its own run did. Each needs only the cold run, so each passes selected alone (``-k``)
as in file order, where the runs add up (a later registration is a later version). Which steps a run
executed is read from flytekit's local cache (a miss adds the task's new key), what it did from the
store (metrics.jsonl, committed checkpoints, registry entries), not from console output:

- unchanged but for the recovery settings, the corpus moved and the CLI edited (run from an edited copy) →
  every step a hit, the store unchanged;
- code edits (a copy of the source tree with a comment appended to a file, run from that copy) →
  exactly the steps ``tests/test_cache_keys.py``'s table says rerun: a filter and an lm-eval task
  file → prepare, validate, evaluate; the run's Decks and the registry → train, register (every
  row of the table, one edit a run: ``benchmarks/cache_key_table.py``);
- training config changed → train, evaluate, register rerun;
- tokenizer changed → everything from prepare;
- continued pretraining of an imported open model → its weights and tokenizer are reused, its export is its
  family, and it is gated against its base.

The bad-input tests check the one line a user sees: that message is the product there.
"""

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from common.contracts import checkpoint_prefix
from common.digests import file_sha256
from storage import open_store
from tests.helpers import (
    BIN,
    CACHED_STEPS,
    CACHED_TASKS,
    LM_EVAL_HELDOUT,
    ROOT,
    cache_outcomes,
    distinct_corpus,
    local_cache_entries,
    long_fixture,
    run,
    run_metrics,
    training_run_of,
    write_config,
)
from tests.helpers import CACHE_KEY_TABLE as EXPECTED
from tracking.client import client

pytestmark = pytest.mark.slow
# Where the pipeline writes: datasets (with their validation reports), training runs, registry entries.
PIPELINE_PREFIXES = ("datasets/", "runs/", "models/")
NAME = "gpt-e2e"


class Pipeline:
    """``pyflyte run`` of the tiny preset on one S3 store and one flytekit cache; each call returns
    every cached task's outcome ('hit' or 'miss'), in CACHED_TASKS order."""

    def __init__(self, root: Path, s3_server) -> None:
        self.root = root
        self.home = root / "home"  # a private HOME: flytekit's local cache lives in ~/.flyte
        self.env = {**os.environ, **s3_server.env(), "HOME": str(self.home), "PYTHONUNBUFFERED": "1"}
        self.store_uri = f"s3://{s3_server.bucket}/e2e"
        self.corpus = distinct_corpus(root / "corpus")
        self.runs = 0
        self.output = ""  # the last run's stdout and stderr
        self.cold: list[str] = []  # the cold run's outcomes, output and registry (the module fixture)
        self.cold_output = ""
        self.cold_registry: list[dict] = []

    def config(self, corpus: Path | None = None, **sections) -> Path:
        self.runs += 1
        evaluation = {**LM_EVAL_HELDOUT, **sections.pop("evaluation", {})}
        data = {"sources": [str(corpus or self.corpus)], "max_documents": 0}
        return write_config(self.root / f"run-{self.runs}.yaml", self.store_uri, data=data, evaluation=evaluation, **sections)

    def __call__(self, config: Path, tree: Path = ROOT) -> list[str]:
        env = self.env if tree == ROOT else {**self.env, "PYTHONPATH": str(tree)}  # the copy's modules, in every rank too
        command = [str(BIN / "pyflyte"), "run", "workflows/pretrain.py", "pretrain", "--config", str(config)]
        before = local_cache_entries(self.home)
        result = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        self.output = result.stdout + result.stderr
        outcomes = cache_outcomes(before, local_cache_entries(self.home))
        return [outcomes[task] for task in CACHED_TASKS]

    def registry(self) -> list[dict]:
        listed = run([str(BIN / "pretrain"), "registry", "list", "--json", "--store", self.store_uri], self.env)
        assert listed.returncode == 0, listed.stderr
        return json.loads(listed.stdout)

    def card(self, version: int) -> dict:
        return open_store(self.store_uri).get_json(f"models/{NAME}/{version}/card.json")

    def mlflow_run(self, version: int):
        """The one active MLflow run recording ``NAME:version`` of this store (the session's database, conftest)."""
        mlflow = client(os.environ["MLFLOW_TRACKING_URI"])
        exp = mlflow.get_experiment_by_name("pretrain").experiment_id
        found = mlflow.search_runs([exp], filter_string=f"tags.`pretrain.model` = '{NAME}:{version}'")
        (run,) = [r for r in found if r.data.tags["pretrain.store"] == self.store_uri]
        return mlflow, run

    def opened_run(self, output: str | None = None) -> str:
        """The MLflow run the last execution's (or ``output``'s) start_tracking opened."""
        return re.search(r"is MLflow run (\w+)", self.output if output is None else output).group(1)


@pytest.fixture(scope="module")
@long_fixture("the cold run every scenario of this module starts from: prepare, validate, train, lm-eval, register")
def pipeline(s3_server, tmp_path_factory) -> Pipeline:
    """The pipeline after its cold run (``cold``, ``cold_output``, ``cold_registry``): each test, selected
    alone or in file order, starts from a trained and registered model in a warm cache."""
    with pytest.MonkeyPatch.context() as patch:  # the tests read the store too
        for key, value in s3_server.env().items():
            patch.setenv(key, value)
        pipeline = Pipeline(tmp_path_factory.mktemp("workflow"), s3_server)
        started = time.monotonic()
        pipeline.cold = pipeline(pipeline.config())
        print(f"cold run {time.monotonic() - started:.1f}s")
        pipeline.cold_output, pipeline.cold_registry = pipeline.output, pipeline.registry()
        yield pipeline


def latest(pipeline: Pipeline) -> int:
    return max(row["version"] for row in pipeline.registry())


def test_pipeline_end_to_end_on_s3(pipeline, tmp_path):
    assert pipeline.cold == ["miss"] * 5  # the module fixture's cold run

    (entry,) = pipeline.cold_registry
    assert entry["name"] == NAME and entry["version"] == 1
    assert entry["aliases"] == ["latest", "production"]  # the first model passes the quality gate
    assert {"val_loss", "perplexity", "final_train_loss"} <= set(entry["metrics"])

    store = open_store(pipeline.store_uri)
    card = pipeline.card(1)
    # The run the entry came from: 12 steps in its metrics.jsonl, checkpoints committed at 6 and 12.
    training_run = training_run_of(store, card)
    metrics = run_metrics(store, training_run)
    assert [m["step"] for m in metrics] == list(range(1, 13))
    assert metrics[-1]["loss"] < metrics[0]["loss"] and card["metrics"]["first_train_loss"] == metrics[0]["loss"]
    assert all(store.is_committed(checkpoint_prefix(training_run, step)) for step in (6, 12))
    assert card["lineage"]["checkpoint"] == checkpoint_prefix(training_run, 12)  # keys: a copied store still reads
    lineage = card["lineage"]
    assert lineage["dataset_version"] == entry["dataset"] and lineage["flyte_execution_id"]
    assert lineage["dataset_manifest"] == f"datasets/{entry['dataset']}/manifest.json" and len(lineage["tokenizer_sha256"]) == 64
    assert card["config"]["train"]["steps"] == 12 and card["code"]["commit"]
    store.download_dir(f"models/{NAME}/1", tmp_path / "downloaded")
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

    # Its MLflow run (issue 33): named by what differs from the defaults, the summary beside the per-step
    # figures, the loss chart and the validation report among its files, its page in the UI printed.
    mlflow, run = pipeline.mlflow_run(1)
    assert run.info.run_id == pipeline.opened_run(pipeline.cold_output) and run.info.status == "FINISHED"
    named = run.info.run_name  # issue 51: the data too, and the same name on the card
    assert named.startswith(f"{NAME} on corpus layers=2 hidden=64 ") and "steps=12" in named and card["run_name"] == named, named
    assert run.data.metrics["summary.tokens_per_s"] == card["metrics"]["tokens_per_second"]
    assert "tokens_per_second" not in run.data.metrics and run.data.metrics["val_loss"] == card["metrics"]["val_loss"]
    files = {a.path for folder in ("charts", "validation") for a in mlflow.list_artifacts(run.info.run_id, folder)}
    assert files == {"charts/loss.png", "validation/report.html"}, files
    assert "report.html" in {a.path for a in mlflow.list_artifacts(run.info.run_id)}  # the run's Decks, one page
    assert f"open it: pretrain ui --run {run.info.run_id}" in pipeline.cold_output and "#/experiments" not in pipeline.cold_output


def source_tree(dest: Path, edits: list[str]) -> Path:
    """A copy of the repository's tracked files with a comment appended to each file of ``edits``."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode()
    for name in filter(None, listed.split("\0")):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    for name in edits:
        with open(dest / name, "a") as f:
            f.write("\n# an edit\n")
    return dest


def test_a_rerun_is_served_from_cache_and_writes_nothing(pipeline, tmp_path):
    """Three changes that decide no number, in one rerun: the recovery settings, the corpus moved (prepare is
    keyed by its content) and the CLI edited, the cache-key table's one row that reruns nothing, as the only
    code edit of the run (beside another edit, a CLI edit that reran a task would hide among that edit's
    reruns). Every task hits, so each change alone would have too."""
    assert EXPECTED["cli/main.py"] == (set(), set())
    store = open_store(pipeline.store_uri)
    written = {prefix: store.list(prefix) for prefix in PIPELINE_PREFIXES}
    metrics = run_metrics(store, training_run_of(store, pipeline.card(1)))
    moved = shutil.copytree(pipeline.corpus, pipeline.root / "elsewhere" / "corpus")
    started = time.monotonic()
    # How a failure is recovered is no input of training (tasks/train.RECOVERY): other values hit the cache too.
    recovery = {"max_restarts": 1, "keep_local_checkpoints": 2, "local_checkpoint_every": 5}
    tree = source_tree(tmp_path / "tree", ["cli/main.py"])
    assert pipeline(pipeline.config(corpus=moved, train=recovery), tree=tree) == ["hit"] * 5
    print(f"cached rerun {time.monotonic() - started:.1f}s")
    # Nothing prepared, trained or registered again: the store holds exactly what it held.
    assert {prefix: store.list(prefix) for prefix in PIPELINE_PREFIXES} == written
    assert run_metrics(store, training_run_of(store, pipeline.card(1))) == metrics
    assert [r["version"] for r in pipeline.registry()] == [1]
    # No second MLflow run of the same training (issue 33): the first run names this execution; the run it
    # opened is deleted.
    mlflow, run = pipeline.mlflow_run(1)
    opened = mlflow.get_run(pipeline.opened_run())
    assert opened.info.run_id != run.info.run_id and opened.info.lifecycle_stage == "deleted"
    assert run.data.tags["pretrain.reexecutions"] == opened.data.tags["pretrain.execution"] != run.data.tags["pretrain.execution"]
    assert run.data.tags["pretrain.reexecution_count"] == "1" and run.info.status == "FINISHED"
    assert f"recorded as MLflow run {run.info.run_id} (an earlier execution's run" in pipeline.output
    # Issue 51: the summary says so, names every cached stage, and dates the gate's decision to the registration.
    again = rf"^pretrain: {NAME}:1 \([^)]*\) again, from the cache \(registered [\d-]+ [\d:]+ UTC\)$"
    assert re.search(again, pipeline.output, re.MULTILINE), pipeline.output[-3000:]
    assert "; from cache: prepare_data, validate_data, train_model, evaluate_model, register_model\n" in pipeline.output
    assert re.search(r"^  gate        .* \(decided [\d-]+ [\d:]+ UTC, at its registration\)$", pipeline.output, re.M)


# One edit per cached task, each the narrowest row of the table that reaches it: a filter (prepare and
# validate), the run's Decks (train), an lm-eval task file (evaluate), the registry (register). Two runs of
# two edits whose reruns do not meet, so that the task right after each edit's reruns hits (train after
# validate, register after evaluate, evaluate after train): each rerun gave the output its cache held.
# Every row of the table, one edit a run: benchmarks/cache_key_table.py.
EDITS = {
    "filter+lm-eval-task": ["data_prep/clean.py", "evaluation/lm_eval_tasks/heldout_cloze.yaml"],
    "run-decks+registry": ["reports/run_html.py", "registry/registry.py"],
}


def test_the_observed_edits_reach_each_cached_task_through_one_edit():
    reached = [step for edits in EDITS.values() for name in edits for step in EXPECTED[name][1]]
    assert sorted(reached) == sorted(CACHED_STEPS)


@pytest.mark.long("each edit's pipeline reruns the tasks it reaches (one retrains): up to 40 s under make test")
@pytest.mark.parametrize("edits", list(EDITS.values()), ids=list(EDITS))
def test_a_code_edit_reruns_what_the_cache_key_table_says(pipeline, tmp_path, edits):
    """The reruns column of test_cache_keys.EXPECTED, observed: the cold run's config run from an edited copy."""
    expected = set().union(*(EXPECTED[name][1] for name in edits))
    before = latest(pipeline)
    outcomes = pipeline(pipeline.config(), tree=source_tree(tmp_path / "tree", edits))
    reran = {step for step, outcome in zip(CACHED_STEPS, outcomes, strict=True) if outcome == "miss"}
    assert reran == expected, (edits, outcomes)
    # A comment changes no number: a register rerun of the same evaluation replays its registration, and
    # only a new run id (none of these edits) names a new run, whose model is a new version.
    new_run = any("run id" in EXPECTED[name][0] for name in edits)
    assert latest(pipeline) == (before + 1 if new_run else before)


@pytest.mark.long("a pipeline rerunning training, evaluation (lm-eval included) and registration: about 45 s under make test")
def test_a_training_change_reruns_train_evaluate_register(pipeline):
    # lm-eval off as well: evaluate reruns anyway, on the new checkpoint. The budget in tokens this time:
    # plan_training turns 3,000 into the same 12 steps of 8 rows of 32 tokens (3,072 tokens).
    config = pipeline.config(train={"lr": 0.001, "steps": 0, "tokens": 3000}, evaluation={"lm_eval_tasks": []})
    assert pipeline(config) == ["hit", "hit", "miss", "miss", "miss"]
    metrics = pipeline.card(latest(pipeline))["metrics"]
    assert (metrics["steps_trained"], metrics["tokens_trained"]) == (12, 3072), metrics


@pytest.mark.long("a new tokenizer reruns every task of a pipeline, lm-eval included: 90-95 s under make test")
def test_a_tokenizer_change_reruns_everything(pipeline):
    config = pipeline.config(tokenizer={"vocab_size": 320}, evaluation={"lm_eval_tasks": []})
    assert pipeline(config) == ["miss"] * 5


def hf_validation_loss(store, dataset_version: str, hf_dir: Path) -> float:
    """The registered Hugging Face export's loss on the rows our evaluation scored (2 batches of 4)."""
    import torch
    from transformers import AutoModelForCausalLM

    from common.contracts import DatasetRef
    from data_prep.manifest import load_manifest, shard_urls
    from data_prep.shards import read_rows

    ref = DatasetRef(store=store.uri, version=dataset_version, prefix=f"datasets/{dataset_version}")
    rows = read_rows(shard_urls(store, ref, load_manifest(store, ref), "val"))[:8]
    model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    tokens = torch.from_numpy(rows.astype("int64"))
    with torch.no_grad():
        logits = model(tokens[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).item()


# ----------------------------------------------------------------------------------------------
# Bad input: the one line a user sees


@pytest.fixture
def flyte_env(s3_env, tmp_path):
    # A private HOME: flytekit's local cache lives in ~/.flyte.
    return {**os.environ, **s3_env, "HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}


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


def test_an_empty_corpus_stops_at_listing_and_writes_nothing(s3_server, flyte_env, tmp_path):
    """Issue 33: an empty corpus folder failed after 45.7 s at resolve_documents (advising to lower
    data.min_chars) and left datasets/work-… in the store; now the first data task's listing stops it."""
    store_uri = f"s3://{s3_server.bucket}/empty-corpus"
    (tmp_path / "empty").mkdir()
    config = write_config(tmp_path / "empty.yaml", store_uri, data={"sources": [str(tmp_path / "empty")]})
    result = run([str(BIN / "pretrain"), "run", "--config", str(config)], flyte_env)
    assert result.returncode == 2, result.stderr[-3000:]
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith("error: fingerprint_corpus: the corpus sources [")
    assert "hold no file to read (no files at all)" in error
    assert "min_chars" not in error and open_store(store_uri).list("") == []
    # The execution's MLflow run opened before the listing and ends FAILED, naming the task (not RUNNING).
    run_id = re.search(r"is MLflow run (\w+)", result.stdout).group(1)
    failed = client(flyte_env["MLFLOW_TRACKING_URI"]).get_run(run_id)
    # The workflow's node that failed is the data stage; its error line names the task inside it (listing).
    assert failed.info.status == "FAILED" and failed.data.tags["pretrain.failed_task"] == "prepare_mixture", failed.data.tags
    assert failed.data.tags["pretrain.error"].startswith("fingerprint_corpus: the corpus sources ["), failed.data.tags


def test_rejected_credentials_fail_in_one_line(s3_server, flyte_env, tmp_path):
    store_uri = f"s3://{s3_server.bucket}/bad-credentials"
    config = write_config(tmp_path / "bad.yaml", store_uri)
    env = {**flyte_env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    result = run([str(BIN / "pretrain"), "run", "--config", str(config)], env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: S3 endpoint")
    assert "rejected the credentials" in result.stderr
    assert open_store(store_uri).list("") == []


@pytest.mark.long("a pipeline continuing an imported Llama 3, lm-eval on it and its base: 50 s alone, about 95 s under make test")
def test_continued_pretraining_of_an_imported_model_starts_from_its_weights_and_is_gated_against_it(pipeline, tiny_hf_models):
    """Continued pretraining, of an open model: imported (``pretrain registry import``), promoted to the gate's
    alias, continued on the corpus under its own name. One run checks the continuation (the base's tokenizer and
    weights, a run of its own), the import's promise (its end-of-text token, its family on export, its export
    scored by lm-eval as the gate's baseline) and the gate against the base."""
    import yaml

    original = tiny_hf_models["llama"]
    commands = [
        ["registry", "import", str(original), "--name", "tiny-llama", "--json"],
        ["registry", "promote", "tiny-llama:1", "--alias", "production"],
    ]
    for command in commands:
        done = run([str(BIN / "pretrain"), *command, "--store", pipeline.store_uri], pipeline.env)
        assert done.returncode == 0, done.stderr
    config = pipeline.config(train={"init_from": "tiny-llama:latest"}, registry={"model_name": "tiny-llama"})
    settings = yaml.safe_load(config.read_text())
    del settings["model"]  # the model section comes from the imported model
    config.write_text(yaml.safe_dump(settings))
    assert pipeline(config) == ["miss"] * 5  # another tokenizer: another dataset, and everything after it
    base_line = re.search(r"\n  base        tiny-llama:1: val_loss (\S+), perplexity \S+, bits_per_byte (\S+)\n", pipeline.output)
    assert base_line, pipeline.output[-3000:]

    store = open_store(pipeline.store_uri)
    base = store.get_json("models/tiny-llama/1/card.json")
    card = store.get_json("models/tiny-llama/2/card.json")
    shown = run([str(BIN / "pretrain"), "registry", "show", "tiny-llama:1", "--store", pipeline.store_uri], pipeline.env)
    assert re.search(r"imported_from +LlamaForCausalLM \(llama\) from tiny-random/llama\n", shown.stdout), shown.stdout
    assert re.search(r" +tokenizer.json  sha256 " + file_sha256(original / "tokenizer.json"), shown.stdout)
    assert card["lineage"]["base_model"] == "models/tiny-llama/1"
    assert card["config"]["model"] == {**base["config"]["model"], "kernels": card["config"]["model"]["kernels"]}
    # The model's own tokenizer encoded the corpus, its end-of-text token ending each document.
    assert card["lineage"]["tokenizer_sha256"] == base["lineage"]["tokenizer_sha256"] == file_sha256(original / "tokenizer.json")
    assert card["lineage"]["eod_token"] == "<|end_of_text|>"
    manifest = store.get_json(card["lineage"]["dataset_manifest"])
    eod = Tokenizer.from_file(str(original / "tokenizer.json")).token_to_id("<|end_of_text|>")
    assert (manifest["eod_token"], manifest["eod_id"]) == ("<|end_of_text|>", eod)
    # A run of its own, trained from step 1, starting from the imported weights (not a fresh model): its first
    # loss is the base's on this text, far above a fresh model's (ln 645 = 6.5), and it learns.
    metrics = card["metrics"]
    steps = run_metrics(store, training_run_of(store, card))
    assert [m["step"] for m in steps] == list(range(1, 13)) and steps[0]["loss"] == metrics["first_train_loss"]
    assert abs(metrics["first_train_loss"] - metrics["base.val_loss"]) < 0.5 and metrics["base.val_loss"] > 7
    assert metrics["val_loss"] < metrics["base.val_loss"]
    assert base_line.groups() == (
        f"{metrics['base.val_loss']:.4f}",
        f"{metrics['base.bits_per_byte']:.4f}",
    )  # as the summary said

    # The gate compared with the holder of production, the base itself, on the very same rows: its figure is the
    # card's base.bits_per_byte, measured twice; lm-eval scored the base's export on the same examples too.
    gate = card["gate"]
    assert gate["baseline"] == "models/tiny-llama/1"
    assert gate["baseline_bits_per_byte"] == pytest.approx(metrics["base.bits_per_byte"], rel=1e-6)
    assert gate["promoted"] == (gate["candidate_bits_per_byte"] <= gate["baseline_bits_per_byte"] + gate["tolerance"])
    holder = store.get_json("models/tiny-llama/aliases/production.json")["version"]
    assert holder == (2 if gate["promoted"] else 1)
    evaluation = store.get_json("models/tiny-llama/2/evaluation.json")
    assert "lm_eval.heldout_continuation.acc" in metrics and evaluation["baseline_lm_eval"]

    # The export is a Llama 3 again: its RoPE scaling, the original's vocabulary and tokenizer files; it loads.
    export = pipeline.root / "continued-export"
    store.download_dir(f"models/tiny-llama/2/{card['hf_export']}", export)
    exported = json.loads((export / "config.json").read_text())
    assert exported["architectures"] == ["LlamaForCausalLM"] and exported["rope_parameters"]["rope_type"] == "llama3"
    source = json.loads((original / "config.json").read_text())
    assert (exported["vocab_size"], exported["max_position_embeddings"]) == (
        source["vocab_size"],
        source["max_position_embeddings"],
    )
    assert (export / "tokenizer_config.json").read_bytes() == (original / "tokenizer_config.json").read_bytes()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(export)
    ids = AutoTokenizer.from_pretrained(export)("def main():", return_tensors="pt").input_ids
    assert ids[0, 0].item() == Tokenizer.from_file(str(original / "tokenizer.json")).token_to_id("<|begin_of_text|>")
    assert model(ids).logits.shape[-1] == exported["vocab_size"]
