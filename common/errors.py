"""The one base class of errors a user can fix, so that a command catches them all without
importing the libraries (and torch) that raise them."""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

TRACEBACK_LABEL = "(full traceback: "


class UserError(Exception):
    """A problem the user can fix: a setting, an input file or record, a name, a credential.

    The message names what is wrong and what to do; commands print it as one line
    (``error: …``) and exit with status 2, with no traceback.
    """


class ConfigError(UserError, ValueError):
    """A setting, or a combination of settings, that cannot work; the message names the key(s)."""


def user_error_in(error: BaseException) -> UserError | None:
    """The deepest UserError along ``error``'s chain of causes and contexts, or None.

    Flyte re-raises a task's exception wrapped, or as a copy whose message it prefixes
    ("Failed to convert outputs of task …"); the deepest one carries the user's words."""
    found, seen = None, set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, UserError):
            found = current
        current = current.__cause__ or current.__context__
    return found


def log_dir() -> Path:
    """Where full tracebacks go: ``$PRETRAIN_LOG_DIR``, else ``$XDG_STATE_HOME/pretrain/logs``."""
    if os.environ.get("PRETRAIN_LOG_DIR"):
        return Path(os.environ["PRETRAIN_LOG_DIR"])
    state_home = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(state_home) / "pretrain" / "logs"


def write_traceback(error: BaseException, what: str) -> Path | None:
    """``error``'s whole chained traceback in a new log file named after ``what``; None if none can be written."""
    try:
        folder = log_dir()
        folder.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        path = folder / f"{what}-{stamp}-{os.getpid()}.log"
        path.write_text("".join(traceback.format_exception(error)))
        return path
    except OSError:
        return None


def traceback_note(path: Path) -> str:
    """What a message says of where its traceback went."""
    return f"{TRACEBACK_LABEL}{path})"
