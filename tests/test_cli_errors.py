"""A user's mistake found inside a Flyte task reaches ``pretrain run`` as one line naming it,
with the path of a log file that holds the whole traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tracking.client import client

ROOT = Path(__file__).resolve().parent.parent
PRETRAIN = Path(sys.executable).parent / "pretrain"


@pytest.mark.slow
def test_an_error_inside_a_task_is_one_line_with_its_traceback_logged(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"tiny-{i}.txt").write_text(f"short {i}\n")  # every file below data.min_chars
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"data": {"sources": [str(corpus)], "workers": 1}}))
    env = {**os.environ, "HOME": str(tmp_path / "home"), "PRETRAIN_STORE": str(tmp_path / "store")}
    env.pop("XDG_STATE_HOME", None)
    env.pop("PRETRAIN_LOG_DIR", None)

    result = subprocess.run(
        [str(PRETRAIN), "run", "--config", str(config)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )

    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "too_short" in lines[-1], lines[-1]
    assert "Traceback" not in result.stderr
    log = Path(re.search(r"\(full traceback: (\S+)\)", lines[-1]).group(1))
    assert log.is_relative_to(tmp_path / "home" / ".local" / "state" / "pretrain" / "logs")
    text = log.read_text()
    assert "Traceback" in text and "data_prep/prepare.py" in text  # our frames, where the error was raised
    assert not list((tmp_path / "store").rglob("_COMMITTED"))

    # Issue 33: its MLflow run stayed RUNNING; the workflow's failure handler ends it FAILED, saying where and why.
    run_id = re.search(r"is MLflow run (\w+)", result.stdout).group(1)
    run = client(os.environ["MLFLOW_TRACKING_URI"]).get_run(run_id)
    assert run.info.status == "FAILED" and run.info.run_name == "gpt-tiny on corpus", (run.info, result.stderr[-2000:])
    assert run.data.tags["pretrain.failed_task"] == "prepare_mixture"  # the workflow's node: the data stage
    shown = lines[-1].removeprefix("error: ")  # what the CLI printed, up to the log's path
    assert run.data.tags["pretrain.error"].startswith(shown.split(" (full traceback")[0][:200]), (run.data.tags, shown)
