"""``pretrain ui``: the MLflow UI on 127.0.0.1 over the resolved tracking database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from common.errors import ConfigError
from common.redact import redact
from tracking.uri import artifact_root, is_remote, prepare_database, resolve_uri, sqlite_path


def ui_command(uri: str, port: int) -> list[str]:
    """The ``mlflow server`` command serving ``uri`` (a database on this machine) on 127.0.0.1:``port``."""
    mlflow = Path(sys.executable).parent / "mlflow"
    command = [str(mlflow) if mlflow.exists() else "mlflow", "server", "--backend-store-uri", uri]
    command += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    root = artifact_root(uri)
    if root:  # where the pipeline's runs keep their link files, so the UI shows them
        command += ["--default-artifact-root", root]
    return command


def serve(port: int = 5000, configured: str = "") -> int:
    """Run the MLflow UI until Ctrl-C or SIGTERM; a remote tracking server is refused (its URL is printed)."""
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
    process = subprocess.Popen(ui_command(uri, port), start_new_session=True)
    print(f"MLflow UI: http://127.0.0.1:{port} over {uri} (Ctrl-C stops it)", flush=True)
    stopping = []

    def stop(*_: object) -> None:
        stopping.append(True)
        os.killpg(process.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    try:
        code = process.wait()
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
