"""Which store a URI names: ``s3://bucket/prefix``, a local path, or the default."""

from __future__ import annotations

import os
from pathlib import Path

from common.private import private_dir
from storage.local import LocalStore
from storage.s3 import S3Store
from storage.store import (
    Store,
    StoreError,
)

DEFAULT_STORE_ENV = "PRETRAIN_STORE"


def user_data_folder() -> Path:
    """The per-user data folder (XDG): the default store and the tracking database live in it."""
    data_home = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(data_home, "pretrain")


def default_store_uri() -> str:
    """``$PRETRAIN_STORE``, else a per-user data directory (XDG)."""
    if os.environ.get(DEFAULT_STORE_ENV):
        return os.environ[DEFAULT_STORE_ENV]
    return str(user_data_folder() / "store")


def open_store(uri: str = "") -> Store:
    """The store at ``uri`` (``s3://bucket/prefix`` or a local path); empty means the default."""
    uri = uri or default_store_uri()
    if uri.startswith("s3://"):
        return S3Store(uri)
    if "://" in uri and not uri.startswith("file://"):
        raise StoreError(f"unsupported store URI {uri!r}: use a local path or s3://bucket/prefix")
    store = LocalStore(uri.removeprefix("file://"))
    if store.root == (user_data_folder() / "store").absolute():
        # The per-user store (runs' leases and logs, configs, models) in a folder only its user can enter;
        # a store folder named elsewhere keeps the umask's modes (a team may share it on purpose).
        private_dir(user_data_folder(), "the per-user store and tracking database")
    return store
