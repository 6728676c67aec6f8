"""The quality gate on an lm-evaluation-harness figure (``registry.gate_metric``): registry-level,
real stores (local and SeaweedFS). Higher acc is better, whatever bits per byte say; the card
records which figure decided, and the lm-eval figures land in the card's metrics."""

from __future__ import annotations

import dataclasses

import pytest

from common.contracts import ModelCard
from registry.registry import register, resolve, show
from tests.helpers import registry_inputs, report

METRIC = "lm_eval.heldout_continuation.acc"
EXAMPLES = {"heldout_continuation": "e" * 64}
"""The digest of the examples both models were scored on."""


def scored(loss: float, acc: float, baseline: str = "", baseline_loss: float = -1.0, baseline_acc: float | None = None):
    """A report whose candidate has val loss ``loss`` and continuation acc ``acc``; with ``baseline``,
    the holder's figures on the same rows and examples."""
    r = report(loss)
    figures = {METRIC: acc, "lm_eval.heldout_continuation.acc_norm": acc / 2}
    baseline_figures = {METRIC: baseline_acc} if baseline_acc is not None else {}
    bpb = report(baseline_loss).bits_per_byte if baseline else -1.0
    return dataclasses.replace(
        r,
        baseline=baseline,
        baseline_bits_per_byte=bpb,
        lm_eval=figures,
        baseline_lm_eval=baseline_figures,
        lm_eval_examples=EXAMPLES,
    )


def gated(store, r, metric: str = METRIC):
    config = {"evaluation": {"batch_size": 16, "max_batches": 16}, "registry": {"gate_metric": metric}}
    return register(store, "gpt", r, config=config, gate_alias="production", gate_tolerance=0.01)


def test_a_candidate_worse_on_the_gate_metric_keeps_the_alias_off(store):
    registry_inputs(store)
    first = gated(store, scored(3.0, acc=0.50))
    assert resolve(store, "gpt:production") == ("gpt", first.version)
    card = show(store, "gpt:1").card
    assert card.metrics[METRIC] == 0.50 and card.metrics["lm_eval.heldout_continuation.acc_norm"] == 0.25
    assert card.gate.metric == METRIC and card.gate.promoted

    # Better bits per byte (loss 2.0 < 3.0) but lower acc (0.30 < 0.50 - 0.01): the alias stays.
    worse = gated(store, scored(2.0, acc=0.30, baseline="models/gpt/1", baseline_loss=3.0, baseline_acc=0.50))
    gate = show(store, f"gpt:{worse.version}").card.gate
    assert not gate.promoted and gate.metric == METRIC
    assert (gate.candidate_value, gate.baseline_value) == (0.30, 0.50)
    assert gate.reason == f"{METRIC} 0.3000 < 0.5000 − tolerance 0.01: alias kept"
    assert gate.candidate_bits_per_byte < gate.baseline_bits_per_byte  # bits per byte alone would have promoted it
    assert resolve(store, "gpt:production") == ("gpt", 1) and resolve(store, "gpt") == ("gpt", worse.version)

    # Within the tolerance (0.495 ≥ 0.50 - 0.01) though worse on bits per byte: promoted.
    close = gated(store, scored(3.5, acc=0.495, baseline="models/gpt/1", baseline_loss=3.0, baseline_acc=0.50))
    assert show(store, f"gpt:{close.version}").card.gate.promoted
    assert resolve(store, "gpt:production") == ("gpt", close.version)

    # A holder not scored on these examples (no Hugging Face export): not comparable, alias kept.
    unscored = gated(store, scored(1.0, acc=0.9, baseline=f"models/gpt/{close.version}", baseline_loss=3.5))
    gate = show(store, f"gpt:{unscored.version}").card.gate
    assert not gate.promoted and gate.baseline_value is None and "not comparable" in gate.reason
    assert resolve(store, "gpt:production") == ("gpt", close.version)


def test_holder_moved_during_evaluation_is_judged_by_its_recorded_figure_on_the_same_examples(store):
    """B (acc 0.6) and A (acc 0.55) were both scored against gpt:1 (acc 0.5); B registered first
    and took production. A is judged against B's card figure, on the same examples: alias kept."""
    registry_inputs(store)
    gated(store, scored(3.0, acc=0.50))
    # registration copies the evaluation outputs: gpt:2's evaluation.json records its examples' digests
    store.put_json("runs/r1/eval/b/results.json", {"lm_eval_examples": EXAMPLES})
    store.commit("runs/r1/eval/b")
    b = scored(3.0, acc=0.60, baseline="models/gpt/1", baseline_loss=3.0, baseline_acc=0.50)
    gated(store, dataclasses.replace(b, outputs="runs/r1/eval/b"))
    assert resolve(store, "gpt:production") == ("gpt", 2)
    a = gated(store, scored(3.0, acc=0.55, baseline="models/gpt/1", baseline_loss=3.0, baseline_acc=0.50))
    gate = show(store, f"gpt:{a.version}").card.gate
    assert gate.baseline == "models/gpt/2" and gate.baseline_value == 0.60 and not gate.promoted
    assert gate.reason.startswith("holder changed during evaluation") and gate.reason.endswith("alias kept")
    assert resolve(store, "gpt:production") == ("gpt", 2)


def test_cards_written_before_the_gate_metric_still_load():
    old_gate = dict(
        alias="production",
        baseline="",
        baseline_bits_per_byte=None,
        candidate_bits_per_byte=2.0,
        tolerance=0.0,
        promoted=True,
        reason="no model holds the alias yet: the candidate takes it",
    )
    card = {
        "name": "gpt",
        "version": 1,
        "registered_at": "2026-01-01T00:00:00+00:00",
        "metrics": {"bits_per_byte": 2.0},
        "sample": "",
        "lineage": dict(
            dataset_version="abc",
            dataset="",
            dataset_manifest="",
            tokenizer_sha256="t",
            training_run="",
            training_steps=1,
            checkpoint="",
        ),
        "config": {},
        "code": {"commit": "x"},
        "gate": old_gate,
        "format": 2,
    }
    gate = ModelCard.from_dict(card).gate
    assert gate.metric == "bits_per_byte" and gate.candidate_value is None


@pytest.mark.parametrize("metric", ["bits_per_byte", METRIC])
def test_the_first_model_takes_the_alias_whatever_the_metric(tmp_path, metric):
    from storage import open_store

    store = registry_inputs(open_store(str(tmp_path / "store")))
    gated(store, scored(3.0, acc=0.1), metric=metric)
    assert show(store, "gpt:1").card.gate.metric == metric and resolve(store, "gpt:production") == ("gpt", 1)
