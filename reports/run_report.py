"""One training run as one self-contained HTML page (``pretrain runs report``; the tracking mirror uploads the
same page as an artifact): its figures, the train task's Decks (training curves with the validation points of
its evaluations, step time by phase and by rank, warnings) and, when its dataset is in the store, the
dataset's Deck and its validation report.

No external asset, no script, no Flyte: charts are inline SVG (``pipeline.charts``), every value is escaped,
and the validation report is rendered from its stored ``result.json`` (never HTML read back from the store,
which whoever can write there could have replaced).
"""

from __future__ import annotations

from common.contracts import VALIDATION_RESULT, dataset_prefix, validation_prefix
from data_prep.validation_report import Outcome, report_section
from pipeline.dataset_html import dataset_html
from pipeline.deck_html import num, page, table
from pipeline.run_html import run_sections
from storage import Store
from training.runs import catalog


def run_report_html(store: Store, run: str) -> str:
    """The report page of the run ``run`` names in ``store`` (its id, ``runs/<id>`` or a unique prefix of the
    id; ``catalog.RunNotFound`` otherwise)."""
    run_id = catalog.resolve_run(store, run)
    shown = catalog.show(store, run_id)
    sections = [("Run", _overview(shown)), *run_sections(store, run_id).items()]
    version = shown["dataset"]
    if version and store.is_committed(dataset_prefix(version)):
        sections.append(("Dataset", dataset_html(store, version)))
        validation = validation_prefix(dataset_prefix(version))
        if store.is_committed(validation):
            sections.append(("Data validation", validation_section(store, version)))
    return page(f"Training run {run_id}", sections)


def validation_page(store: Store, version: str) -> str | None:
    """The validation report of dataset ``version`` as its own page, rendered from the stored result (None when
    the dataset has no committed validation)."""
    if not store.is_committed(validation_prefix(dataset_prefix(version))):
        return None
    return page(f"Validation of dataset {version}", [("Data validation", validation_section(store, version))])


def validation_section(store: Store, version: str) -> str:
    """The stored ``result.json`` of dataset ``version``'s validation as the validation report shows it."""
    result = store.get_json(f"{validation_prefix(dataset_prefix(version))}/{VALIDATION_RESULT}")
    outcomes = [Outcome.from_record(o) for o in result.get("outcomes", [])]
    return report_section(outcomes, [str(m) for m in result.get("modified", [])])


def _overview(shown: dict) -> str:
    """The figures ``pretrain runs show`` starts with, and each committed evaluation's."""
    planned = shown["steps_planned"] if shown["steps_planned"] is not None else "?"
    rows: dict[str, object] = {
        "run": shown["id"],
        "where": shown["uri"],
        "steps": f"{shown['steps_done']}/{planned}",
        "layout": shown["layout"] or "-",
        "dataset": shown["dataset"] or "-",
        "loss": f"{num(shown['first_loss'], '.4f')} → {num(shown['final_loss'], '.4f')} "
        f"(mean of the last {shown['final_loss_steps']} applied steps)",
        "tokens/s (median)": num(shown["tokens_per_s"], ",.0f"),
        "MFU (median)": num(shown["mfu"], ".1%"),
        "peak memory (MiB)": num(shown["peak_memory_mib"], ",.0f"),
        "skipped steps": shown["skipped_steps"],
    }
    for e in shown["evaluations"]:
        rows[f"validation at step {e.get('step')}"] = (
            f"loss {num(e.get('val_loss'), '.4f')}, perplexity {num(e.get('perplexity'), '.1f')}, "
            f"bits/byte {num(e.get('bits_per_byte'), '.3f')}"
        )
    return table(rows, "figures")
