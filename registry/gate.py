"""The quality gate: whether a candidate takes the gate alias from its holder, compared on the same
data (bits per byte on the same validation rows, or an lm-eval figure on the same examples)."""

from __future__ import annotations

from typing import Any

from common.contracts import (
    ENTRY_EVALUATION,
    EvalReport,
    GateDecision,
    model_prefix,
)
from registry.card import read_card
from registry.config import DEFAULT_GATE_METRIC
from storage import Store, StoreError

ROW_SETTINGS = ("batch_size", "max_batches")
"""The evaluation settings that, with the dataset version, fix which validation rows are scored."""
LOWER_IS_BETTER = ("bits_per_byte", "val_loss", "perplexity")
"""Figures (the last part of a metric's name) for which less is better; any other (acc, acc_norm) more."""


def gate_direction(metric: str) -> int:
    """+1 when more of ``metric`` is better (acc, acc_norm), -1 when less is (``LOWER_IS_BETTER``)."""
    return -1 if metric.rpartition(".")[2] in LOWER_IS_BETTER else 1


def gate_decision(
    candidate: float | None, baseline: str, baseline_value: float | None, tolerance: float, metric: str = DEFAULT_GATE_METRIC
) -> tuple[bool, str]:
    """Whether the candidate takes the gate alias, and why (recorded on its card): its ``metric``
    against the holder's on the same rows or examples, ``tolerance`` in the metric's units."""
    if not baseline:
        return True, "no model holds the alias yet: the candidate takes it"
    if metric == DEFAULT_GATE_METRIC:
        if baseline_value is None or baseline_value < 0:
            return False, f"{baseline} uses another tokenizer or model shape: not comparable, alias kept"
        if candidate <= baseline_value + tolerance:
            return True, f"{candidate:.4f} bits/byte ≤ {baseline_value:.4f} + tolerance {tolerance}: promoted"
        return False, f"{candidate:.4f} bits/byte > {baseline_value:.4f} + tolerance {tolerance}: alias kept"
    if candidate is None:
        return False, f"the candidate has no {metric} (is its task in evaluation.lm_eval_tasks?): alias kept"
    if baseline_value is None:
        return False, f"{baseline} has no {metric} on the same examples (no Hugging Face export?): not comparable, alias kept"
    if gate_direction(metric) < 0:
        if candidate <= baseline_value + tolerance:
            return True, f"{metric} {candidate:.4f} ≤ {baseline_value:.4f} + tolerance {tolerance}: promoted"
        return False, f"{metric} {candidate:.4f} > {baseline_value:.4f} + tolerance {tolerance}: alias kept"
    if candidate >= baseline_value - tolerance:
        return True, f"{metric} {candidate:.4f} ≥ {baseline_value:.4f} − tolerance {tolerance}: promoted"
    return False, f"{metric} {candidate:.4f} < {baseline_value:.4f} − tolerance {tolerance}: alias kept"


def _figures(report: EvalReport, metric: str) -> tuple[float | None, float | None]:
    """The candidate's ``metric`` and the baseline's, as the evaluation measured them (None: not measured)."""
    if metric == DEFAULT_GATE_METRIC:
        return report.bits_per_byte, report.baseline_bits_per_byte if report.baseline_bits_per_byte >= 0 else None
    return report.lm_eval.get(metric), report.baseline_lm_eval.get(metric)


def gate(report: EvalReport, alias: str, tolerance: float, metric: str = DEFAULT_GATE_METRIC) -> GateDecision:
    """The quality gate's decision on ``report`` for ``alias`` against the holder the evaluation
    compared it with (``report.baseline``), as its card records it."""
    candidate, baseline = _figures(report, metric)
    theirs_bpb = report.baseline_bits_per_byte if report.baseline_bits_per_byte >= 0 else None
    verdict = gate_decision(candidate, report.baseline, baseline, tolerance, metric)
    return _decision(report, alias, tolerance, metric, report.baseline, baseline, theirs_bpb, verdict)


def _decision(
    report: EvalReport,
    alias: str,
    tolerance: float,
    metric: str,
    baseline: str,
    baseline_value: float | None,
    baseline_bits_per_byte: float | None,
    verdict: tuple[bool, str],
) -> GateDecision:
    """The card's record of a decision (promoted, reason) on ``report`` against ``baseline``."""
    promoted, reason = verdict
    return GateDecision(
        alias=alias,
        baseline=baseline,
        baseline_bits_per_byte=baseline_bits_per_byte,
        candidate_bits_per_byte=report.bits_per_byte,
        tolerance=tolerance,
        promoted=promoted,
        reason=reason,
        metric=metric,
        candidate_value=_figures(report, metric)[0],
        baseline_value=baseline_value,
    )


def _recorded_figure(
    store: Store, entry: str, report: EvalReport, evaluation: dict[str, Any] | None, metric: str = DEFAULT_GATE_METRIC
) -> float | None:
    """The ``metric`` that ``entry``'s card records, if it was measured on what ``report`` was, else None.

    Bits per byte: the same dataset version, the same row settings (``ROW_SETTINGS`` of the
    evaluation section) and as many tokens. An lm-eval figure: the same examples, i.e. the digest
    of the task's JSONL in the entry's evaluation.json equals the report's."""
    card = read_card(store, entry)
    figure = card.metrics.get(metric)
    if not isinstance(figure, int | float):
        return None
    if metric != DEFAULT_GATE_METRIC:
        task = metric.split(".")[1]
        try:
            recorded = store.get_json(f"{entry}/{ENTRY_EVALUATION}").get("lm_eval_examples", {})
        except (StoreError, ValueError):
            return None
        same = bool(report.lm_eval_examples.get(task)) and recorded.get(task) == report.lm_eval_examples.get(task)
        return float(figure) if same else None
    if not isinstance(evaluation, dict) or any(evaluation.get(k) is None for k in ROW_SETTINGS):
        return None
    theirs = card.config.get("evaluation") or {}
    same_rows = (
        card.lineage.dataset_version == report.checkpoint.dataset.version
        and all(theirs.get(k) == evaluation[k] for k in ROW_SETTINGS)
        and card.metrics.get("val_tokens") == report.tokens_evaluated
    )
    return float(figure) if same_rows and figure >= 0 else None


def gate_for_holder(
    store: Store,
    name: str,
    report: EvalReport,
    alias: str,
    tolerance: float,
    holder: int | None,
    evaluation: dict[str, Any] | None,
    metric: str = DEFAULT_GATE_METRIC,
) -> GateDecision:
    """The gate's decision for ``report`` against ``holder`` (the version holding ``alias`` now).

    The holder the evaluation compared with: its figures (``gate``). Another one (the alias
    moved during the evaluation): its recorded ``metric`` if it was measured on the same validation
    rows or lm-eval examples (``evaluation``: the candidate's evaluation section), else the alias is kept."""
    entry = model_prefix(name, holder) if holder is not None else ""
    if entry == report.baseline:
        return gate(report, alias, tolerance, metric)
    then = report.baseline or "no model"
    candidate = _figures(report, metric)[0]
    if not entry:
        promoted, reason = True, f"holder changed during evaluation ({then} then, none now): the candidate takes it"
        figure = None
    else:
        figure = _recorded_figure(store, entry, report, evaluation, metric)
        if figure is None:
            promoted = False
            reason = (
                f"holder changed during evaluation: alias kept, re-run to compare ({entry} holds {alias} now, "
                f"the evaluation compared with {then}; {entry}'s recorded figures are not on the same validation rows)"
            )
        else:
            promoted, decided = gate_decision(candidate, entry, figure, tolerance, metric)
            reason = f"holder changed during evaluation ({then} then, {entry} now; its recorded figures, same rows): {decided}"
    theirs_bpb = figure if metric == DEFAULT_GATE_METRIC else None
    return _decision(report, alias, tolerance, metric, entry, figure, theirs_bpb, (promoted, reason))
