"""Content hashes of configuration values, used in cache keys and run ids. The hash of code (a
module's import closure and library versions) is ``common.codeversion``."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any


def config_hash(*parts: Any) -> str:
    """Hash of dataclasses and plain values, independent of dict ordering."""

    def plain(obj: Any) -> Any:
        return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj

    text = json.dumps([plain(p) for p in parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
