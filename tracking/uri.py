"""Which MLflow tracking URI a setting means: the one place it is resolved."""

from __future__ import annotations

import os
from pathlib import Path

from common.private import create_private
from storage import default_store_uri, user_data_folder

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
DB_NAME = "mlflow.db"
ARTIFACTS_DIR = "mlflow-artifacts"
"""Beside a SQLite database: the artifacts of its runs (small files: links, a loss chart, reports; never checkpoints)."""


def default_folder() -> Path:
    """The folder of the default store (``~/.local/share/pretrain`` for ``…/pretrain/store``); when
    ``$PRETRAIN_STORE`` names an S3 store, the per-user data folder that would have held it."""
    store = default_store_uri()
    if "://" in store and not store.startswith("file://"):
        return user_data_folder()
    return Path(store.removeprefix("file://")).expanduser().resolve().parent


def resolve_uri(configured: str = "") -> str:
    """``tracking.uri`` if set, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<default folder>/mlflow.db``."""
    uri = configured.strip() or os.environ.get(TRACKING_URI_ENV, "").strip()
    if uri:
        return uri
    return f"sqlite:///{default_folder() / DB_NAME}"


def is_remote(uri: str) -> bool:
    """Whether ``uri`` is a tracking server reached over HTTP (rather than a database or folder on this machine)."""
    return uri.startswith(("http://", "https://", "databricks"))


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` URI, else None."""
    if not uri.startswith("sqlite:///"):
        return None
    # sqlite:///rel.db is relative to the working folder, sqlite:////abs.db absolute (SQLAlchemy's rule).
    return Path(uri.removeprefix("sqlite:///").partition("?")[0]).resolve()


def prepare_database(db: Path) -> bool:
    """Make the folder (0700 when new) and the file (0600, empty) of a SQLite database before MLflow opens
    it: MLflow would create it readable by everyone (runs, params, paths). True if there was none."""
    db.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    new = not db.exists()
    create_private(db)
    return new


def artifact_root(uri: str) -> str:
    """Where a new experiment keeps artifacts: beside a SQLite database (not MLflow's ``./mlruns`` of
    whatever folder the process runs in); '' = the server's or backend's own choice."""
    db = sqlite_path(uri)
    return (db.parent / ARTIFACTS_DIR).as_uri() if db is not None else ""
