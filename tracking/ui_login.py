"""``pretrain ui``'s sign-in without a password in a URL: a link that works once, traded by the server for a
session cookie (``tracking.ui_app``).

The CLI and the server it starts share the UI's private folder (0700, ``tracking.ui.UI_DIR``): the CLI writes
each link's token there (``mint_token``), the server takes it once (``redeem_token``) and records the session it
opens there (``open_session``), which every later request's cookie is checked against (``session_open``).
Nothing crosses a command line, an environment another user can read, or a log. Neither a token nor a session
id is stored: each file is named by the SHA-256 of its secret, so what lies on disk signs nobody in, and
nothing a URL or a cookie carries becomes part of a path. A token is taken by renaming its file, which one
request only can do: of two requests with one token, one wins.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from pathlib import Path

from common.private import private_dir, write_private

TOKENS_DIR = "sign-in"
"""In the UI's private folder: one file per sign-in link not used yet."""
SESSIONS_DIR = "sessions"
"""In the UI's private folder: one file per browser signed in."""
TOKEN_TTL_S = 600.0
"""How long a sign-in link works (once): 10 minutes, for the person who started ``pretrain ui`` to open it."""
SESSION_TTL_S = 24 * 3600.0
"""How long a signed-in browser stays signed in (a session outlives a restart of the server, as the folder does)."""
MAX_SECRET_CHARS = 128
"""Longer than any token or session id made here: a longer value is refused before it is hashed."""


def _file_name(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _read(path: Path) -> dict:
    """The entry in ``path``; {} when it cannot be read (gone, or not what this module writes)."""
    try:
        entry = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return entry if isinstance(entry, dict) else {}


def _live(entry: dict, now: float) -> bool:
    """Whether ``entry`` has not expired at ``now`` (epoch seconds)."""
    expires = entry.get("expires")
    return isinstance(expires, (int, float)) and expires > now


def _prune(folder: Path, now: float) -> None:
    """Remove the expired entries of ``folder`` (and a claimed token left behind by a server that died)."""
    for path in folder.iterdir():
        if not path.name.startswith(".") and not _live(_read(path), now):  # '.' first: being written
            path.unlink(missing_ok=True)


def mint_token(folder: Path, page: str, ttl_s: float = TOKEN_TTL_S, now: float | None = None) -> str:
    """A new sign-in token that works once within ``ttl_s``, leading to ``page`` (a path on the server,
    ``/#/experiments/1/runs``), recorded in the UI's private folder ``folder``."""
    now = time.time() if now is None else now
    tokens = private_dir(folder / TOKENS_DIR, "pretrain ui's sign-in links")
    _prune(tokens, now)
    token = secrets.token_urlsafe(32)
    write_private(tokens / _file_name(token), json.dumps({"expires": now + ttl_s, "page": page}).encode())
    return token


def redeem_token(folder: Path, token: str, now: float | None = None) -> str | None:
    """The page the link with ``token`` leads to, the first time only; None for a token that is unknown, used
    already or expired (a used or expired one is gone afterwards)."""
    now = time.time() if now is None else now
    if not token or len(token) > MAX_SECRET_CHARS:
        return None
    pending = folder / TOKENS_DIR / _file_name(token)
    claimed = pending.with_name(f"{pending.name}.{secrets.token_hex(8)}.claimed")
    try:
        os.rename(pending, claimed)  # atomic: a second request with the token finds nothing to rename
    except OSError:
        return None
    entry = _read(claimed)
    claimed.unlink(missing_ok=True)
    page = entry.get("page")
    if not _live(entry, now) or not isinstance(page, str):
        return None
    # A path on this server only ('//host' would be another one): the CLI writes it, this is a second check.
    return page if page.startswith("/") and not page.startswith("//") else "/"


def open_session(folder: Path, ttl_s: float = SESSION_TTL_S, now: float | None = None) -> str:
    """A new session id for a browser that signed in, valid for ``ttl_s``, recorded in ``folder``."""
    now = time.time() if now is None else now
    sessions = private_dir(folder / SESSIONS_DIR, "pretrain ui's signed-in browsers")
    _prune(sessions, now)
    session = secrets.token_urlsafe(32)
    write_private(sessions / _file_name(session), json.dumps({"expires": now + ttl_s}).encode())
    return session


def session_open(folder: Path, session: str, now: float | None = None) -> bool:
    """Whether ``session`` (a cookie's value) is a session ``open_session`` opened that has not expired."""
    if not session or len(session) > MAX_SECRET_CHARS:
        return False
    now = time.time() if now is None else now
    return _live(_read(folder / SESSIONS_DIR / _file_name(session)), now)


def forget_tokens(folder: Path) -> None:
    """Remove every sign-in link not used yet (at each start of ``pretrain ui``: an earlier start's links are
    for a server that is gone)."""
    tokens = folder / TOKENS_DIR
    if tokens.is_dir() and not tokens.is_symlink():
        for path in tokens.iterdir():
            path.unlink(missing_ok=True)
