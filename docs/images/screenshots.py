"""The screenshots under docs/images/, taken from a finished run with headless Chromium (Playwright).

    python docs/images/screenshots.py --run RUN_ID --mlflow-run MLFLOW_RUN_ID [--store STORE]

RUN_ID and MLFLOW_RUN_ID are the ones a run's summary prints (``pretrain runs show RUN_ID``, ``pretrain ui
--run MLFLOW_RUN_ID``). It writes ``pretrain runs report``'s page, starts ``pretrain ui`` on a free port
(signing in with the password it keeps for you), and saves:

* ``mlflow-run.png``: the run's page in the MLflow UI;
* ``loss-chart.png``: the report's training curves (loss with its held-out points);
* ``step-time.png``: the report's step time (phase table, every rank).

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


def start_ui(port: int, mlflow_run: str) -> tuple[subprocess.Popen, str, str]:
    """``pretrain ui`` in its own session; its run page's URL and the password file it names."""
    ui = subprocess.Popen(
        [str(PRETRAIN), "ui", "--port", str(port), "--run", mlflow_run],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    url = password_file = ""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (url and password_file):
        line = ui.stdout.readline()
        if not line:
            raise SystemExit(f"pretrain ui exited with status {ui.wait()}")
        words = line.split()
        url = next((w for w in words if w.startswith("http://") and mlflow_run in w), url)
        password_file = next((w for w in words if w.endswith("/password")), password_file)
    if not url:
        raise SystemExit("pretrain ui printed no page for the run")
    return ui, url, password_file


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
        ui, url, password_file = start_ui(free_port(), args.mlflow_run)
        try:
            password = Path(password_file).read_text().strip()
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"))
                page = browser.new_page(
                    viewport={"width": 1400, "height": 900}, http_credentials={"username": "pretrain", "password": password}
                )
                page.goto(url)  # the UI polls: the network never idles, so wait for the run's metrics table
                page.get_by_text("Metrics", exact=False).first.wait_for(timeout=90_000)
                page.wait_for_timeout(5000)  # its tables fill in after their requests
                close = page.get_by_role("button", name="Close")  # MLflow's assistant panel, when it opens itself
                if close.count():
                    close.first.click()
                    page.wait_for_timeout(1000)
                page.screenshot(path=str(out / "mlflow-run.png"))
                page.goto(report.as_uri())
                for heading, name in (("Training curves", "loss-chart.png"), ("Step time", "step-time.png")):
                    page.locator("section", has=page.locator("h2", has_text=heading)).screenshot(path=str(out / name))
                browser.close()
        finally:
            os.killpg(ui.pid, signal.SIGTERM)
            ui.wait(timeout=60)
    print(f"screenshots in {out}: mlflow-run.png, loss-chart.png, step-time.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
