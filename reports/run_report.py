"""One training run as one self-contained HTML page (``pretrain runs report``; the tracking mirror uploads the
same page as an artifact), its contents first: its figures, the train task's Decks (training curves with the
held-out points of its training and its evaluations', step time by phase and by rank, warnings) and, when its
dataset is in the store, the dataset's Deck and its validation report.

No external asset, no script, no Flyte: charts are inline SVG (``reports.charts``), every value is escaped,
and the validation report is rendered from its stored ``result.json`` (never HTML read back from the store,
which whoever can write there could have replaced).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.contracts import VALIDATION_RESULT, dataset_prefix, validation_prefix
from data_prep.validation_report import Outcome, report_section
from reports.charts import Curve, RunCharts, heldout_label
from reports.dataset_html import dataset_html
from reports.deck_html import num, page, table
from reports.run_html import run_sections
from runs.view import RunView
from storage import Store


@dataclass(frozen=True)
class ReportPages:
    """A run's report page and its dataset's validation report as a page of its own."""

    run: str | None
    """The run's page (None: no view of the run was given)."""
    validation: str | None
    """The validation report of the run's dataset (None: the dataset has no committed validation)."""


def report_pages(store: Store, version: str, view: RunView | None = None, figures: RunCharts | None = None) -> ReportPages:
    """The report page of the run ``view`` shows (with its charts, ``figures``) and the validation report of its
    dataset ``version`` as a page of its own; the validation section is rendered once for both, the dataset's
    sections come from ``store`` when it holds the dataset."""
    validation = None
    if version and store.is_committed(validation_prefix(dataset_prefix(version))):
        validation = validation_section(store, version)
    run_page = None
    if view is not None and figures is not None:
        sections = [("Run", _overview(view)), *run_sections(view, figures).items()]
        if version and store.is_committed(dataset_prefix(version)):
            sections.append(("Dataset", dataset_html(store, version)))
            if validation is not None:
                sections.append(("Data validation", validation))
        run_page = page(f"Training run {view.name} ({view.id})" if view.name else f"Training run {view.id}", sections)
    own_page = page(f"Validation of dataset {version}", [("Data validation", validation)]) if validation is not None else None
    return ReportPages(run_page, own_page)


def validation_section(store: Store, version: str) -> str:
    """The stored ``result.json`` of dataset ``version``'s validation as the validation report shows it."""
    result = store.get_json(f"{validation_prefix(dataset_prefix(version))}/{VALIDATION_RESULT}")
    outcomes = [Outcome.from_record(o) for o in result.get("outcomes", [])]
    return report_section(outcomes, [str(m) for m in result.get("modified", [])])


def _overview(view: RunView) -> str:
    """The figures ``pretrain runs show`` starts with, and each committed evaluation's."""
    planned = view.steps_planned if view.steps_planned is not None else "?"
    rows: dict[str, object] = {
        "run": f"{view.name} ({view.id})" if view.name else view.id,
        "where": view.uri,
        "steps": f"{view.steps_done}/{planned}",
        "layout": view.layout or "-",
        "dataset": view.dataset or "-",
        "loss": f"{num(view.first_loss, '.4f')} → {num(view.final_loss, '.4f')} "
        f"(mean of the last {view.final_loss_steps} applied steps)",
        "tokens/s (median)": num(view.tokens_per_s, ",.0f"),
        "MFU (median)": num(view.mfu, ".1%"),
        "peak memory (MiB)": num(view.peak_memory_mib, ",.0f"),
        "skipped steps": view.skipped_steps,
    }
    if view.loss.heldout:
        step, loss = view.loss.heldout[-1]
        rows[heldout_label([Curve.of("", view.loss)])] = f"{num(loss, '.4f')} at step {step} (the latest)"
    for e in view.evaluations:
        rows[f"evaluation at step {e.get('step')}"] = (
            f"val_loss {num(e.get('val_loss'), '.4f')}, perplexity {num(e.get('perplexity'), '.1f')}, "
            f"bits/byte {num(e.get('bits_per_byte'), '.3f')}"
        )
    return table(rows, "figures")
