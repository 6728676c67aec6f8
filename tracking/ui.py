"""``pretrain ui``: the MLflow UI on 127.0.0.1 over the resolved tracking database, for the user who started it
only: it prints a link that signs a browser in once (``tracking.ui_login``); scripts use HTTP basic
authentication with a password in a file only that user can read (``tracking.ui_app``)."""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from common.errors import ConfigError
from common.private import create_private, private_dir, write_private
from common.redact import redact
from tracking.client import RUNS_VIEW_ID, missing_experiment_tags, ui_path
from tracking.config import TrackingConfig
from tracking.ui_app import (
    ARTIFACT_ROOT_ENV,
    AUTHORIZATION_FUNCTION,
    COOKIE_ENV,
    SIGN_IN_PATH,
    UI_FOLDER_ENV,
    UI_USER,
)
from tracking.ui_login import TOKEN_TTL_S, forget_tokens, mint_token
from tracking.uri import ARTIFACTS_DIR, artifact_root, default_folder, is_remote, prepare_database, resolve_uri, sqlite_path

UI_DIR = "ui"
"""Beside the tracking database, private (0700): the UI's password, its auth database and config, the sign-in
links not used yet and the signed-in browsers' sessions."""
APP_NAME = "pretrain-ui"
"""The ``mlflow.app`` entry point (pyproject.toml): tracking.ui_app.create_app."""
READY_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class UiAccess:
    """What ``mlflow server`` needs to require the user's password, in the private folder ``folder``."""

    folder: Path

    @property
    def password_file(self) -> Path:
        return self.folder / "password"

    @property
    def config_file(self) -> Path:
        return self.folder / "auth.ini"

    def environment(self, artifact_root: str, port: int) -> dict[str, str]:
        """The server's environment: the auth config, a key for its CSRF tokens, where artifacts may lie, the
        folder of sign-in tokens and sessions, and the session cookie's name (one per port)."""
        return {
            "MLFLOW_AUTH_CONFIG_PATH": str(self.config_file),
            "MLFLOW_FLASK_SERVER_SECRET_KEY": _secret(self.folder / "flask-secret"),
            ARTIFACT_ROOT_ENV: artifact_root,
            UI_FOLDER_ENV: str(self.folder),
            COOKIE_ENV: f"pretrain-ui-{port}",
        }


def _secret(path: Path) -> str:
    """The secret kept in ``path`` (0600), made once: the password stays the one the browser remembered."""
    if not path.exists():
        write_private(path, secrets.token_urlsafe(24).encode())
    return path.read_text().strip()


def ui_access(folder: Path) -> UiAccess:
    """The UI's private folder with its password (made once) and auth config (written at every start)."""
    access = UiAccess(private_dir(folder, "pretrain ui's password and users"))
    database = folder / "auth.db"
    create_private(database)  # MLflow would create it readable by everyone
    config = [
        "[mlflow]",
        "default_permission = NO_PERMISSIONS",  # only the admin below: no other account exists or sees anything
        f"database_uri = sqlite:///{database}",
        f"admin_username = {UI_USER}",
        f"admin_password = {_secret(access.password_file)}",
        f"authorization_function = {AUTHORIZATION_FUNCTION}",  # a signed-in browser's session, else the password
    ]
    write_private(access.config_file, ("\n".join(config) + "\n").encode())
    return access


def ui_command(uri: str, port: int) -> list[str]:
    """The ``mlflow server`` command serving ``uri`` (a database on this machine) on 127.0.0.1:``port``, behind
    a password (``--app-name pretrain-ui``), without the proxied artifact store (runs keep theirs on disk)."""
    mlflow = Path(sys.executable).parent / "mlflow"
    command = [str(mlflow) if mlflow.exists() else "mlflow", "server", "--backend-store-uri", uri]
    command += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--app-name", APP_NAME, "--no-serve-artifacts"]
    root = artifact_root(uri)
    if root:  # where the pipeline's runs keep their files (links, charts, reports), so the UI shows them
        command += ["--default-artifact-root", root]
    return command


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _api(port: int, password: str, path: str, body: dict | None = None) -> dict:
    """A call to the UI server's REST API as its user (``/api/2.0/mlflow/<path>``), as JSON."""
    token = base64.b64encode(f"{UI_USER}:{password}".encode()).decode()
    headers = {"Authorization": f"Basic {token}", "Content-Type": "application/json"}
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/2.0/mlflow/{path}", data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


@dataclass(frozen=True)
class Pages:
    """The UI's pages ``pretrain ui`` names: ``lines`` as printed (full addresses, to open once signed in), and
    ``landing``, the page its sign-in link opens (a path on the server: ``/#/experiments/1/runs?…``)."""

    lines: list[str]
    landing: str = "/"


def ui_pages(port: int, password: str, experiment: str, run_id: str = "") -> Pages:
    """The pages to open: the runs of ``experiment`` in our saved view (an experiment made before gets the tags
    the pipeline sets now: its kind, as MLflow 3 would otherwise open it on its GenAI view, and the view) and
    the run ``run_id``, which the sign-in link opens if there is one, else the runs."""
    base, lines, landing = f"http://127.0.0.1:{port}", [], "/"
    query = urllib.parse.urlencode({"experiment_name": experiment})
    try:
        found = _api(port, password, f"experiments/get-by-name?{query}")["experiment"]
    except urllib.error.HTTPError:  # no such experiment yet: the pipeline makes it
        lines.append(f"  no experiment {experiment!r} yet: `pretrain run` records its runs there")
    else:
        tags = {tag["key"]: tag["value"] for tag in found.get("tags", [])}
        for key, value in missing_experiment_tags(tags).items():
            body = {"experiment_id": found["experiment_id"], "key": key, "value": value}
            _api(port, password, "experiments/set-experiment-tag", body)
        landing = "/" + ui_path(found["experiment_id"], view=RUNS_VIEW_ID)
        lines.append(f"  runs of experiment {experiment!r}: {base}{landing}")
    if run_id:
        try:
            info = _api(port, password, f"runs/get?{urllib.parse.urlencode({'run_id': run_id})}")["run"]["info"]
        except urllib.error.HTTPError:
            lines.append(f"  no run {run_id} in this database")
        else:
            landing = "/" + ui_path(info["experiment_id"], run_id)
            lines.append(f"  run {run_id}: {base}{landing}")
    return Pages(lines, landing)


def _pages(port: int, password: str, experiment: str, run_id: str) -> Pages:
    try:
        return ui_pages(port, password, experiment, run_id)
    except (OSError, ValueError, KeyError) as e:  # the pages are a convenience: the link opens the UI's home
        return Pages([f"  (the runs' page not found: {e})"])


def sign_in_url(port: int, folder: Path, page: str) -> str:
    """The address that signs a browser in and opens ``page``: a token that works once, within ``TOKEN_TTL_S``,
    recorded in the UI's private folder ``folder`` for the server to take (no password: a URL with credentials
    breaks MLflow's run page, and an address is seen by more than its owner)."""
    token = mint_token(folder, page)
    return f"http://127.0.0.1:{port}{SIGN_IN_PATH}?{urllib.parse.urlencode({'token': token})}"


def announcement(port: int, uri: str, access: UiAccess, pages: Pages, log_path: Path) -> str:
    """What ``pretrain ui`` prints once the server answers: the sign-in link first, then the pages."""
    link = sign_in_url(port, access.folder, pages.landing)
    lines = [
        f"MLflow UI: http://127.0.0.1:{port} over {uri} (Ctrl-C stops it)",
        f"  open (signs this browser in; works once, within {TOKEN_TTL_S / 60:g} minutes): {link}",
        *pages.lines,
        f"  scripts and API clients: user {UI_USER!r}, password in {access.password_file} (readable by you only)",
        f"  server log: {log_path}",
    ]
    return "\n".join(lines)


def serve(port: int = 5000, configured: str = "", experiment: str = TrackingConfig.experiment, run_id: str = "") -> int:
    """Run the MLflow UI until Ctrl-C or SIGTERM; a remote tracking server is refused (its URL is printed).
    Only the user who started it can sign in: once the server answers, it prints a link that signs a browser in
    once and opens the run ``run_id``, else ``experiment``'s runs (``announcement``); the password for scripts
    is in a file only they can read."""
    uri = resolve_uri(configured)
    if is_remote(uri):
        raise ConfigError(
            f"the tracking URI is a server ({redact(uri)}, from MLFLOW_TRACKING_URI or tracking.uri): "
            f"open {redact(uri)} in a browser; "
            "pretrain ui serves a database on this machine only"
        )
    db = sqlite_path(uri)
    if db is not None and prepare_database(db):
        print(f"# {db} does not exist yet: the UI starts empty; `pretrain run` records runs there")
    folder = db.parent if db is not None else default_folder()
    access = ui_access(folder / UI_DIR)
    forget_tokens(access.folder)  # an earlier start's links: their server is gone
    root = str(folder / ARTIFACTS_DIR)
    # No job runner: it serves GenAI scorers and trace archival, none of which the pipeline uses, and starts
    # about ten processes that each import MLflow (the UI answered in 88 s on a busy 2-core machine).
    env = {**os.environ, **access.environment(root, port), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log_path = access.folder / "server.log"  # MLflow's own lines, private like the rest (they name paths)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(log_fd, "ab") as log:
        process = subprocess.Popen(ui_command(uri, port), start_new_session=True, env=env, stdout=log, stderr=log)
    stopping = []

    def stop(*_: object) -> None:
        stopping.append(True)
        os.killpg(process.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while process.poll() is None and not _answers(port) and time.monotonic() < deadline:
            time.sleep(0.5)
        if process.poll() is None:  # the URL once it answers, not before
            pages = _pages(port, access.password_file.read_text().strip(), experiment, run_id)
            print(announcement(port, uri, access, pages, log_path), flush=True)
        code = process.wait()
        if not stopping:
            tail = log_path.read_text(errors="replace").splitlines()[-15:]
            print(f"error: the MLflow server exited with status {code}; the end of {log_path}:", *tail, sep="\n", file=sys.stderr)
        return 0 if stopping else code  # stopped by us: a clean exit; else the server's own status
    except KeyboardInterrupt:
        return 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
