"""What the MLflow run of an execution holds besides its metrics: the loss chart (PNG, with the held-out
points), the run's report (its Decks as one self-contained page, ``reports.run_report``) and the dataset's
validation report, each rendered here from the store's records (never HTML read back from it) and each
bounded in size. ``tasks.track`` hands them to ``tracking.mirror.record_execution``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from common.contracts import ModelRef
from registry.card import read_card
from reports import charts, plotting
from reports.run_report import ReportPages, report_pages
from runs.catalog import RUNS
from runs.reading import load_run
from storage import Store

MAX_ARTIFACT_BYTES = 4 * 1024 * 1024
"""An artifact larger than this is left out (with a line saying so): the run's files stay small."""
LOSS_CHART = "charts/loss.png"
RUN_REPORT = "report.html"
VALIDATION_REPORT = "validation/report.html"


def _warn(line: str) -> None:
    print(f"WARNING: tracking: {line}", file=sys.stderr, flush=True)


def run_artifacts(store: Store, model: ModelRef) -> dict[str, bytes]:
    """The registered ``model``'s run files for MLflow (path → bytes). One that cannot be made, or is larger than
    MAX_ARTIFACT_BYTES, is left out with a WARNING line: a view is never worth the run's record."""
    try:
        lineage = read_card(store, model.prefix).lineage
    except Exception as e:
        _warn(f"no charts or reports in MLflow ({type(e).__name__}: {e})")
        return {}
    view, figures = None, None
    try:  # the run read once and its charts drawn once, for the loss chart and the report alike
        view = load_run(store, lineage.training_run.removeprefix(f"{RUNS}/"))
        figures = charts.run_charts(view)
    except Exception as e:
        _warn(f"no charts or run report in MLflow ({type(e).__name__}: {e})")
        view = None
    try:
        pages = report_pages(store, lineage.dataset_version, view, figures)
    except Exception as e:
        _warn(f"no run or validation report in MLflow ({type(e).__name__}: {e})")
        pages = ReportPages(None, None)
    makers: dict[str, Callable[[], bytes | None]] = {
        LOSS_CHART: lambda: plotting.png(figures.loss) if figures is not None and figures.loss is not None else None,
        RUN_REPORT: lambda: _encoded(pages.run),
        VALIDATION_REPORT: lambda: _encoded(pages.validation),
    }
    out = {}
    for name, make in makers.items():
        try:
            data = make()
        except Exception as e:
            _warn(f"no {name} in MLflow ({type(e).__name__}: {e})")
            continue
        if data is not None and len(data) > MAX_ARTIFACT_BYTES:
            _warn(f"{name} left out of MLflow: {len(data):,} bytes, over {MAX_ARTIFACT_BYTES:,}")
        elif data is not None:
            out[name] = data
    return out


def _encoded(text: str | None) -> bytes | None:
    return text.encode() if text is not None else None
