"""Held-out evaluation, with its results as a Deck (the training curves are the train task's)."""

from __future__ import annotations

from html import escape

from flytekit import Cache, Deck, task

from common.contracts import CheckpointRef, EvalReport
from common.stages import mark_stage
from evaluation.config import EvalConfig
from reports.deck_html import table
from storage import open_store
from tasks import decks
from tasks.caching import cache_version
from tasks.placement import evaluate_task
from tasks.user_errors import as_messages
from training.config import ModelConfig

VERSION = cache_version(__name__)


@task(
    # The same checkpoint was judged already: a rerun must not re-score it against the model
    # its own first run registered (and so register a twin version).
    cache=Cache(version=VERSION, serialize=True, ignored_inputs=("baseline",)),
    enable_deck=True,
    deck_fields=decks.FIELDS,
    **evaluate_task(),
)
@as_messages
def evaluate_model(checkpoint: CheckpointRef, model: ModelConfig, eval_cfg: EvalConfig, baseline: str) -> EvalReport:
    """Validation loss, perplexity, bits per byte, lm-evaluation-harness figures and samples of the
    trained checkpoint, and the ``baseline`` registry entry's bits per byte on the same rows and
    lm-eval figures on the same examples (for the quality gate)."""
    mark_stage("evaluate")
    from evaluation.evaluate import evaluate  # here, not at the top: torch and megatron-core load when a model is scored

    report = evaluate(checkpoint, model, eval_cfg, baseline)
    store = open_store(checkpoint.store)
    summary = {"val_loss": report.val_loss, "perplexity": report.perplexity, "bits_per_byte": report.bits_per_byte}
    summary["tokens"] = report.tokens_evaluated
    summary["results and Hugging Face export"] = store.url(report.outputs)
    if report.baseline:
        summary[f"baseline {report.baseline} bits_per_byte"] = report.baseline_bits_per_byte
    summary |= report.lm_eval  # lm-evaluation-harness figures, lm_eval.<task>.<metric>
    if report.baseline:
        summary |= {f"baseline {report.baseline} {k}": v for k, v in report.baseline_lm_eval.items()}
    sample = f"<h3>Greedy</h3><pre>{escape(report.sample)}</pre><h3>Sampled</h3><pre>{escape(report.sampled)}</pre>"
    Deck("Evaluation", table(summary | checkpoint.summary, "Evaluation") + sample)
    return report
