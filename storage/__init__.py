"""Object storage shared by every stage: local directories and S3-compatible stores."""

from storage.open import default_store_uri, open_store, user_data_folder
from storage.store import (
    COMMIT_MARKER,
    READ_LIMITS,
    AlreadyCommitted,
    ObjectTooLarge,
    PreconditionFailed,
    Store,
    StoreError,
    check_key,
)

__all__ = [
    "COMMIT_MARKER",
    "READ_LIMITS",
    "AlreadyCommitted",
    "ObjectTooLarge",
    "PreconditionFailed",
    "Store",
    "StoreError",
    "check_key",
    "default_store_uri",
    "open_store",
    "user_data_folder",
]
