"""The MLflow mirror's parts against a real SQLite tracking database: the config as params, the
tracking URI's resolution, one point per step whichever path sends it, the live sender facing a
server that is down, the registry mirror's versions and aliases, and ``pretrain ui``'s refusal."""

from __future__ import annotations

import base64
import contextlib
import copy
import dataclasses
import email.message
import html
import json
import math
import os
import re
import signal
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from hashlib import sha256
from pathlib import Path

import psutil
import pytest

from cli.main import cmd_ui, main, parser
from common.contracts import metrics_key
from common.run_names import MAX_RUN_NAME, run_name
from pipeline.config import PipelineConfig
from registry.registry import promote, register
from storage import open_store
from tests.helpers import BIN, CKPT, DATASET, DATASET_VERSION, TOKENIZER_JSON, free_port, kill_group, registry_inputs, report
from tracking.client import (
    CLASSIC_ML,
    EXPERIMENT_KIND_TAG,
    FIGURE_STEP,
    HELDOUT_LOSS,
    RUNS_VIEW_ID,
    RUNS_VIEW_TAG,
    TRAIN_LOSS,
    client,
    experiment_id,
    failure,
    log_points,
    open_command,
    run_opener,
    runs_view,
    start_run,
    step_metrics,
    ui_path,
)
from tracking.feed import FeedWriter, relay
from tracking.mirror import mirror_promotion, record_execution
from tracking.params import MAX_PARAM_VALUE, batches, flatten
from tracking.sender import SYSTEM_METRICS_S, LiveSender
from tracking.ui import Pages, ui_pages
from tracking.uri import resolve_uri


def test_flatten_names_every_setting_once():
    config = dataclasses.asdict(PipelineConfig())
    params = flatten(config)
    assert params["train.lr"] == "0.002" and params["model.num_layers"] == "4" and params["tracking.enabled"] == "true"
    assert params["data.sources"] == '["python-stdlib"]' and params["store"] == ""

    def leaves(value) -> int:  # nested sections (data.quality.gopher...) flatten to their leaves
        return sum(map(leaves, value.values())) if isinstance(value, dict) and value else 1

    assert len(params) == leaves(config)
    assert params["data.quality.repetition.enabled"] == "true" and params["data.pii.email"] == "redact"
    chunks = list(batches(params, size=10))
    # A last, shorter batch only when the count is not a multiple of 10 (data.partitions made it 130).
    assert [len(c) for c in chunks] == [10] * (len(params) // 10) + ([len(params) % 10] if len(params) % 10 else [])
    assert {k: v for c in chunks for k, v in c.items()} == params
    long = flatten({"data": {"sources": ["x" * 10_000]}})["data.sources"]
    assert len(long) == MAX_PARAM_VALUE and long.endswith("(truncated)")


def test_tracking_uri_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    assert resolve_uri("sqlite:////x/y.db") == "sqlite:////x/y.db"  # the config's setting wins
    assert resolve_uri("") == "http://mlflow.example:5000"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.setenv("PRETRAIN_STORE", str(tmp_path / "data" / "store"))
    assert resolve_uri("") == f"sqlite:///{tmp_path / 'data' / 'mlflow.db'}"  # beside the default store
    monkeypatch.setenv("PRETRAIN_STORE", "s3://bucket/store")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert resolve_uri("") == f"sqlite:///{tmp_path / 'xdg' / 'pretrain' / 'mlflow.db'}"


def records(steps: int) -> list[dict]:
    return [
        {"step": s, "loss": 5.0 / s, "lr": 1e-3 * s, "grad_norm": 0.5 + s, "tokens_per_s": 1000.0 + s, "mfu": None,
         "step_time_s": 0.1 * s, "time_data_s": 0.01, "time_forward_backward_s": 0.05, "peak_memory_mib": 300.0,
         "data_wait_fraction": 0.1, "peak_flops_source": "measured"}
        for s in range(1, steps + 1)
    ]  # fmt: skip


def fresh_run(uri: str) -> tuple[object, str]:
    mlflow = client(uri)
    exp = experiment_id(mlflow, f"test-{uuid.uuid4().hex[:8]}", uri)
    return mlflow, start_run(mlflow, exp, f"local-{uuid.uuid4().hex[:8]}", {"train": {"lr": 0.002}}, {})


def test_live_points_and_replays_give_one_point_per_step(mlflow_tracking_uri):
    mlflow, run_id = fresh_run(mlflow_tracking_uri)
    steps = records(7)
    sender = LiveSender(mlflow_tracking_uri, run_id, flush_s=60)
    for record in steps[:5]:  # the live path delivers the first five steps
        sender.send(record)
    assert sender.close() == 0 and sender.sent == 5
    for _ in range(2):  # the replay of metrics.jsonl, twice: every step, the first five again
        log_points(mlflow, run_id, [p for r in steps for p in step_metrics(r)])
    history = mlflow.get_metric_history(run_id, TRAIN_LOSS)
    assert sorted((m.step, m.value) for m in history) == [(r["step"], r["loss"]) for r in steps]
    assert len(mlflow.get_metric_history(run_id, "time_forward_backward_s")) == 7
    assert mlflow.get_run(run_id).data.params == {"train.lr": "0.002"}
    assert "mfu" not in mlflow.get_run(run_id).data.metrics  # unknown (None): not a point


def test_the_live_sender_samples_the_machine_into_the_runs_system_metrics(mlflow_tracking_uri):
    """Issue 51 item 4: the run page's "System metrics" tab was empty. The sender of the step records has MLflow
    sample this machine's use while training (every 10 s in the pipeline; 0.2 s here), from its first record on."""
    mlflow, run_id = fresh_run(mlflow_tracking_uri)
    assert SYSTEM_METRICS_S == 10.0
    sender = LiveSender(mlflow_tracking_uri, run_id, flush_s=60, system_metrics_s=0.2)
    time.sleep(0.6)
    assert not any(k.startswith("system/") for k in mlflow.get_run(run_id).data.metrics)  # no record yet: no samples
    sender.send(records(1)[0])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(mlflow.get_metric_history(run_id, "system/cpu_utilization_percentage")) < 2:
        time.sleep(0.2)
    assert sender.close() == 0
    steps = [m.step for m in mlflow.get_metric_history(run_id, "system/cpu_utilization_percentage")]
    assert steps[:2] == [0, 1], steps
    assert {"system/system_memory_usage_megabytes", "system/disk_usage_percentage"} <= set(mlflow.get_run(run_id).data.metrics)
    count = len(steps)
    time.sleep(0.6)  # stopped with the sender
    assert len(mlflow.get_metric_history(run_id, "system/cpu_utilization_percentage")) == count
    again = LiveSender(mlflow_tracking_uri, run_id, flush_s=60, system_metrics_s=0.2)  # a retried task: steps go on
    again.send(records(2)[1])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(mlflow.get_metric_history(run_id, "system/cpu_utilization_percentage")) <= count:
        time.sleep(0.2)
    assert again.close() == 0
    steps = sorted(m.step for m in mlflow.get_metric_history(run_id, "system/cpu_utilization_percentage"))
    assert steps == list(range(len(steps))), steps  # one point per step, no step twice


def test_rank_zeros_records_reach_mlflow_through_the_launchers_feed(mlflow_tracking_uri):
    """Rank 0 (a forked process here, as from the fork server) writes the feed; the launcher's relay sends
    every record, the last one written just before the ranks end included, then removes the feed file."""
    mlflow, run_id = fresh_run(mlflow_tracking_uri)
    steps = records(6)
    with relay(mlflow_tracking_uri, run_id, timeout_s=5, flush_s=60) as path:
        assert os.stat(path).st_mode & 0o077 == 0  # the feed file is this user's alone
        pid = os.fork()
        if pid == 0:  # rank 0: a record per step, the last with no pause before the end
            writer = FeedWriter(path)
            for record in steps:
                writer.send(record)
                time.sleep(0.05 if record["step"] < 6 else 0)
            writer.close()
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
    assert not os.path.exists(path)
    history = mlflow.get_metric_history(run_id, TRAIN_LOSS)
    assert sorted((m.step, m.value) for m in history) == [(r["step"], r["loss"]) for r in steps]


def test_a_feed_that_cannot_be_written_warns_once_and_never_fails_training(tmp_path):
    lines: list[str] = []
    gone = FeedWriter(str(tmp_path / "no-such-folder" / "feed.jsonl"), log=lines.append)
    gone.send(records(1)[0])  # nothing raised: training goes on
    assert gone.close() == 0 and len(lines) == 1 and "stopped at the start (FileNotFoundError" in lines[0], lines
    writer = FeedWriter(str(tmp_path / "feed.jsonl"), log=lines.append)
    writer.send(records(1)[0])
    writer.send({"step": 2, "loss": object()})  # a record that is not JSON: the feed ends there
    writer.send(records(3)[2])
    writer.close()
    assert len(lines) == 2 and "stopped at step 2 (TypeError" in lines[1] and "track_run" in lines[1], lines
    assert [json.loads(line)["step"] for line in (tmp_path / "feed.jsonl").read_text().splitlines()] == [1]


def test_live_sender_never_blocks_and_warns_once_with_the_count_when_down():
    lines: list[str] = []
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    sender = LiveSender(down, "0" * 32, timeout_s=1, flush_s=0.5, log=lines.append)
    started = time.monotonic()
    for record in records(40):
        sender.send(record)
    assert time.monotonic() - started < 0.5  # queued, not sent inline
    assert sender.close() == 40
    assert time.monotonic() - started < 10
    warnings = [line for line in lines if line.startswith("WARNING")]
    assert len(warnings) == 1 and "40 step record(s) not sent to MLflow at " + down in warnings[0], lines


def test_registry_mirror_follows_versions_and_aliases(tmp_path, mlflow_tracking_uri):
    store = registry_inputs(open_store(str(tmp_path / "store")))
    store.put_bytes(metrics_key("runs/r1"), "".join(json.dumps(r) + "\n" for r in records(10)).encode())
    name = f"gpt-{uuid.uuid4().hex[:6]}"
    first = register(store, name, report(2.0), gate_alias="production")
    second = register(store, name, report(2.5), gate_alias="production")  # worse: production stays on 1
    mlflow, run_id = fresh_run(mlflow_tracking_uri)
    exp = mlflow.get_run(run_id).info.experiment_id
    experiment = mlflow.get_experiment(exp).name
    for model in (first, second, second):  # the last one replayed: nothing doubles
        record_execution(mlflow, mlflow_tracking_uri, experiment, "exec-1", run_id, store, model, {"train": {"lr": 0.002}})
    versions = {mv.tags["pretrain.version"]: mv for mv in mlflow.search_model_versions(f"name = '{name}'")}
    assert sorted(versions) == ["1", "2"]
    assert versions["2"].tags["pretrain.card"] == f"{second.prefix}/card.json"  # a key of pretrain.store
    assert versions["2"].tags["pretrain.store"] == store.uri and versions["2"].tags["pretrain.checkpoint"] == CKPT
    assert versions["1"].tags["pretrain.dataset_version"] == DATASET_VERSION
    mlflow_of = {ours: mv.version for ours, mv in versions.items()}
    # MLflow reserves 'latest' (its highest version): ours is 'latest-registered' there, and every tag says ours.
    assert mlflow.get_registered_model(name).aliases == {"latest-registered": mlflow_of["2"], "production": mlflow_of["1"]}
    tags = {
        mv.tags["pretrain.version"]: mv.tags.get("pretrain.aliases") for mv in mlflow.search_model_versions(f"name = '{name}'")
    }
    assert tags == {"1": "production", "2": "latest"}
    assert len(mlflow.get_metric_history(run_id, TRAIN_LOSS)) == 10
    run = mlflow.get_run(run_id)
    assert run.data.tags["pretrain.run_prefix"] == "runs/r1"
    assert run.data.tags["pretrain.tokenizer_sha256"] == sha256(TOKENIZER_JSON).hexdigest()
    assert run.data.metrics["val_loss"] == 2.5 and run.info.status == "FINISHED"
    links = json.loads(Path(mlflow.download_artifacts(run_id, "links/store.json", str(tmp_path))).read_text())
    assert links["card"] == {"key": f"{second.prefix}/card.json", "url": store.url(f"{second.prefix}/card.json")}
    assert links["checkpoint"] == {"key": CKPT, "url": store.url(CKPT)} and links["store"] == store.uri

    # Moved outside the pipeline, and an alias MLflow has that the registry has not: mirrored, removed.
    promote(store, f"{name}:2", "production")
    mlflow.set_registered_model_alias(name, "stale", mlflow_of["1"])
    line = mirror_promotion(store, name, mlflow_tracking_uri)
    assert mlflow.get_registered_model(name).aliases == {"latest-registered": mlflow_of["2"], "production": mlflow_of["2"]}, line
    tags = {
        mv.tags["pretrain.version"]: mv.tags.get("pretrain.aliases") for mv in mlflow.search_model_versions(f"name = '{name}'")
    }
    assert tags == {"1": None, "2": "latest,production"}


def test_ui_refuses_a_remote_server_and_names_it(monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://mlflow.example.org")
    assert main(["ui", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "open https://mlflow.example.org in a browser" in err


def http(url: str, password: str | None = None, body: dict | None = None, raw: bytes | None = None) -> tuple[int, bytes]:
    """(status, body) of a GET (or a JSON POST of ``body``, or of the bytes ``raw``) as ``pretrain``'s browser would
    send it, with ``password``."""
    data = json.dumps(body).encode() if body is not None else raw
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if password is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"pretrain:{password}".encode()).decode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def browser_get(
    url: str, cookie: str = "", headers: dict[str, str] | None = None, method: str = "GET"
) -> tuple[int, email.message.Message, str]:
    """(status, headers, text) of a request as a browser sends it: no password, the session ``cookie`` if any."""
    sent = {**(headers or {}), **({"Cookie": cookie} if cookie else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=sent, method=method), timeout=30) as answer:
            return answer.status, answer.headers, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def check_sign_in(base: str, link: str, landing: str, api: str, port: int) -> None:
    """Issue 51 item 4: the link ``pretrain ui`` prints signs a browser in once (a session cookie the UI's own
    pages send instead of a password) and opens ``landing``; used again, it is refused with a page saying what to do."""
    status, _, text = browser_get(link, method="HEAD")  # a link preview's HEAD: refused, the token not spent
    assert status == 405, (status, text)
    status, headers, text = browser_get(link)
    assert status == 200, (status, text[:300])
    assert f'http-equiv="refresh" content="0; url={html.escape(landing)}"' in text, text  # then the page it leads to
    assert headers["Cache-Control"] == "no-store" and headers["Referrer-Policy"] == "no-referrer"
    cookie = headers["Set-Cookie"]
    assert cookie.startswith(f"pretrain-ui-{port}=") and "HttpOnly" in cookie and "SameSite=Strict" in cookie, cookie
    session = cookie.partition(";")[0]
    assert browser_get(f"{base}/")[0] == 401  # control: no session, no password
    status, _, page = browser_get(f"{base}/", session)  # the UI's page, signed in without a password
    assert status == 200 and "<html" in page.lower(), (status, page[:200])
    own = {"Sec-Fetch-Site": "same-origin", "Origin": base}
    status, _, found = browser_get(api, session, own)  # the UI's own request for a run, as its page sends it
    assert status == 200 and json.loads(found)["run"], (status, found[:200])
    native = f"{base}/ajax-api/3.0/mlflow/assistant/config"  # a FastAPI route: MLflow asks the same function
    assert browser_get(native, session, own)[0] == 200 and browser_get(native)[0] == 401
    # A page another local user serves on another port of 127.0.0.1 gets the cookie too (one site for SameSite).
    for headers in ({"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:1"}, {"Origin": "http://127.0.0.1:1"}):
        status, _, text = browser_get(api, session, headers)
        assert status == 401 and "open the link `pretrain ui` printed" in text, (headers, status, text[:200])
    status, _, text = browser_get(link, session)  # the same link again (a second browser, someone reading over a shoulder)
    assert status == 403 and "does not work any more" in text and "Run <code>pretrain ui</code> again" in text, text
    assert 'href="/">open the MLflow UI' in text  # this browser is signed in already
    assert browser_get(link)[0] == 403


def lines_until(process: subprocess.Popen, prefix: str, timeout_s: float) -> list[str]:
    """The lines ``process`` prints up to the first that starts with ``prefix``, within ``timeout_s`` (else the
    test fails, rather than waiting for a line that never comes)."""
    lines: list[str] = []
    done = threading.Event()

    def read() -> None:
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith(prefix):
                break
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(timeout_s) and lines and lines[-1].startswith(prefix), lines
    return lines


@pytest.mark.slow
def test_ui_serves_the_tracking_database_to_its_user_only_and_stops_with_its_workers(mlflow_tracking_uri, tmp_path):
    """Issue 32 item 3: ``pretrain ui`` ran ``mlflow server`` with no authentication, and another local user
    made an experiment whose artifacts were the owner's home, then read ``~/.aws/credentials`` through
    ``/get-artifact``. Now every request needs the password in a file only the owner can read (or a session of
    a browser that signed in with the link it prints), and an artifact read must name a file inside the
    tracking root (links resolved). Issue 51 item 4: the password had to be copied from a file into the
    browser's prompt; now the printed link signs in, once (``check_sign_in``)."""
    mlflow = client(mlflow_tracking_uri)
    name = f"ui-{uuid.uuid4().hex[:8]}"
    exp = experiment_id(mlflow, name, mlflow_tracking_uri)
    opened = mlflow.create_run(exp).info.run_id
    folder = Path(mlflow_tracking_uri.removeprefix("sqlite:///")).parent
    victim = tmp_path / "victim"
    (victim / ".aws").mkdir(parents=True)
    (victim / ".aws" / "credentials").write_text("aws_secret_access_key = the-victims-secret\n")
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [str(BIN / "pretrain"), "ui", "--port", str(port), "--run", opened], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        announced, *lines = lines_until(process, "  server log: ", timeout_s=180)  # once the server answers
        assert announced == f"MLflow UI: http://127.0.0.1:{port} over {mlflow_tracking_uri} (Ctrl-C stops it)", announced
        link = re.fullmatch(r"  open \(signs this browser in; works once, within 10 minutes\): (\S+)", lines[0])[1]
        assert re.fullmatch(rf"http://127\.0\.0\.1:{port}/login\?token=[\w-]{{40,}}", link), link
        assert urllib.parse.urlsplit(link).password is None and "@" not in link  # no credentials in an address
        run_page = f"/#/experiments/{exp}/runs/{opened}?workflowType=machine_learning"  # --run: the link opens it
        assert f"  run {opened}: http://127.0.0.1:{port}{run_page}" in lines, lines
        password_file = folder / "ui" / "password"
        password = password_file.read_text().strip()
        assert len(password) >= 32 and not any(password in line for line in [announced, *lines])
        assert f"  scripts and API clients: user 'pretrain', password in {password_file} (readable by you only)" in lines
        for path, mode in [
            (folder / "ui", 0o700),
            (password_file, 0o600),
            (folder / "ui" / "auth.ini", 0o600),
            (folder / "ui" / "auth.db", 0o600),
            (folder / "ui" / "sign-in", 0o700),
        ]:
            assert stat.S_IMODE(path.stat().st_mode) == mode, (path, oct(path.stat().st_mode))
        pages = [line for line in lines if line.startswith(("  runs of experiment 'pretrain'", "  no experiment 'pretrain'"))]
        assert len(pages) == 1 and (
            pages[0].startswith("  no experiment 'pretrain' yet")
            or re.fullmatch(
                rf"  runs of experiment 'pretrain': http://127\.0\.0\.1:{port}/#/experiments/\d+/runs"
                r"\?viewStateShareKey=pretrain-v1&workflowType=machine_learning",
                pages[0],
            )
        ), pages
        # An experiment of before (no kind: MLflow 3 opens it on its GenAI view) is tagged, its runs' page named.
        before = mlflow.create_experiment(f"{name}-before")
        run_id = mlflow.create_run(before).info.run_id
        assert ui_pages(port, password, f"{name}-before", run_id) == Pages(
            [
                f"  runs of experiment '{name}-before': http://127.0.0.1:{port}/#/experiments/{before}/runs"
                "?viewStateShareKey=pretrain-v1&workflowType=machine_learning",
                f"  run {run_id}: http://127.0.0.1:{port}/#/experiments/{before}/runs/{run_id}?workflowType=machine_learning",
            ],
            f"/#/experiments/{before}/runs/{run_id}?workflowType=machine_learning",
        )
        tags = mlflow.get_experiment(before).tags
        assert tags[EXPERIMENT_KIND_TAG] == CLASSIC_ML and tags[RUNS_VIEW_TAG] == runs_view()
        base, api = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/api/2.0/mlflow"
        check_sign_in(base, link, run_page, f"{base}/ajax-api/2.0/mlflow/runs/get?run_id={opened}", port)

        search = f"{api}/experiments/get-by-name?experiment_name={name}"
        for who in (None, "wrong-password"):  # another local user: no password, or a guess
            assert http(search, who)[0] == 401, who
            assert http(f"{api}/experiments/create", who, {"name": "x", "artifact_location": victim.as_uri()})[0] == 401, who
        status, found = http(search, password)
        assert status == 200 and json.loads(found)["experiment"]["name"] == name

        # The owner's own browser: a run whose artifacts are outside the root, and a link out of the root.
        def run_in(artifact_location: str) -> tuple[str, Path]:
            body = {"name": f"{name}-{uuid.uuid4().hex[:6]}", "artifact_location": artifact_location}
            status, created = http(f"{api}/experiments/create", password, body)
            assert status == 200, created
            status, run = http(f"{api}/runs/create", password, {"experiment_id": json.loads(created)["experiment_id"]})
            info = json.loads(run)["run"]["info"]
            return info["run_id"], Path(info["artifact_uri"].removeprefix("file://"))

        outside_run, outside = run_in(victim.as_uri())
        outside.mkdir(parents=True)
        (outside / "id_ed25519").write_text("the victim's key")  # a folder of the victim's, listed as artifacts
        inside_run, artifacts = run_in((folder / "mlflow-artifacts" / name).as_uri())
        artifacts.mkdir(parents=True)
        (artifacts / "store.json").write_text('{"store": "here"}')
        (artifacts / "leak").symlink_to(victim / ".aws" / "credentials")
        artifact = f"{base}/get-artifact?run_id={{}}&path={{}}"
        assert http(artifact.format(inside_run, "store.json"), password) == (200, b'{"store": "here"}')  # control
        assert http(artifact.format(inside_run, "store.json"), None)[0] == 401
        for run_id, path in [(outside_run, ".aws/credentials"), (inside_run, "leak")]:
            status, body = http(artifact.format(run_id, path), password)
            assert status == 403 and b"outside the tracking root" in body, (run_id, path, status, body[:200])
        status, listed = http(f"{api}/artifacts/list?run_id={outside_run}", password)
        assert status == 403 and b"outside the tracking root" in listed, (status, listed[:200])
        # Issue 50 finding 9: GraphQL's mlflowListArtifacts listed the victim's folders past the REST check.
        arguments = json.dumps({"runId": outside_run, "path": ""}).replace('"runId"', "runId").replace('"path"', "path")
        listing = json.dumps({"query": "query { mlflowListArtifacts(input: " + arguments + ") { files { path } } }"})
        for body in (listing, listing.replace("mlflowList", "\\u006dlflowList")):  # the name as a JSON escape too
            status, answer = http(f"{base}/graphql", password, raw=body.encode())
            assert status == 403 and b"through its REST route only" in answer, (body, status, answer[:300])
        get_run = "query { mlflowGetRun(input: {runId: " + json.dumps(inside_run) + "}) { run { info { runId } } } }"
        status, answer = http(f"{base}/graphql", password, {"query": get_run})  # control: the UI's own GraphQL works
        assert status == 200 and json.loads(answer)["data"]["mlflowGetRun"]["run"]["info"]["runId"] == inside_run, answer
        for route in (
            "model-versions/get-artifact?name=m&version=1&path=x",
            "ajax-api/2.0/mlflow/get-trace-artifact?request_id=t",
        ):
            status, body = http(f"{base}/{route}", password)  # artifact routes the pipeline has no use for
            assert status == 403 and b"serves run artifacts only" in body, (route, status, body[:200])
        status, body = http(f"{base}/api/2.0/mlflow-artifacts/artifacts/x", password)  # no proxied artifact store
        assert status == 503 and b"Artifact serving is disabled" in body, (status, body[:200])

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        with pytest.raises(OSError):  # its workers went with it
            urllib.request.urlopen(f"{base}/health", timeout=5)
    finally:
        if process.poll() is None:  # a failed assertion: the server has a session of its own, stop it too
            servers = psutil.Process(process.pid).children()
            kill_group(process)
            for server in servers:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.pid, signal.SIGKILL)


def test_tracking_sync_replays_a_registered_model_once(tmp_path, mlflow_tracking_uri, capsys):
    store = registry_inputs(open_store(str(tmp_path / "store")))
    store.put_bytes(metrics_key("runs/r1"), "".join(json.dumps(r) + "\n" for r in records(6)).encode())
    name = f"gpt-{uuid.uuid4().hex[:6]}"
    register(store, name, report(2.0), config={"train": {"lr": 0.002}}, gate_alias="production")
    experiment = f"sync-{uuid.uuid4().hex[:6]}"
    command = ["tracking", "sync", f"{name}:production", "--store", store.uri, "--experiment", experiment]
    assert main(command) == 0 and main(command) == 0  # the second finds the run by its model tag
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0] == lines[1] and lines[0].startswith(f"{name}:1 recorded in MLflow run ")
    mlflow = client(mlflow_tracking_uri)
    (run,) = mlflow.search_runs([mlflow.get_experiment_by_name(experiment).experiment_id])
    assert len(mlflow.get_metric_history(run.info.run_id, TRAIN_LOSS)) == 6 and run.data.params == {"train.lr": "0.002"}
    assert run.info.run_name == name  # named as the pipeline names runs: lr 0.002 is the default's
    assert mlflow.get_registered_model(name).aliases == {"latest-registered": 1, "production": 1}


# ----------------------------------------------------------------------------------------------
# Issue 33: MLflow shows at least what the CLI shows


def test_run_names_say_what_differs_from_the_defaults():
    defaults = dataclasses.asdict(PipelineConfig())
    assert run_name(defaults, defaults) == "gpt-tiny on python-stdlib"  # the data, always (issue 51)
    config = copy.deepcopy(defaults)
    config["train"]["lr"], config["registry"]["model_name"] = 0.001, "gpt-small"
    config["store"], config["data"]["sources"], config["train"]["log_every"] = "/elsewhere", ["/data/corpus/"], 5  # not named
    assert run_name(config, defaults) == "gpt-small on corpus lr=0.001"
    config["model"]["num_layers"], config["parallel"]["tensor_parallel"], config["train"]["init_from"] = 8, 1, "gpt-tiny:3"
    assert run_name(config, defaults) == "gpt-small on corpus layers=8 from=gpt-tiny:3 lr=0.001 tp=1"  # size, optimiser, layout
    config["data"]["sources"] = ["s3://bucket/wiki/*.jsonl.gz", "/a/b.parquet", "python-stdlib", "/c/", "/d"]
    assert run_name(config, defaults).startswith("gpt-small on wiki+b+python-stdlib+2 layers=8")  # the first three, counted
    config["data"]["mixture"] = [{"name": "code", "sources": ["/x"], "weight": 3.0}, {"name": "docs", "sources": ["/y"]}]
    assert run_name(config, defaults).startswith("gpt-small on code+docs layers=8")  # a mixture by its components
    config["train"]["init_from"] = "x" * 200
    named = run_name(config, defaults)
    assert len(named) <= MAX_RUN_NAME and named == "gpt-small on code+docs layers=8 +3", named  # bounded, saying how many more


def test_failure_names_the_task_and_the_error_as_the_cli_does():
    nested = (
        "Error encountered while executing 'tasks.data.prepare_data':\n  Error encountered while executing "
        "'tasks.data.resolve_documents':\n  every file is too_short\n  at https://alice:s3cret@example.com/x\n"
        "(full traceback: /home/u/.local/state/pretrain/logs/x.log)"
    )
    task, line = failure(nested, "fn0")
    assert task == "prepare_data" and line.startswith("resolve_documents: every file is too_short at https://***@example.com")
    assert "s3cret" not in line and "\n" not in line  # credentials out, one line
    assert line.endswith("(full traceback: /home/u/.local/state/pretrain/logs/x.log)")
    assert failure("USER:ValueError: error=boom " + "x" * 900, "n6") == ("n6", ("boom " + "x" * 900)[:499] + "…")
    assert len(failure("x" * 900)[1]) == 500 and failure("")[0] == "unknown"


def test_experiments_open_on_training_runs(mlflow_tracking_uri):
    """MLflow 3 opens an experiment without a kind on its GenAI view (traces): ours say they hold training runs.
    Issue 51 item 4: its runs table showed no metric and its charts the two losses apart; ours carry a saved view
    (MLflow 3.17's "saved views", experiment tags its UI lists and opens by ``viewStateShareKey``) with the metric
    columns and the training and held-out loss on one chart."""
    mlflow = client(mlflow_tracking_uri)
    made = experiment_id(mlflow, f"kind-{uuid.uuid4().hex[:8]}", mlflow_tracking_uri)
    assert mlflow.get_experiment(made).tags[EXPERIMENT_KIND_TAG] == CLASSIC_ML
    assert mlflow.get_experiment(made).tags[RUNS_VIEW_TAG] == runs_view()
    before = mlflow.create_experiment(f"kind-{uuid.uuid4().hex[:8]}")  # made by an earlier release: no kind
    assert experiment_id(mlflow, mlflow.get_experiment(before).name, mlflow_tracking_uri) == before
    assert mlflow.get_experiment(before).tags[EXPERIMENT_KIND_TAG] == CLASSIC_ML
    assert mlflow.get_experiment(before).tags[RUNS_VIEW_TAG] == runs_view()
    chosen = mlflow.create_experiment(f"kind-{uuid.uuid4().hex[:8]}", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    mlflow.set_experiment_tag(chosen, RUNS_VIEW_TAG, "edited in the UI")
    experiment_id(mlflow, mlflow.get_experiment(chosen).name, mlflow_tracking_uri)
    assert mlflow.get_experiment(chosen).tags[EXPERIMENT_KIND_TAG] == "genai_development"  # a person's choice stays
    assert mlflow.get_experiment(chosen).tags[RUNS_VIEW_TAG] == "edited in the UI"  # and so does their view
    view = "workflowType=machine_learning"  # MLflow 3's UI opens on its GenAI view otherwise
    assert ui_path("7") == f"#/experiments/7/runs?{view}" and ui_path("7", "ab12") == f"#/experiments/7/runs/ab12?{view}"
    assert ui_path("7", view=RUNS_VIEW_ID) == f"#/experiments/7/runs?viewStateShareKey={RUNS_VIEW_ID}&{view}"

    # The view as MLflow's UI reads one (mlflow/server/js, module 53787): an envelope whose state is JSON.
    envelope = json.loads(runs_view())
    assert set(envelope) == {"name", "createdAt", "updatedAt", "state"} and len(runs_view()) <= 20000
    assert isinstance(envelope["name"], str) and isinstance(envelope["createdAt"], int)
    state = json.loads(envelope["state"])
    assert state["selectedColumns"] == [
        "metrics.`loss/train`",
        "metrics.`val_loss`",
        "metrics.`bits_per_byte`",
        "metrics.`tokens_per_s`",
    ]
    charts = {chart["uuid"]: chart for chart in state["compareRunCharts"]}
    both = charts["pretrain-loss-train-heldout"]
    assert both["type"] == "LINE" and both["selectedMetricKeys"] == [TRAIN_LOSS, HELDOUT_LOSS] and not both["deleted"]
    assert charts["pretrain-loss-heldout"]["deleted"] and charts["pretrain-loss-heldout"]["metricKey"] == HELDOUT_LOSS
    sections = {section["uuid"]: section["name"] for section in state["compareRunSections"]}
    assert sections[both["metricSectionId"]] == "loss" and {"Model metrics", "System metrics"} <= set(sections.values())


def test_what_opens_a_run_is_a_command_or_a_whole_address_never_a_fragment():
    """Issue 51 item 4: the pipeline printed ``#/experiments/1/runs/<id>?…``, which opens nothing. For a database on
    this machine it is the command that starts the UI on that run (which prints a link that signs in); for a
    tracking server, the run's whole address there."""
    assert open_command("ab12") == "pretrain ui --run ab12" and open_command() == "pretrain ui"
    program, *args = run_opener("sqlite:////home/u/mlflow.db", "7", "ab12").split()  # a database on this machine
    parsed = parser().parse_args(args)  # a command `pretrain` takes as it is
    assert program == "pretrain" and parsed.fn is cmd_ui and parsed.run == "ab12"
    page = "#/experiments/7/runs/ab12?workflowType=machine_learning"
    for uri, address in [  # a tracking server: its page's whole address, without the credentials a URI may hold
        ("https://alice:s3cret@mlflow.example.org/team/", f"https://mlflow.example.org/team/{page}"),
        ("http://10.0.0.5:5000", f"http://10.0.0.5:5000/{page}"),
        ("http://[fd00::5]:5000/", f"http://[fd00::5]:5000/{page}"),
    ]:
        assert run_opener(uri, "7", "ab12") == address, uri
    assert run_opener("databricks://profile", "7", "ab12") == "run ab12 in the MLflow UI of databricks://profile"


def test_train_and_heldout_loss_share_a_section_and_old_records_keep_their_points():
    """Issue 51 item 4: the training loss (``loss``) and the held-out loss (``val/loss``) were charted in two
    places; MLflow 3's UI groups a run's charts by the part of the name before its last ``/``, so they are
    ``loss/train`` and ``loss/heldout`` now. A record written before the held-out key was renamed (``val_loss``,
    replayed from an old run's metrics.jsonl) gives the same metric."""
    assert TRAIN_LOSS.rpartition("/")[0] == HELDOUT_LOSS.rpartition("/")[0] == "loss"
    new = {"step": 5, "loss": 2.0, "heldout_loss": 2.4, "heldout_batches": 4, "lr": 0.1}
    assert step_metrics(new) == [(TRAIN_LOSS, 2.0, 5000, 5), (HELDOUT_LOSS, 2.4, 5000, 5), ("lr", 0.1, 5000, 5)]
    old = {"step": 5, "loss": 2.0, "val_loss": 2.5}
    assert step_metrics(old) == [(TRAIN_LOSS, 2.0, 5000, 5), (HELDOUT_LOSS, 2.5, 5000, 5)]
    both = {"step": 5, "heldout_loss": 2.4, "val_loss": 2.5}  # never written so: the new key's point, one point
    assert step_metrics(both) == [(HELDOUT_LOSS, 2.4, 5000, 5)]


def test_a_run_holds_summaries_apart_its_charts_and_its_reports(tmp_path, mlflow_tracking_uri):
    """The card's training summary logged under the per-step names replaced the last step's point (``mfu``
    0.2246 shown for a run whose steps were at 0.1404); the run had no file but links/store.json."""
    from reports.run_artifacts import run_artifacts

    store = registry_inputs(open_store(str(tmp_path / "store")))
    steps = [{**r, "mfu": 0.1404} for r in records(10)]
    # The training's held-out points (train.val_every): one of a record written before the key was renamed.
    steps[4]["val_loss"], steps[9]["heldout_loss"], steps[9]["heldout_batches"] = 2.5, 2.2, 4
    store.put_bytes(metrics_key("runs/r1"), "".join(json.dumps(r) + "\n" for r in steps).encode())
    # The validation's record; its stored HTML is planted to show that the artifact is rendered from the record.
    outcome = {
        "suite": "shards",
        "expectation": "rows <script>",
        "column": "",
        "success": True,
        "observed": "8",
        "expected": "≥ 1",
    }
    store.put_json(f"{DATASET}/validation/result.json", {"success": True, "outcomes": [outcome], "modified": []})
    store.put_bytes(f"{DATASET}/validation/report.html", b"<html>planted</html>")
    store.commit(f"{DATASET}/validation")
    evaluated = report(2.0)
    summary = {"mfu": 0.2246, "tokens_per_second": 6025.0, "final_train_loss": 0.5}  # the card's training figures
    evaluated = dataclasses.replace(evaluated, checkpoint=dataclasses.replace(evaluated.checkpoint, summary=summary))
    model = register(store, f"gpt-{uuid.uuid4().hex[:6]}", evaluated)
    mlflow, run_id = fresh_run(mlflow_tracking_uri)
    experiment = mlflow.get_experiment(mlflow.get_run(run_id).info.experiment_id).name
    files = run_artifacts(store, model)
    record_execution(mlflow, mlflow_tracking_uri, experiment, "exec-1", run_id, store, model, {}, files=files)
    metrics = mlflow.get_run(run_id).data.metrics
    assert metrics["mfu"] == 0.1404 and [m.value for m in mlflow.get_metric_history(run_id, "mfu")] == [0.1404] * 10
    assert metrics["summary.mfu"] == 0.2246 and metrics["summary.tokens_per_s"] == 6025.0 and metrics["tokens_per_s"] == 1010.0
    assert metrics["summary.final_train_loss"] == 0.5 and "tokens_per_second" not in metrics
    assert metrics["val_loss"] == 2.0 and metrics["bits_per_byte"] == 2.0 / math.log(2)  # evaluation figures: their names
    assert [(m.step, m.value) for m in mlflow.get_metric_history(run_id, HELDOUT_LOSS)] == [(5, 2.5), (10, 2.2)]
    assert mlflow.get_metric_history(run_id, "val/loss") == [] and "heldout_batches" not in metrics
    assert [m.value for m in mlflow.get_metric_history(run_id, "val_loss")] == [2.0]  # the evaluation's alone
    # Issue 51 item 4: a figure logged once was a line chart of one point at the last step; at step 0 MLflow's run
    # page shows its value (a bar), and the Overview's table and the runs table list it as a metric still.
    for name in ("val_loss", "bits_per_byte", "summary.mfu", "summary.tokens_per_s"):
        assert [(m.step, m.timestamp) for m in mlflow.get_metric_history(run_id, name)] == [(FIGURE_STEP, 10_000)], name
    assert FIGURE_STEP == 0
    listed = {a.path for folder in ("", "links", "charts", "validation") for a in mlflow.list_artifacts(run_id, folder or None)}
    assert {"links/store.json", "charts/loss.png", "validation/report.html", "report.html"} <= listed, listed
    chart = Path(mlflow.download_artifacts(run_id, "charts/loss.png", str(tmp_path))).read_bytes()
    assert chart.startswith(b"\x89PNG") and 1000 < len(chart) < 4 * 1024 * 1024
    validation = Path(mlflow.download_artifacts(run_id, "validation/report.html", str(tmp_path))).read_text()
    assert "rows &lt;script&gt;" in validation and "planted" not in validation and "<script" not in validation
    page = Path(mlflow.download_artifacts(run_id, "report.html", str(tmp_path))).read_text()
    assert "Training run r1" in page and "<svg" in page  # the run's curves (tests/test_cli_runs.py checks the page whole)


def test_a_reexecution_of_the_same_model_is_tagged_on_its_run(tmp_path, mlflow_tracking_uri):
    """A fully cached re-execution (the same model returned) made a second run of the same training: it is
    an entry on the first run now, and the run it opened is deleted. A model of the same name and version
    in another store is another model: its own run."""
    name = f"gpt-{uuid.uuid4().hex[:6]}"
    stores = []
    for folder in ("store", "other"):
        store = registry_inputs(open_store(str(tmp_path / folder)))
        store.put_bytes(metrics_key("runs/r1"), "".join(json.dumps(r) + "\n" for r in records(4)).encode())
        stores.append((store, register(store, name, report(2.0))))
    (store, model), (other, twin) = stores
    mlflow, first = fresh_run(mlflow_tracking_uri)
    exp = mlflow.get_run(first).info.experiment_id
    experiment = mlflow.get_experiment(exp).name

    def execute(execution: str, run_id: str, where=store, ref=model) -> str:
        return record_execution(mlflow, mlflow_tracking_uri, experiment, execution, run_id, where, ref, {})

    assert execute("exec-1", first) == first
    second, third = (start_run(mlflow, exp, e, {}, {}) for e in ("exec-2", "exec-3"))
    assert execute("exec-2", second) == first and execute("exec-3", third) == first
    assert execute("exec-2", second) == first  # a replay (track_run retried) counts once
    tags = mlflow.get_run(first).data.tags
    assert tags["pretrain.reexecutions"] == "exec-2,exec-3" and tags["pretrain.reexecution_count"] == "2"
    assert tags["pretrain.execution"] == "exec-1" and mlflow.get_run(first).info.status == "FINISHED"
    assert [mlflow.get_run(r).info.lifecycle_stage for r in (second, third)] == ["deleted", "deleted"]
    assert mlflow.get_run(second).data.tags["pretrain.reexecution_of"] == first
    elsewhere = start_run(mlflow, exp, "exec-4", {}, {})
    assert execute("exec-4", elsewhere, other, twin) == elsewhere  # gpt-…:1 of another store
    assert {r.info.run_id for r in mlflow.search_runs([exp])} == {first, elsewhere}
