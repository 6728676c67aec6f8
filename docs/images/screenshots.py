"""The screenshots under docs/images/, taken from a finished run with headless Chromium (Playwright).

    python docs/images/screenshots.py --run RUN_ID --mlflow-run MLFLOW_RUN_ID [--store STORE]

RUN_ID and MLFLOW_RUN_ID are the ones a run's summary prints (``pretrain runs show RUN_ID``, ``pretrain ui
--run MLFLOW_RUN_ID``). It writes ``pretrain runs report``'s page, starts ``pretrain ui`` on a free port,
opens the sign-in link it prints (as a person would: no password), and saves:

* ``mlflow-run.png``: the run's page in the MLflow UI;
* ``report.png``: the top of the report page (contents, the run's figures, the loss chart);
* ``loss-chart.png``: the report's training curves (loss with its held-out and evaluation points);
* ``step-time.png``: the report's step time (phase table, every rank);
* ``validation.png``: the report's data validation table.

Needs Playwright (``pip install -e .[docs]``) and a Chromium (Debian's ``chromium`` package; set
``CHROMIUM`` to another binary). Not part of the tests: pictures are looked at, not asserted.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PRETRAIN = Path(sys.executable).with_name("pretrain")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ui(port: int, mlflow_run: str) -> tuple[subprocess.Popen, str]:
    """``pretrain ui`` in its own session, and the sign-in link it prints."""
    ui = subprocess.Popen(
        [str(PRETRAIN), "ui", "--port", str(port), "--run", mlflow_run],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    sign_in = ""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not sign_in:
        line = ui.stdout.readline()
        if not line:
            raise SystemExit(f"pretrain ui exited with status {ui.wait()}")
        sign_in = next((w for w in line.split() if w.startswith("http://") and "/login?token=" in w), "")
    if not sign_in:
        raise SystemExit("pretrain ui printed no sign-in link")
    return ui, sign_in


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", required=True)
    parser.add_argument("--mlflow-run", required=True)
    parser.add_argument("--store", default="")
    parser.add_argument("--out", default=str(HERE))
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    out = Path(args.out)
    store = ["--store", args.store] if args.store else []
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.html"
        subprocess.run([str(PRETRAIN), "runs", "report", args.run, "--out", str(report), *store], check=True)
        ui, sign_in = start_ui(free_port(), args.mlflow_run)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"))
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.goto(sign_in)  # signs in, then opens the run's page; the UI polls, so wait for its metrics table
                page.get_by_text("Metrics", exact=False).first.wait_for(timeout=90_000)
                page.wait_for_timeout(5000)  # its tables fill in after their requests
                close = page.get_by_role("button", name="Close")  # MLflow's assistant panel, when it opens itself
                if close.count():
                    close.first.click()
                    page.wait_for_timeout(1000)
                page.screenshot(path=str(out / "mlflow-run.png"))
                page.goto(report.as_uri())
                page.screenshot(path=str(out / "report.png"))
                sections = (
                    ("Training curves", "loss-chart.png"),
                    ("Step time", "step-time.png"),
                    ("Data validation", "validation.png"),
                )
                for heading, name in sections:
                    page.locator("section", has=page.locator("h2", has_text=heading)).screenshot(path=str(out / name))
                browser.close()
        finally:
            os.killpg(ui.pid, signal.SIGTERM)
            ui.wait(timeout=60)
    print(f"screenshots in {out}: mlflow-run.png, report.png, loss-chart.png, step-time.png, validation.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
