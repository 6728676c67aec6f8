"""The tiny pipeline against a real ``mlflow server`` on 127.0.0.1, read back through MLflow's REST
API only, with the server killed mid-training: training goes on, the pipeline exits 0 with one
WARNING, and once the server is back (restarted on the same port and database while ``track_run``
retries) the run's loss history has exactly one point per step with the values of metrics.jsonl,
its params hold the config, its tags the lineage, and the registered version holds the registry's
aliases (``production``, ``latest`` as ``latest-registered``).

One pipeline for both of the issue's server tests (a whole pipeline costs minutes on two cores): the
steps before the outage arrive live, the rest through the replay, and the assertions are those of a
run that saw no outage at all."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from storage import open_store
from tests.helpers import BIN, ROOT, MlflowServer, run_metrics, training_run_of, write_config
from tracking.client import TRAIN_LOSS

pytestmark = pytest.mark.slow
EXPERIMENT = "e2e"


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "mlflow"
    root.mkdir()
    server = MlflowServer(root)
    try:
        yield server.start()
    finally:
        server.stop()


def pipeline_env(tmp_path: Path, server: MlflowServer) -> dict[str, str]:
    # A private HOME (flytekit's cache); the server overrides the session's SQLite database.
    return {**os.environ, "HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1", "MLFLOW_TRACKING_URI": server.url}


def check_history(server: MlflowServer, run_id: str, store, training_run: str) -> list[dict]:
    """The run's loss history against metrics.jsonl: one point per step, the same values."""
    expected = run_metrics(store, training_run)
    history = sorted(server.metric_history(run_id, TRAIN_LOSS), key=lambda m: m["step"])
    assert [int(m["step"]) for m in history] == [r["step"] for r in expected]
    assert [m["value"] for m in history] == [r["loss"] for r in expected]
    return history


class Output:
    """A process's merged output, read line by line in a thread, waited on by content."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self.thread.start()

    def _read(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()

    def wait_for(self, text: str, timeout: float) -> str:
        with self.changed:
            found = self.changed.wait_for(lambda: next((line for line in self.lines if text in line), None), timeout)
        assert found, f"no line with {text!r} within {timeout:g} s:\n{''.join(self.lines)[-4000:]}"
        return found


def check_run_and_registry(server: MlflowServer, run_id: str, store, card: dict) -> str:
    """Params, tags and figures of the run; the registered version and its aliases. Returns them in words."""
    mlflow_run = server.run_of(EXPERIMENT, "pretrain.model", "gpt-e2e:1")
    assert mlflow_run["info"]["run_id"] == run_id and mlflow_run["info"]["status"] == "FINISHED"  # one run, no twin
    params = {p["key"]: p["value"] for p in mlflow_run["data"]["params"]}
    assert params["train.lr"] == "0.002" and params["train.steps"] == str(card["config"]["train"]["steps"])
    assert params["registry.model_name"] == "gpt-e2e"
    tags = {t["key"]: t["value"] for t in mlflow_run["data"]["tags"]}
    assert tags["pretrain.dataset_version"] == card["lineage"]["dataset_version"]
    assert tags["pretrain.tokenizer_sha256"] == card["lineage"]["tokenizer_sha256"]
    assert tags["pretrain.run_prefix"] == card["lineage"]["training_run"] and tags["pretrain.execution"].startswith("local-")
    metrics = {m["key"]: m["value"] for m in mlflow_run["data"]["metrics"]}
    assert metrics["val_loss"] == card["metrics"]["val_loss"] and metrics["bits_per_byte"] == card["metrics"]["bits_per_byte"]

    production = server.get("registered-models/alias", name="gpt-e2e", alias="production")["model_version"]
    version_tags = {t["key"]: t["value"] for t in production["tags"]}
    assert version_tags["pretrain.version"] == "1" and version_tags["pretrain.aliases"] == "latest,production"
    assert version_tags["pretrain.card"] == "models/gpt-e2e/1/card.json" and version_tags["pretrain.store"] == store.uri
    aliases = server.get("registered-models/get", name="gpt-e2e")["registered_model"]["aliases"]
    pairs = sorted((a["alias"], a["version"]) for a in aliases)
    assert pairs == [("latest-registered", production["version"]), ("production", production["version"])]
    return f"gpt-e2e MLflow version {production['version']} (ours {version_tags['pretrain.version']}) aliases {pairs}"


@pytest.mark.long("a whole pipeline of 80 steps around a real MLflow server stopped and restarted")
def test_pipeline_in_a_real_mlflow_server_down_mid_training_then_back(server, tmp_path):
    steps = 80
    store_uri = str(tmp_path / "store")
    sections = {"train": {"steps": steps, "checkpoint_every": 40}, "tracking": {"experiment": EXPERIMENT, "retry_s": 600}}
    config = write_config(tmp_path / "tiny.yaml", store_uri, **sections)
    started = time.monotonic()
    process = subprocess.Popen(
        [str(BIN / "pretrain"), "run", "--config", str(config)],
        cwd=ROOT, env=pipeline_env(tmp_path, server), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    output = Output(process)
    try:
        # The first steps reach the server live; then it goes away with its workers.
        run_id = output.wait_for("is MLflow run", 600).split("is MLflow run ")[1].split()[0]
        deadline = time.monotonic() + 600
        while not server.metric_history(run_id, TRAIN_LOSS):
            assert time.monotonic() < deadline and process.poll() is None, "".join(output.lines)[-4000:]
            time.sleep(0.2)
        live = len(server.metric_history(run_id, TRAIN_LOSS))
        server.stop()
        killed_at = time.monotonic()
        assert not any(f"step {steps:>5}/{steps}" in line for line in output.lines), "training ended before the outage"

        # Training goes on; at its end the buffer is still unsent (one WARNING); the last task retries.
        warning = output.wait_for("WARNING: tracking:", 900)
        output.wait_for("retrying for up to", 900)
        restart = MlflowServer(server.root, server.port).start()  # same port, same database
        try:
            assert process.wait(timeout=900) == 0, "".join(output.lines)[-4000:]
            elapsed = time.monotonic() - started
            output.thread.join(timeout=30)
            text = "".join(output.lines)
            assert f"step {steps:>5}/{steps}" in text and "recorded as MLflow run " + run_id in text
            assert [line for line in output.lines if "WARNING: tracking" in line] == [warning], text[-4000:]
            assert f"not sent to MLflow at {server.url} within 5 s (" in warning

            store = open_store(store_uri)
            card = store.get_json("models/gpt-e2e/1/card.json")
            assert server.run_of(EXPERIMENT, "pretrain.model", "gpt-e2e:1")["info"]["run_id"] == run_id  # one run, no twin
            history = check_history(restart, run_id, store, training_run_of(store, card))
            assert len(history) == steps
            registered = check_run_and_registry(restart, run_id, store, card)
        finally:
            restart.stop()
        print(f"\noutage: server killed {killed_at - started:.0f} s in, after {live} live point(s); {warning.strip()}\n"
              f"pipeline exit 0 after {elapsed:.0f} s; REST: run {run_id} loss history {len(history)} points for "
              f"{steps} steps; {registered}")  # fmt: skip
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait()
