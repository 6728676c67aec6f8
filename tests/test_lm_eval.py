"""lm-evaluation-harness suites: the held-out task builders, a real lm-eval run on a tiny export
checked against the same loglikelihood comparisons made by hand with transformers, offline, and
the config rules of the task list and the gate metric."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from common.contracts import EOD_TOKEN
from common.errors import ConfigError
from data_prep.shards import pack
from data_prep.tokenizer import train_tokenizer
from evaluation import lm_eval_suite as suite
from evaluation.lm_eval_catalog import chance_level, metric_name, shipped_tasks
from pipeline.config import parse_config
from registry.card import metric_text
from tests.helpers import distinct_docs, tiny_tokenizer

SEQ_LEN = 32
TASKS = ["heldout_cloze", "heldout_continuation"]


@pytest.fixture(scope="module")
def heldout():
    """A tokenizer and the packed held-out rows of 10 documents, as a dataset's validation split holds them."""
    docs = distinct_docs(10, seed=3, words_per_doc=90)
    tokenizer = train_tokenizer(docs, tiny_tokenizer())
    ids = [np.asarray(tokenizer.encode(d).ids) for d in docs]
    rows = pack(ids, tokenizer.token_to_id(EOD_TOKEN), SEQ_LEN, np.uint16)
    return docs, tokenizer, rows


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_examples_are_deterministic_and_sound(heldout, tmp_path):
    docs, tokenizer, rows = heldout
    first = suite.build_task_files(rows, tokenizer, SEQ_LEN, TASKS, 20, 7, tmp_path / "a")
    again = suite.build_task_files(rows.copy(), tokenizer, SEQ_LEN, TASKS, 20, 7, tmp_path / "b")
    other_seed = suite.build_task_files(rows, tokenizer, SEQ_LEN, TASKS, 20, 8, tmp_path / "c")
    for task in TASKS:
        assert first[task].read_bytes() == again[task].read_bytes()
        assert first[task].read_bytes() != other_seed[task].read_bytes()
    # The documents come back whole from the packed stream (the last one cut where the rows end).
    decoded = [tokenizer.decode(d) for d in suite.heldout_documents(rows, tokenizer.token_to_id(EOD_TOKEN))]
    assert decoded[:-1] == docs[: len(decoded) - 1] and docs[len(decoded) - 1].startswith(decoded[-1])

    cloze = read_jsonl(first["heldout_cloze"])
    assert len(cloze) == 20 and len({(r["doc"], r["context"]) for r in cloze}) == 20
    for r in cloze:
        # The target is the passage's own last whole word: context + target is text of its document,
        # followed there by something that is not part of the word.
        text = decoded[r["doc"]]
        at = text.index(r["context"] + r["target"])
        assert r["target"].isidentifier() and len(r["target"]) >= 3
        assert not text[at + len(r["context"]) + len(r["target"])].isalnum()

    continuation = read_jsonl(first["heldout_continuation"])
    assert len(continuation) == 20
    for r in continuation:
        assert len(r["choices"]) == suite.CHOICES == len(set(r["choices"]))
        # The chance level shown beside the accuracies (lm_eval_catalog.CHANCE) is that of these examples.
        assert chance_level("lm_eval.heldout_continuation.acc") == 1 / len(r["choices"])
        assert r["context"] + r["choices"][r["label"]] in decoded[r["doc"]]  # the true ending is the passage's own
        assert r["choice_docs"][r["label"]] == r["doc"]
        for i, (choice, doc) in enumerate(zip(r["choices"], r["choice_docs"], strict=True)):
            assert choice[:1].isspace()  # every ending starts at a word
            if i != r["label"]:
                assert doc != r["doc"] and choice in decoded[doc]  # a distractor: another document's text
    assert len({r["label"] for r in continuation}) > 1  # the answer is not always in the same place


class _Recorder(BaseHTTPRequestHandler):
    """A stand-in Hugging Face endpoint that records every request (there must be none)."""

    seen: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.seen.append(self.path)
        self.send_response(404)
        self.end_headers()

    do_HEAD = do_POST = do_GET

    def log_message(self, *args):
        pass


def hand_loglikelihood(model, tokenizer, context: str, continuation: str, max_length: int) -> tuple[float, bool]:
    """The loglikelihood of ``continuation`` after ``context`` and whether greedy decoding gives it,
    computed as lm-eval describes it: trailing spaces of the context move to the continuation, the
    pair is encoded whole and split at the context's length, the window keeps the last tokens."""
    import torch

    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer.encode(context + continuation).ids
    ctx = tokenizer.encode(context).ids
    cont = whole[len(ctx) :]
    window = (ctx + cont)[-(max_length + 1) :][:-1]
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([window])).logits[0].double(), dim=-1)
    scored = logprobs[-len(cont) :]
    target = torch.tensor(cont)
    return scored.gather(1, target[:, None]).sum().item(), bool((scored.argmax(-1) == target).all())


@pytest.mark.slow
def test_lm_eval_on_a_tiny_export_matches_a_hand_computation_offline(heldout, tmp_path, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    from hf_interop.export import export_hf
    from training.config import ModelConfig, ParallelConfig
    from training.distributed import init_distributed, shutdown_distributed
    from training.model.gpt import build_gpt

    _, tokenizer, rows = heldout
    init_distributed(ParallelConfig(tensor_parallel=1), seed=0, standalone=True)
    try:
        cfg = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, kernels="torch")
        model = build_gpt(cfg, tokenizer.get_vocab_size(), SEQ_LEN, tensor_parallel=1)
        torch.manual_seed(0)
        with torch.no_grad():  # away from the init, so that the choices' likelihoods differ clearly
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.2)
        hf_dir = export_hf(model.eval(), cfg, tokenizer.to_str(), SEQ_LEN, tmp_path / "hf")
    finally:
        shutdown_distributed()
    files = suite.build_task_files(rows, tokenizer, SEQ_LEN, TASKS, 12, 0, tmp_path / "tasks")

    # Any hub request would go to this endpoint: none may reach it.
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    try:
        scored = suite.run_suite({"candidate": hf_dir}, files, batch_size=5, seed=0)["candidate"]
    finally:
        server.shutdown()
        server.server_close()
    assert _Recorder.seen == []

    hf = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    cloze = [hand_loglikelihood(hf, tokenizer, r["context"], r["target"], SEQ_LEN) for r in read_jsonl(files["heldout_cloze"])]
    acc, acc_norm = [], []
    for r in read_jsonl(files["heldout_continuation"]):
        lls = [hand_loglikelihood(hf, tokenizer, r["context"], c, SEQ_LEN)[0] for c in r["choices"]]
        acc.append(float(np.argmax(lls) == r["label"]))
        acc_norm.append(float(np.argmax(np.array(lls) / [len(c) for c in r["choices"]]) == r["label"]))

    got = suite.flatten(scored)
    assert got["lm_eval.heldout_cloze.acc"] == pytest.approx(np.mean([greedy for _, greedy in cloze]))
    # lm-eval's perplexity: exp of the mean negative loglikelihood per example.
    assert got["lm_eval.heldout_cloze.perplexity"] == pytest.approx(math.exp(-np.mean([ll for ll, _ in cloze])), rel=1e-4)
    assert got["lm_eval.heldout_continuation.acc"] == pytest.approx(np.mean(acc))
    assert got["lm_eval.heldout_continuation.acc_norm"] == pytest.approx(np.mean(acc_norm))
    assert 0 < np.mean(acc) < 1 or 0 < np.mean(acc_norm) < 1  # a comparison that could have gone either way
    for task in TASKS:
        assert scored[task]["n_samples"]["effective"] == 12
        assert any(key.endswith("_stderr,none") for key in scored[task]["results"])


def test_every_shipped_accuracy_is_shown_with_its_chance_level():
    accuracies = [metric_name(t, m) for t, metrics in shipped_tasks().items() for m in metrics if m.startswith("acc")]
    assert sorted(accuracies) == [
        "lm_eval.heldout_cloze.acc",
        "lm_eval.heldout_continuation.acc",
        "lm_eval.heldout_continuation.acc_norm",
    ]
    assert all(chance_level(name) is not None for name in accuracies)
    assert metric_text("lm_eval.heldout_continuation.acc_norm", 0.3125) == "0.3125 (chance 0.25)"
    assert metric_text("lm_eval.heldout_cloze.acc", 0.05) == "0.0500 (chance ≈ 0)"
    assert metric_text("lm_eval.heldout_cloze.perplexity", 812.5) == "812.5000"  # no chance level for a perplexity
    assert metric_text("val_loss", 5.25) == "5.2500"


def test_task_list_and_gate_metric_are_checked():
    with pytest.raises(ConfigError) as e:
        parse_config({"evaluation": {"lm_eval_tasks": ["heldout_cloze", "lambada"]}}, launch=False)
    assert "evaluation.lm_eval_tasks names 'lambada'" in str(e.value) and "heldout_continuation" in str(e.value)

    with pytest.raises(ConfigError) as e:
        parse_config(
            {"evaluation": {"lm_eval_tasks": ["heldout_cloze"]}, "registry": {"gate_metric": "lm_eval.heldout_continuation.acc"}},
            launch=False,
        )
    assert "does not run heldout_continuation" in str(e.value)

    with pytest.raises(ConfigError) as e:
        parse_config({"registry": {"gate_metric": "lm_eval.heldout_cloze.acc_norm"}}, launch=False)
    assert "lm_eval.heldout_continuation.acc_norm" in str(e.value)  # the figures that exist are listed

    config = parse_config({"registry": {"gate_metric": "lm_eval.heldout_continuation.acc"}}, launch=False)
    assert config.registry.gate_metric == "lm_eval.heldout_continuation.acc"
    assert parse_config({"evaluation": {"lm_eval_tasks": []}}, launch=False).evaluation.lm_eval_tasks == []
