"""Credentials inside URIs (``https://alice:TOKEN@host``) kept out of logs, params, cards and messages."""

from __future__ import annotations

import re
from typing import Any

# Up to the authority's last "@", as HTTP clients split it: "https://alice:p@ss@host" signs in with "p@ss".
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s?#]+)@")


def redact(text: str) -> str:
    """``text`` with the user and password of every URI in it replaced by ``***``."""
    return _USERINFO.sub(r"\g<scheme>***@", text)


def redacted(value: Any) -> Any:
    """``value`` (a config tree of dicts, lists and scalars) with every string passed through ``redact``."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redacted(v) for v in value)
    return value
